"""Choosing the next token from the last stage's logits: greedy, or temperature + top-p with a seeded generator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgeinspect.errors import InvalidInput


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InvalidInput(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidInput(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """logits: [vocab] float32. Greedy is argmax, as transformers' generate(do_sample=False)."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always at least the top token).
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(params: SamplingParams) -> torch.Generator | None:
    return None if params.greedy else torch.Generator().manual_seed(params.seed)
