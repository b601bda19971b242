"""The regression gate: a result against a stored baseline. Pure functions.

A rate got worse when this run's value lies above the baseline's 95% Wilson upper bound by more than the
tolerance. With the tens of parts a plant labels, a difference inside the baseline's interval is what chance
alone produces; the tolerance (absolute, e.g. 0.02) is the plant's own allowance on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinspect.services.evaluation.stats import rate

# Uncertain is gated too: a model that answers UNCERTAIN to every part sends the whole line to manual recheck.
GATED = ("escape", "overkill", "uncertain")


@dataclass(frozen=True)
class Regression:
    metric: str
    current_k: int
    current_n: int
    baseline_k: int
    baseline_n: int
    limit: float  # the largest current value that still passes

    def describe(self) -> str:
        cur = rate(self.current_k, self.current_n)
        base = rate(self.baseline_k, self.baseline_n)
        return (
            f"{self.metric} got worse: {self.current_k}/{self.current_n} = {cur.value:.1%} "
            f"(95% CI {cur.low:.1%}-{cur.high:.1%}) vs baseline {self.baseline_k}/{self.baseline_n} = "
            f"{base.value:.1%} (95% CI {base.low:.1%}-{base.high:.1%}); the limit is {self.limit:.1%}"
        )


def check(current: dict, baseline: dict, tolerance: float = 0.0, metrics: tuple[str, ...] = GATED) -> list[Regression]:
    """Regressions of `metrics` from the baseline's `metrics` section to the current one. Intervals are recomputed
    from the counts, so a baseline file is judged by what it counted, not by numbers written beside them."""
    out = []
    for name in metrics:
        cur, base = current["metrics"].get(name), baseline["metrics"].get(name)
        if cur is None or base is None or not cur["n"] or not base["n"]:
            continue  # nothing measured on one side (e.g. a set without good parts has no overkill)
        limit = rate(base["k"], base["n"]).high + tolerance
        if cur["k"] / cur["n"] > limit + 1e-12:
            out.append(Regression(name, cur["k"], cur["n"], base["k"], base["n"], min(limit, 1.0)))
    return out


def differences(current: dict, baseline: dict) -> list[str]:
    """What the two results measured differently (model, KB, prompt, settings, images): context for a verdict."""
    notes = []
    for key, values in current["measured"].items():
        if values != baseline.get("measured", {}).get(key):
            notes.append(f"{key}: baseline {baseline.get('measured', {}).get(key)} -> now {values}")
    for key, value in current["settings"].items():
        old = baseline.get("settings", {}).get(key)
        if value != old and key not in ("gateway", "out"):
            notes.append(f"setting {key}: baseline {old!r} -> now {value!r}")
    if current["dataset"]["images_sha256"] != baseline.get("dataset", {}).get("images_sha256"):
        notes.append("the image set differs from the baseline's (not the same images or labels)")
    return notes
