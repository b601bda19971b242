"""A stage's pending steps and the chunk of each that the next forward pass runs (used by StageBackend)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from edgeinspect.models.stage import StepInput


@dataclass
class Job:
    """One session's step from one request, waiting or partly run (a long prompt runs in chunks)."""

    seq: int
    work: object  # SessionWork
    future: asyncio.Future
    total: int  # positions this step adds
    done: int = 0  # positions already run
    hidden_parts: list[torch.Tensor] = field(default_factory=list)  # [t, D] per chunk (non-last stages)

    @property
    def remaining(self) -> int:
        return self.total - self.done


def step_positions(inputs: StepInput) -> int:
    """How many positions a step adds (0 for a malformed input: the executor's checks then name the problem)."""
    src = inputs.input_ids if inputs.input_ids is not None else inputs.hidden
    return 0 if src is None or src.dim() == 0 else int(src.shape[0])


def chunk_input(inputs: StepInput, start: int, n: int, image_token_id: int) -> StepInput:
    """Positions [start, start + n) of a step, with the visual tokens of exactly the placeholders inside them."""
    if start == 0 and n == step_positions(inputs):
        return inputs
    if inputs.hidden is not None:
        return StepInput(position=inputs.position + start, hidden=inputs.hidden[start : start + n])
    ids = inputs.input_ids
    part = ids[start : start + n]
    visual = None
    if inputs.visual_tokens is not None:
        slots = ids == image_token_id  # [T]
        before, inside = int(slots[:start].sum()), int(slots[start : start + n].sum())
        visual = inputs.visual_tokens[before : before + inside] if inside else None
    return StepInput(position=inputs.position + start, input_ids=part, visual_tokens=visual)
