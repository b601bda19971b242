"""Per-image results -> the evaluation result: escape, overkill and UNCERTAIN rates, the confusion matrix,
per-class recall and precision, latency. Pure functions over plain dicts (the JSONL records of runner.py).

Definitions (a plant's, not a classifier benchmark's): UNCERTAIN goes to a person, so it is neither an escape nor
a rejection. escape = defective parts answered OK / defective parts; overkill = good parts answered DEFECT / good
parts; uncertain = UNCERTAIN / all parts.
"""

from __future__ import annotations

from collections.abc import Iterable

from edgeinspect.services.evaluation.datasets import DEFECT, GOOD
from edgeinspect.services.evaluation.stats import latency_summary, rate

VERDICTS = ("OK", "DEFECT", "UNCERTAIN")
RATE_NAMES = ("escape", "overkill", "uncertain")


def truth_row(record: dict) -> str:
    """The confusion-matrix row of a record: `good`, or its (first) true defect class."""
    if record["label"] == GOOD:
        return GOOD
    return record["classes"][0] if record["classes"] else DEFECT


def score(records: Iterable[dict]) -> dict:
    """The result's `metrics` section; records that failed (an `error` field) are counted, not scored."""
    records = list(records)
    done = [r for r in records if not r.get("error")]
    good = [r for r in done if r["label"] == GOOD]
    defect = [r for r in done if r["label"] == DEFECT]
    rows = sorted({truth_row(r) for r in done} - {GOOD})
    rows = [GOOD, *rows] if good else rows
    matrix = [[sum(1 for r in done if truth_row(r) == row and r["verdict"] == v) for v in VERDICTS] for row in rows]
    latencies = [r["latency_ms"] for r in done if r.get("latency_ms") is not None]
    return {
        "counts": {
            "images": len(done),
            "good": len(good),
            "defect": len(defect),
            "errors": len(records) - len(done),
            "by_verdict": {v: sum(1 for r in done if r["verdict"] == v) for v in VERDICTS},
        },
        "escape": rate(sum(1 for r in defect if r["verdict"] == "OK"), len(defect)).as_dict(),
        "overkill": rate(sum(1 for r in good if r["verdict"] == "DEFECT"), len(good)).as_dict(),
        "uncertain": rate(sum(1 for r in done if r["verdict"] == "UNCERTAIN"), len(done)).as_dict(),
        "confusion": {"rows": rows, "columns": list(VERDICTS), "counts": matrix},
        "per_class": per_class(done),
        "latency_ms": latency_summary(latencies),
        **explanation_figures(done),
    }


def explanation_figures(done: list[dict]) -> dict:
    """Where reports were decided at takt (the gate's verdict to the line, the VLM's in its explanation): the VLM's
    own escape and overkill over those reports, beside the decision's figures above ({} where none were)."""
    explained = [r for r in done if r.get("vlm_verdict")]
    if not explained:
        return {}
    good = [r for r in explained if r["label"] == GOOD]
    defect = [r for r in explained if r["label"] == DEFECT]
    return {
        "explained_after_decision": {
            "reports": len(explained),
            "vlm_escape": rate(sum(1 for r in defect if r["vlm_verdict"] == "OK"), len(defect)).as_dict(),
            "vlm_overkill": rate(sum(1 for r in good if r["vlm_verdict"] == "DEFECT"), len(good)).as_dict(),
        }
    }


def per_class(done: list[dict]) -> dict:
    """Recall and precision per defect class (a report names it among its defects) and for `good` (answered OK)."""
    truth = [set(r["classes"]) for r in done]
    named = [set(r["predicted_classes"]) for r in done]
    out = {}
    for cls in sorted(set().union(*truth, *named)) if done else []:
        tp = sum(1 for t, p in zip(truth, named, strict=True) if cls in t and cls in p)
        support = sum(1 for t in truth if cls in t)
        predicted = sum(1 for p in named if cls in p)
        out[cls] = {
            "support": support,
            "recall": rate(tp, support).as_dict(),
            "precision": rate(tp, predicted).as_dict(),
        }
    good = [r for r in done if r["label"] == GOOD]
    answered_ok = [r for r in done if r["verdict"] == "OK"]
    if good or answered_ok:
        tp = sum(1 for r in good if r["verdict"] == "OK")
        out[GOOD] = {
            "support": len(good),
            "recall": rate(tp, len(good)).as_dict(),
            "precision": rate(tp, len(answered_ok)).as_dict(),
        }
    return out


def misses(done: Iterable[dict]) -> list[dict]:
    """The records that matter most, worst first: escapes (a defect shipped), then overkill, then UNCERTAIN."""
    order = {"escape": 0, "overkill": 1, "uncertain": 2}
    out = []
    for r in done:
        if r.get("error"):
            continue
        kind = None
        if r["label"] == DEFECT and r["verdict"] == "OK":
            kind = "escape"
        elif r["label"] == GOOD and r["verdict"] == "DEFECT":
            kind = "overkill"
        elif r["verdict"] == "UNCERTAIN":
            kind = "uncertain"
        if kind:
            out.append({**r, "miss": kind})
    return sorted(out, key=lambda r: (order[r["miss"]], r["path"]))


def measured(records: Iterable[dict]) -> dict:
    """What was measured, as the reports say: checkpoint and tokenizer fingerprints, KB index versions, prompt
    hashes, codecs and partitions (sorted sets: a run across a rollout shows both versions)."""
    done = [r for r in records if not r.get("error")]

    def values(field: str) -> list:
        return sorted({v for r in done for v in _as_list(r.get("model", {}).get(field)) if v})

    return {
        "checkpoint_fingerprints": values("checkpoint_fingerprint"),
        "tokenizer_fingerprints": values("tokenizer_fingerprint"),
        "codecs": values("codec"),
        "partitions": sorted({" ".join(r.get("model", {}).get("partition", [])) for r in done} - {""}),
        "index_versions": sorted({v for r in done for v in r.get("index_versions", []) if v}),
        "prompt_hashes": values("prompt_sha256"),
    }


def _as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]
