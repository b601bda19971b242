"""In-process pipeline over StageExecutors: the reference driver for tests, `inspect --local` and benchmarks.

Each boundary can pass hidden states through a wire codec, exactly as the gRPC pipeline does, so codec effects
are measured without processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.models.grammar import LogitsConstraint
from edgeinspect.models.sampling import SamplingParams, make_generator, sample
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_device_stage, load_stage


@dataclass
class Request:
    """One inspection's model inputs."""

    input_ids: list[int]
    visual_tokens: torch.Tensor | None = None  # [N_img, vision_hidden]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = 32
    constraint: LogitsConstraint | None = None  # grammar state for this request (models/grammar.py)


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] per generated token, when kept
    finished_by_eos: bool = False


def even_split(num_layers: int, stages: int) -> list[LayerRange]:
    """Contiguous, as even as possible (the first stages take the remainder)."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {stages} stages")
    bounds, start = [], 0
    for k in range(stages):
        size = num_layers // stages + (1 if k < num_layers % stages else 0)
        bounds.append(LayerRange(start, start + size, num_layers))
        start += size
    return bounds


def load_local_stages(
    ckpt: Checkpoint, ranges: Sequence[LayerRange], weights: str = "fp32", device: torch.device | None = None
) -> list[StageExecutor]:
    """One executor per range; with a device, each stage loaded onto it in a device format (stage/device.py)."""
    if device is None:
        return [StageExecutor(load_stage(ckpt, r, weights)) for r in ranges]
    return [StageExecutor(load_device_stage(ckpt, r, weights, device), device=device) for r in ranges]


Boundary = Callable[[torch.Tensor], torch.Tensor]


def codec_boundary(codec_name: str | None, zstd: bool = False) -> Boundary:
    """Round-trips hidden states through a wire codec (None: pass through untouched)."""
    if codec_name is None:
        return lambda h: h
    from edgeinspect import codec

    c = codec.Codec(codec_name)
    return lambda h: codec.decode(codec.encode(h, c, zstd), expect_shape=list(h.shape), expect_dtype=None)


class LocalPipeline:
    def __init__(
        self,
        stages: Sequence[StageExecutor],
        boundary: Boundary | None = None,
        eos_id: int | None = None,
        preallocate: bool = False,
    ):
        self.stages = list(stages)
        self.boundary = boundary or (lambda h: h)
        self.eos_id = eos_id
        # open each session with its whole budget of positions, as a served stage does at admission (static caches)
        self.preallocate = preallocate

    def forward(self, batch: list[tuple[str, StepInput]]) -> list[torch.Tensor]:
        """Runs one step of several sessions through every stage; returns last-position logits per session."""
        outs = self.stages[0].step(batch)
        for stage in self.stages[1:]:
            batch = [
                (sid, StepInput(position=inp.position, hidden=self.boundary(out.hidden)))
                for (sid, inp), out in zip(batch, outs, strict=True)
            ]
            outs = stage.step(batch)
        return [o.logits for o in outs]

    def generate(self, requests: dict[str, Request], keep_logits: bool = False) -> dict[str, Generation]:
        """Prefills all sessions in one step, then decodes them together until each ends (EOS or budget)."""
        results = {sid: Generation() for sid in requests}
        gens = {sid: make_generator(r.sampling) for sid, r in requests.items()}
        batch = [
            (sid, StepInput(position=0, input_ids=torch.tensor(r.input_ids), visual_tokens=r.visual_tokens))
            for sid, r in requests.items()
        ]
        lengths = {sid: len(r.input_ids) for sid, r in requests.items()}
        if self.preallocate:
            for stage in self.stages:
                for sid, r in requests.items():
                    stage.open(sid, capacity=len(r.input_ids) + r.max_new_tokens)
        try:
            while batch:
                logits = self.forward(batch)
                next_batch = []
                for (sid, _), lg in zip(batch, logits, strict=True):
                    req, res = requests[sid], results[sid]
                    if keep_logits:
                        res.logits.append(lg.clone())  # unmasked
                    if req.constraint is not None:
                        lg = req.constraint.mask(lg)
                    token = sample(lg, req.sampling, gens[sid])
                    if req.constraint is not None:
                        req.constraint.advance(token)
                    res.tokens.append(token)
                    if token == self.eos_id:
                        res.finished_by_eos = True
                    elif len(res.tokens) < req.max_new_tokens:
                        next_batch.append((sid, StepInput(position=lengths[sid], input_ids=torch.tensor([token]))))
                        lengths[sid] += 1
                batch = next_batch
        finally:
            for stage in self.stages:
                for sid in requests:
                    stage.release(sid)
        return results
