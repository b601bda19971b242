"""Patch-feature whitening fitted on a part's good patches: kNN distances in units of the part's own variation.

Plain L2 over CNN features lets a few high-variance channels decide every distance; on an irregular surface
(vegetation, loose stones) those are the channels that vary most between good patches, and a stain or a crack moves
channels that barely vary and get drowned. A regularised PCA whitening (a Mahalanobis distance with shrinkage)
fitted on the teach patches weighs each direction by how much good parts vary along it. Measured on
bench/anomaly_photos.py (15 teach frames, 448 px, 4096-patch greedy bank): grass image AUROC 0.82 -> 0.93, gravel
0.94 -> 0.94, brick 0.99 -> 0.99, escape at the held-out cut 15/45 -> 6/45. See SHRINKAGE for the regularisation.
"""

from __future__ import annotations

import numpy as np

# The added variance, as a fraction of the largest eigenvalue: directions whose variance is far below it would
# otherwise be blown up from noise (sensor noise, JPEG) into distances. Chosen on bench/anomaly_photos.py (see the
# module docstring and bench/README.md).
SHRINKAGE = 0.01
FIT_PATCHES = 50_000  # a seeded sample of the teach patches: the covariance of more moves it by < 1%


def fit_whitening(patches: np.ndarray, shrinkage: float = SHRINKAGE, seed: int = 0) -> np.ndarray:
    """Good patches [M, C] -> [C + 1, C] float32: row 0 the mean, rows 1.. the whitening matrix W (x - mean) @ W."""
    m, c = patches.shape
    if m > FIT_PATCHES:
        patches = patches[np.sort(np.random.default_rng(seed).choice(m, FIT_PATCHES, replace=False))]
    x = patches.astype(np.float64)
    mean = x.mean(0)  # [C]
    cov = np.cov(x - mean, rowvar=False).reshape(c, c)  # [C, C]
    values, vectors = np.linalg.eigh(cov)  # ascending
    values = np.maximum(values, 0.0)
    w = vectors / np.sqrt(values + shrinkage * max(float(values[-1]), 1e-12))  # [C, C]
    return np.vstack([mean[None], w]).astype(np.float32)


def apply_whitening(features: np.ndarray, whitening: np.ndarray | None) -> np.ndarray:
    """[..., C] -> [..., C] float32 whitened (unchanged where the bank has no whitening)."""
    if whitening is None:
        return features
    mean, w = whitening[0], whitening[1:]
    shape = features.shape
    out = (features.reshape(-1, shape[-1]) - mean) @ w  # [M, C]
    return np.ascontiguousarray(out.reshape(shape), dtype=np.float32)
