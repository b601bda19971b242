"""The DecoderStage wire piece the gateway builds to send a stage's output on to the next stage."""

from __future__ import annotations

from edgeinspect.v1 import stage_pb2, tensor_pb2


def next_stage_step(step: stage_pb2.SessionStep, hidden: tensor_pb2.TensorFrame) -> stage_pb2.SessionStep:
    """The same step one stage further: the hidden states replace the inputs; sampling, prefix, flags, the
    micro-batch group and the KV reservation travel."""
    nxt = stage_pb2.SessionStep(
        session_id=step.session_id,
        position=step.position,
        return_logits=step.return_logits,
        prefill_chunk=step.prefill_chunk,
        micro_batch=step.micro_batch,
        max_positions=step.max_positions,
    )
    for name in ("sampling", "prefix"):
        if step.HasField(name):
            getattr(nxt, name).CopyFrom(getattr(step, name))
    nxt.hidden.CopyFrom(hidden)
    nxt.trace_context.update(step.trace_context)  # a traced step stays traced from stage to stage
    return nxt
