"""The regression gate: a result against a stored baseline. Pure functions.

A rate got worse when this run's value lies above the baseline's 95% Wilson upper bound by more than the
tolerance. With the tens of parts a plant labels, a difference inside the baseline's interval is what chance
alone produces; the tolerance (absolute, e.g. 0.02) is the plant's own allowance on top. When both results
measured the anomaly gate (their `anomaly` sections), its own escape and overkill are gated the same way: a candidate
bank or threshold that lets more defects through fails even where the VLM's figures hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinspect.services.evaluation.stats import rate, wilson_interval

# Uncertain is gated too: a model that answers UNCERTAIN to every part sends the whole line to manual recheck.
GATED = ("escape", "overkill", "uncertain")
# The anomaly gate's own decision: metric name -> (count key, denominator key) in a result's `anomaly` section.
GATED_ANOMALY = {
    "anomaly gate escape": ("escaped", "n_defect"),
    "anomaly gate overkill": ("flagged_good", "n_good"),
}


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
    """Regressions of `metrics` (and of the anomaly gate's escape and overkill, when both results have them) from
    the baseline to the current result. Intervals are recomputed from the counts, so a baseline file is judged by
    what it counted, not by numbers written beside them."""
    cur_counts, base_counts = _counts(current, metrics), _counts(baseline, metrics)
    out = []
    for name, (k, n) in cur_counts.items():
        if name not in base_counts or not n or not base_counts[name][1]:
            continue  # nothing measured on one side (e.g. a set without good parts has no overkill)
        base_k, base_n = base_counts[name]
        limit = wilson_interval(base_k, base_n)[1] + tolerance  # the baseline's 95% upper bound (base_n > 0)
        if k / n > limit + 1e-12:
            out.append(Regression(name, k, n, base_k, base_n, min(limit, 1.0)))
    return out


def _counts(result: dict, metrics: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """metric name -> (k, n) for every gated figure the result measured."""
    out = {name: (m["k"], m["n"]) for name in metrics if (m := result["metrics"].get(name)) is not None}
    gate = result.get("anomaly") or {}
    for name, (k, n) in GATED_ANOMALY.items():
        if k in gate and n in gate:
            out[name] = (gate[k], gate[n])
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
    notes += _anomaly_differences(current.get("anomaly"), baseline.get("anomaly"))
    if current["dataset"]["images_sha256"] != baseline.get("dataset", {}).get("images_sha256"):
        notes.append("the image set differs from the baseline's (not the same images or labels)")
    return notes


def _anomaly_differences(current: dict | None, baseline: dict | None) -> list[str]:
    if current is None and baseline is None:
        return []
    if current is None:
        return ["the baseline measured the anomaly gate; this run's reports carry no anomaly finding (not gated)"]
    if baseline is None:
        return ["this run measured the anomaly gate; the baseline did not (its figures are not gated)"]
    return [
        f"anomaly {key}: baseline {baseline.get(key)} -> now {current[key]}"
        for key in ("bank_ids", "extractor_fingerprints", "thresholds", "policies")
        if current[key] != baseline.get(key)
    ]
