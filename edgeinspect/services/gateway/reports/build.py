"""A VLM run -> its DefectReport (the gate's own reports are built in services/gateway/gate.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from edgeinspect import codec
from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.gateway.decode.session import InferenceSession
from edgeinspect.services.gateway.prompt import Prompt, prompt_digest
from edgeinspect.services.gateway.reports.report_text import parse_report_text
from edgeinspect.services.gateway.reports.schema import parse_structured
from edgeinspect.v1 import inspection_pb2, stage_pb2


@dataclass(frozen=True)
class ModelFacts:
    """What a report records of the model that wrote it: the checkpoint, the wire codec and the plan in force."""

    checkpoint: str
    checkpoint_fingerprint: str
    tokenizer_fingerprint: str
    codec: str
    plan: str

    @classmethod
    def of(cls, ckpt: Checkpoint, wire_codec: codec.Codec, plan: str) -> ModelFacts:
        return cls(str(ckpt.path), ckpt.fingerprint, ckpt.tokenizer_fingerprint, wire_codec.value, plan)


def vlm_report(
    model: ModelFacts,
    req: inspection_pb2.InspectRequest,
    report_id: str,
    session: InferenceSession,
    prompt: Prompt,
    raw: str,
    index_version: str,
    timings: list[stage_pb2.StageTiming],
    image_sha: str,
) -> inspection_pb2.DefectReport:
    """The DefectReport of a VLM run: the generated text `raw` parsed (structured or free text), its references, the
    model and plan, timings and failovers."""
    journal = session.journal
    truncated = session.truncated and raw.strip() != ""
    parsed = parse_structured(raw, truncated) if prompt.grammar else parse_report_text(raw, truncated=truncated)
    now = Timestamp()
    now.GetCurrentTime()
    report = inspection_pb2.DefectReport(
        report_id=report_id,
        request_id=request_id_var.get() or "",
        idempotency_key=req.idempotency_key,
        station=req.station,
        part=req.part,
        camera_id=req.camera_id,
        created_time=now,
        verdict=parsed.verdict,
        description=parsed.description,
        verdict_reason=parsed.verdict_reason,
        raw_text=raw,
        generated_token_ids=journal.generated,
        image_sha256=image_sha or hashlib.sha256(req.image).hexdigest(),
        prompt_tokens=len(journal.prompt_ids),
        timings=timings,
        defects=[inspection_pb2.Defect(**d) for d in parsed.defects],
        references=[
            inspection_pb2.Reference(
                doc_id=c.doc_id,
                section=c.section,
                score=c.score,
                index_version=index_version,
                path=c.path,
                page=c.page,
                text=c.text,
            )
            for c in prompt.chunks
        ],
        model=inspection_pb2.ModelInfo(
            checkpoint=model.checkpoint,
            checkpoint_fingerprint=model.checkpoint_fingerprint,
            tokenizer_fingerprint=model.tokenizer_fingerprint,
            codec=model.codec,
            partition=session.route_names,
            served=session.served,
            plan=model.plan,
            prompt_sha256=prompt_digest(journal.prompt_ids, prompt.grammar.grammar_id if prompt.grammar else ""),
        ),
        failovers=session.failovers,
        degraded=prompt.degraded,
        decode_steps=max(len(journal.steps) - 1, 0),
        jump_forward_tokens=journal.forced,
    )
    if req.verification:
        report.prompt_token_ids.extend(journal.prompt_ids)
    if req.HasField("capture_time"):
        report.capture_time.CopyFrom(req.capture_time)
    return report
