"""The anomaly gate's own figures from the reports of an eval run, beside the VLM's: image AUROC of the score, escape
and overkill of the gate's decision with Wilson intervals, how many verdicts the gate decided alone, and the ROC
picture. Same keys and metric functions as the offline `edgeinspect anomaly eval` (models/anomaly/evaluate.py).

The gate's decision per report: decided_by GATE passed the frame, GATE_AND_VLM flagged it (policy `gate`). Under
policy `vlm` the report carries the score and the threshold but not the UNCERTAIN band, so a frame counts as flagged
when its score reaches the threshold (the offline eval also flags the band just below it).

Pixel AUROC: each report's stored heatmap PNG carries the vision node's raw scores at the pixel grid
(scoring.SCORES_CHUNK, float16), ranked against the set's `ground_truth/<kind>/<stem>_mask.png` exactly as the
offline eval ranks its float32 heatmaps (evaluate.grid_mask, evaluate.pixel_auroc): the two agree to the float16
rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from edgeinspect.models.anomaly.evaluate import (
    RocCurve,
    auroc,
    draw_roc,
    grid_mask,
    operating_point,
    pixel_auroc,
    read_mask,
    roc_curve,
)
from edgeinspect.models.anomaly.scoring import heatmap_scores
from edgeinspect.services.common.findings import ok_cut
from edgeinspect.services.evaluation.datasets import DEFECT, GOOD, Sample
from edgeinspect.services.evaluation.stats import Rate, rate
from edgeinspect.v1 import inspection_pb2

ROC_FILE = "anomaly_roc.png"
_DECIDERS = ("GATE", "GATE_AND_VLM", "VLM")
TARGET_ESCAPE = 0.05  # the operating point these labelled frames would choose, as `anomaly eval` reports it
PIXEL_NOTE = "no ground-truth masks (<part>/ground_truth/<kind>/<stem>_mask.png) in this set"


def finding_record(report: inspection_pb2.DefectReport) -> dict | None:
    """A report's AnomalyFinding as the result log keeps it; None when the station's policy is `off`."""
    if not report.HasField("anomaly"):
        return None
    a = report.anomaly
    scored = bool(a.bank_id)  # no bank (or the gate unusable): the finding is only a note
    return {
        "score": float(a.score) if scored else None,
        "threshold": float(a.threshold) if scored else None,
        "ok_cut": float(ok_cut(a)) if scored else None,
        "bank_id": a.bank_id,
        "extractor_fingerprint": a.extractor_fingerprint,
        "decided_by": inspection_pb2.DecidedBy.Name(a.decided_by).removeprefix("DECIDED_BY_"),
        "policy": a.policy,
        "regions": len(a.regions),
        "note": a.note,
        "heatmap_stored": a.heatmap_stored,
    }


def gate_flagged(finding: dict) -> bool:
    """Whether the gate did not pass the frame (see the module doc for policy `vlm`)."""
    if finding["decided_by"] in ("GATE", "GATE_AND_VLM"):
        return finding["decided_by"] == "GATE_AND_VLM"
    return finding["score"] >= finding["threshold"]


def figures(records: Iterable[dict]) -> dict | None:
    """The result's `anomaly` section, or None when no evaluated report carries an anomaly finding."""
    done = [r for r in records if not r.get("error") and r.get("anomaly")]
    if not done:
        return None
    scored = [r for r in done if r["anomaly"]["score"] is not None]
    good = [r for r in scored if r["label"] == GOOD]
    bad = [r for r in scored if r["label"] == DEFECT]
    good_scores = np.array([r["anomaly"]["score"] for r in good])  # [n_good]
    bad_scores = np.array([r["anomaly"]["score"] for r in bad])  # [n_defect]
    escape = rate(sum(1 for r in bad if not gate_flagged(r["anomaly"])), len(bad))
    overkill = rate(sum(1 for r in good if gate_flagged(r["anomaly"])), len(good))
    thresholds = sorted({r["anomaly"]["threshold"] for r in scored})
    alone = sum(1 for r in done if r["anomaly"]["decided_by"] == "GATE")
    point = operating_point(good_scores, bad_scores, TARGET_ESCAPE) if scored else {}
    return {
        "image_auroc": _round(auroc(good_scores, bad_scores)) if good and bad else None,
        "pixel_auroc": None,
        "pixel_auroc_note": PIXEL_NOTE,
        "escape": escape.as_dict()["value"],
        "escape_ci95": _ci(escape),
        "escaped": escape.k,
        "overkill": overkill.as_dict()["value"],
        "overkill_ci95": _ci(overkill),
        "flagged_good": overkill.k,
        "threshold": _round(thresholds[0]) if len(thresholds) == 1 else None,  # None: the bank changed mid-run
        "thresholds": [_round(t) for t in thresholds],
        "n_good": len(good),
        "n_defect": len(bad),
        "n_unscored": len(done) - len(scored),
        "decided_by_gate_alone": rate(alone, len(done)).as_dict(),
        "decided_by": {k: sum(1 for r in done if r["anomaly"]["decided_by"] == k) for k in _DECIDERS},
        "policies": sorted({r["anomaly"]["policy"] for r in done}),
        "bank_ids": sorted({r["anomaly"]["bank_id"] for r in scored}),
        "extractor_fingerprints": sorted({r["anomaly"]["extractor_fingerprint"] for r in scored}),
        "notes": sorted({r["anomaly"]["note"] for r in done} - {""}),
        "operating_point": {k: _round(v) if isinstance(v, float) else v for k, v in point.items()},
        "misses": sorted(r["path"] for r in bad if not gate_flagged(r["anomaly"])),
        "false_alarms": sorted(r["path"] for r in good if gate_flagged(r["anomaly"])),
    }


def mask_of(sample: Sample) -> Path | None:
    """A defective MVTec-layout frame's ground-truth mask (<part>/ground_truth/<kind>/<stem>_mask.png), if any."""
    kind_dir = sample.path.parent
    mask = kind_dir.parent.parent / "ground_truth" / kind_dir.name / f"{sample.path.stem}_mask.png"
    return mask if sample.label == DEFECT and mask.is_file() else None


def pixel_figure(
    records: Iterable[dict], samples: dict[str, Sample], heatmap: Callable[[str], bytes | None]
) -> tuple[float | None, str]:
    """(pixel AUROC, note) over the good frames and the defective frames with a mask; `samples` by record key,
    `heatmap(report_id)` the stored heatmap PNG (None where none is kept). The note says what was left out."""
    scored = [r for r in records if not r.get("error") and r.get("anomaly") and r["anomaly"]["score"] is not None]
    masks = {r["key"]: mask_of(samples[r["key"]]) for r in scored if r["key"] in samples}
    if not any(masks.values()):
        return None, PIXEL_NOTE
    pairs, missing = [], 0
    for r in scored:
        if r["label"] != GOOD and masks.get(r["key"]) is None:
            continue  # a defect without a mask: nothing to rank its pixels against (as offline)
        png = heatmap(r["report_id"]) if r["anomaly"].get("heatmap_stored", True) else None
        scores = heatmap_scores(png) if png else None
        if scores is None:
            missing += 1
            continue
        mask = masks.get(r["key"])
        if mask is None:
            truth = np.zeros(scores.shape, bool)
        else:
            full = read_mask(mask, _frame_shape(samples[r["key"]].path), r["path"])
            truth = grid_mask(full)
        pairs.append((scores, truth))
    note = f"{missing} frame(s) without a stored heatmap with scores left out" if missing else ""
    return _round(pixel_auroc(pairs)) if pairs else None, note


def _frame_shape(path: Path) -> tuple[int, int]:
    import cv2

    frame = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    return tuple(frame.shape[:2]) if frame is not None else (0, 0)


def roc_picture(records: Iterable[dict], block: dict, path: Path) -> Path | None:
    """The ROC of the gate's score with its decision marked; None when one side (good or defect) has no frame."""
    if not block["n_good"] or not block["n_defect"]:
        return None
    scored = [r for r in records if not r.get("error") and r.get("anomaly") and r["anomaly"]["score"] is not None]
    good = np.array([r["anomaly"]["score"] for r in scored if r["label"] == GOOD])
    bad = np.array([r["anomaly"]["score"] for r in scored if r["label"] == DEFECT])
    fpr, tpr, _ = roc_curve(good, bad)
    label = f"{', '.join(block['bank_ids']) or 'gate'} (AUROC {block['image_auroc']:.3f})"
    curve = RocCurve(label, fpr, tpr, (block["overkill"], 1 - block["escape"]))
    return draw_roc([curve], path, "anomaly gate ROC through the cluster (dot: the gate's decision)")


def _ci(r: Rate) -> list[float | None]:
    return [r.as_dict()["low"], r.as_dict()["high"]]


def _round(x: float | None) -> float | None:
    return None if x is None or np.isnan(x) else round(float(x), 6)
