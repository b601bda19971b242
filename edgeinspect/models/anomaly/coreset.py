"""PatchCore's greedy k-center coreset: the few good patches that cover all the others."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import torch

# Distances are measured in a random projection to this many dimensions (PatchCore's Johnson-Lindenstrauss
# trick): the greedy loop reads the whole projected set once per pick, so its width is the loop's cost.
PROJECTION_DIMS = 128


def coreset_size(n: int, ratio: float) -> int:
    """How many of n patches a coreset of `ratio` keeps (at least 1, at most n)."""
    return max(1, min(n, math.ceil(n * ratio)))


def greedy_coreset(features: np.ndarray, ratio: float, seed: int = 0) -> np.ndarray:
    """Indices of a greedy k-center subset of features [M, C]: each pick is the patch farthest from those already
    picked. Deterministic for a given seed (the projection and the first pick)."""
    if features.ndim != 2 or len(features) == 0:
        raise ValueError(f"greedy_coreset needs a non-empty [M, C] array, got shape {features.shape}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"coreset ratio must be in (0, 1], got {ratio}")
    m, c = features.shape
    k = coreset_size(m, ratio)
    if k == m:
        return np.arange(m)
    gen = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))  # [M, C]
    if c > PROJECTION_DIMS:
        proj = torch.randn(c, PROJECTION_DIMS, generator=gen) / math.sqrt(PROJECTION_DIMS)  # [C, D]
        x = x @ proj  # [M, D]
    norms = (x * x).sum(1)  # [M]
    picked = np.empty(k, np.int64)
    picked[0] = int(torch.randint(m, (1,), generator=gen))
    with _one_thread():
        # |x - p|^2 = |x|^2 - 2 x.p + |p|^2: one matrix-vector product per pick, no [M, D] temporary (5x).
        nearest = torch.addmv(norms + norms[picked[0]], x, x[picked[0]], alpha=-2)  # [M] to the closest pick
        for i in range(1, k):
            # argmax picks the lowest index among ties: same input, same coreset.
            p = picked[i] = int(torch.argmax(nearest))
            torch.minimum(nearest, torch.addmv(norms + norms[p], x, x[p], alpha=-2), out=nearest)
    return picked


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Each pick is ~1 MFLOP: handing that to a second thread costs more than it saves, and on a busy 2-core box
    far more (784 picks over 7840 patches: 0.6 s on one thread, 17 s on two, measured 2026-12 under load).
    torch's thread count is process-wide: restored on the way out."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
