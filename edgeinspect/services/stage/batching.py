"""A stage's pending steps and the chunk of each that the next forward pass runs (used by StageBackend)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # backend.py imports this module
    from edgeinspect.services.stage.backend import SessionWork


@dataclass
class Job:
    """One session's step from one request, waiting or partly run (a long prompt runs in chunks)."""

    seq: int
    work: SessionWork
    future: asyncio.Future
    total: int  # positions this step adds
    done: int = 0  # positions already run
    hidden_parts: list[torch.Tensor] = field(default_factory=list)  # [t, D] per chunk (non-last stages)

    @property
    def remaining(self) -> int:
        return self.total - self.done
