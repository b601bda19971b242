"""What one step of a stage takes and gives per session, and a session's state (its KV cache)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edgeinspect.models.kv import KVBuffer


@dataclass
class StepInput:
    """One session's inputs for one step. Stage 0 takes token ids (+ visual tokens at prefill); others hidden."""

    position: int
    input_ids: torch.Tensor | None = None  # [T] int64
    hidden: torch.Tensor | None = None  # [T, hidden]
    visual_tokens: torch.Tensor | None = None  # [N_img, vision_hidden], before the aligner
    logits: bool = True  # last stage: compute the last position's logits (a prompt chunk with more to come: no)


def step_positions(inputs: StepInput) -> int:
    """How many positions a step adds (0 for a malformed input: the executor's checks then name the problem)."""
    src = inputs.input_ids if inputs.input_ids is not None else inputs.hidden
    return 0 if src is None or src.dim() == 0 else int(src.shape[0])


def chunk_input(inputs: StepInput, start: int, n: int, image_token_id: int) -> StepInput:
    """Positions [start, start + n) of a step, with the visual tokens of exactly the placeholders inside them.

    Only the chunk that ends the step keeps the step's `logits` wish: earlier chunks are never sampled from.
    """
    if start == 0 and n == step_positions(inputs):
        return inputs
    logits = inputs.logits and start + n >= step_positions(inputs)
    if inputs.hidden is not None:
        return StepInput(position=inputs.position + start, hidden=inputs.hidden[start : start + n], logits=logits)
    ids = inputs.input_ids
    part = ids[start : start + n]
    visual = None
    if inputs.visual_tokens is not None:
        slots = ids == image_token_id  # [T]
        before, inside = int(slots[:start].sum()), int(slots[start : start + n].sum())
        visual = inputs.visual_tokens[before : before + inside] if inside else None
    return StepInput(position=inputs.position + start, input_ids=part, visual_tokens=visual, logits=logits)


@dataclass
class StepOutput:
    hidden: torch.Tensor | None = None  # [T, hidden] (non-last stages)
    logits: torch.Tensor | None = None  # [vocab] at the last position (last stage), float32
    length: int = 0  # session length after the step


@dataclass
class Session:
    kv: KVBuffer
    last_used: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.kv.length

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


def ids_tensor(values) -> torch.Tensor:
    """Token ids from the wire as the 1-D int64 tensor a first stage takes."""
    return torch.tensor(list(values), dtype=torch.long)
