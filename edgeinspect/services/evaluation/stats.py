"""Counts -> rates with 95% intervals. Pure functions: a plant's labelled sets are small (tens to hundreds of
parts), so every rate travels with its count and an interval that stays honest at 0/n and n/n."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Rate:
    """k of n, as a fraction with its Wilson score interval (all None when n == 0: nothing was measured)."""

    k: int
    n: int
    value: float | None
    low: float | None
    high: float | None

    def as_dict(self) -> dict:
        return {
            "k": self.k,
            "n": self.n,
            "value": _round(self.value),
            "low": _round(self.low),
            "high": _round(self.high),
        }


def _round(x: float | None) -> float | None:
    # Rounded so the JSON is stable across platforms' last-bit float differences.
    return None if x is None else round(x, 6)


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (Wilson 1927). Unlike the normal (Wald) interval it never
    leaves [0, 1] and does not collapse to a point at k = 0 or k = n, which is the common case for escapes."""
    if n <= 0:
        raise ValueError("wilson_interval needs n > 0")
    if not 0 <= k <= n:
        raise ValueError(f"k must lie in [0, n]; got k={k}, n={n}")
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # At k = 0 (k = n) the bound is exactly 0 (1); clamp the float rounding that lands a hair off.
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high


def rate(k: int, n: int, z: float = Z95) -> Rate:
    if n == 0:
        return Rate(k, 0, None, None, None)
    low, high = wilson_interval(k, n, z)
    return Rate(k, n, k / n, low, high)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def quantile_interval(values: Sequence[float], q: float, z: float = Z95) -> tuple[float, float]:
    """Distribution-free ~95% interval for the q-quantile: the order statistics at ranks n*q -/+ z*sqrt(n*q*(1-q))
    (the binomial count of values below the true quantile). With few values it widens to the sample's extremes."""
    if not values:
        raise ValueError("quantile_interval of no values")
    xs = sorted(values)
    n = len(xs)
    spread = z * math.sqrt(n * q * (1 - q))
    # 1-based ranks j = floor(nq - spread), k = ceil(nq + spread), clamped to the sample; -1 for the list index.
    lo_rank = min(n, max(1, math.floor(n * q - spread))) - 1
    hi_rank = min(n, max(1, math.ceil(n * q + spread))) - 1
    return xs[lo_rank], xs[hi_rank]


def latency_summary(values_ms: Sequence[float]) -> dict:
    """p50 and p99 with their count and order-statistic intervals, in milliseconds."""
    out: dict = {"n": len(values_ms)}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        if values_ms:
            low, high = quantile_interval(values_ms, q)
            out[name] = {"value": round(percentile(values_ms, q), 3), "low": round(low, 3), "high": round(high, 3)}
        else:
            out[name] = {"value": None, "low": None, "high": None}
    return out
