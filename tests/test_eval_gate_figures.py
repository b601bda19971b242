"""The anomaly gate's figures in `edgeinspect eval` (pure functions over result records) and the baseline gate on
them: the gate's decision per policy, AUROC and rates by hand, the ROC picture, and regressions named apart from
the VLM's."""

from __future__ import annotations

import pytest

from edgeinspect.models.anomaly.evaluate import auroc
from edgeinspect.services.evaluation import gate
from edgeinspect.services.evaluation.anomaly import figures, gate_flagged, roc_picture
from edgeinspect.services.evaluation.report import anomaly_lines
from edgeinspect.services.evaluation.stats import wilson_interval

PNG = b"\x89PNG\r\n\x1a\n"


def rec(path: str, label: str, score: float | None, decided_by: str, policy: str = "gate") -> dict:
    finding = {"score": score, "threshold": None if score is None else 1.0, "bank_id": "" if score is None else
               "board@v1:ab", "extractor_fingerprint": "fp", "decided_by": decided_by, "policy": policy,
               "regions": 0, "note": "" if score is not None else "no anomaly bank for part board yet"}  # fmt: skip
    return {"path": path, "label": label, "verdict": "OK", "anomaly": finding}


RECORDS = [
    rec("g0", "good", 0.2, "GATE"),
    rec("g1", "good", 0.5, "GATE"),
    rec("g2", "good", 1.3, "GATE_AND_VLM"),  # a false alarm
    rec("d0", "defect", 2.0, "GATE_AND_VLM"),
    rec("d1", "defect", 0.4, "GATE"),  # an escape, scored below a good part: AUROC < 1
    rec("d2", "defect", 3.0, "GATE_AND_VLM"),
    rec("d3", "defect", 1.1, "GATE_AND_VLM"),
    {"path": "e0", "label": "good", "error": "INVALID_ARGUMENT: not an image"},
]


def test_figures_count_the_gates_decision_and_rank_its_score():
    a = figures(RECORDS)
    assert a["image_auroc"] == pytest.approx(auroc([0.2, 0.5, 1.3], [2.0, 0.4, 3.0, 1.1]), abs=1e-6)
    assert a["image_auroc"] == pytest.approx(9 / 12, abs=1e-6)  # of 12 pairs, d1 ranks below g1 and g2, d3 below g2
    assert (a["escaped"], a["n_defect"], a["flagged_good"], a["n_good"]) == (1, 4, 1, 3)
    assert a["escape"] == 0.25 and a["escape_ci95"] == pytest.approx(wilson_interval(1, 4), abs=1e-6)
    assert a["overkill"] == pytest.approx(1 / 3, abs=1e-6)
    assert a["decided_by_gate_alone"]["k"] == 3 and a["decided_by_gate_alone"]["n"] == 7
    assert a["threshold"] == 1.0 and a["bank_ids"] == ["board@v1:ab"] and a["pixel_auroc"] is None
    assert "no ground-truth masks" in a["pixel_auroc_note"]
    assert a["misses"] == ["d1"] and a["false_alarms"] == ["g2"]
    assert a["operating_point"]["threshold"] == 0.4  # the highest threshold that lets at most 5% of 4 defects pass


def test_no_finding_no_section_and_unscored_frames_are_counted_not_scored():
    assert figures([{**r, "anomaly": None} for r in RECORDS if "anomaly" in r]) is None
    a = figures([*RECORDS, rec("g9", "good", None, "VLM")])
    assert a["n_unscored"] == 1 and a["n_good"] == 3 and a["notes"] == ["no anomaly bank for part board yet"]


def test_policy_vlm_counts_a_score_at_the_threshold_as_flagged():
    assert gate_flagged(rec("x", "defect", 1.0, "VLM", "vlm")["anomaly"])
    assert not gate_flagged(rec("x", "defect", 0.99, "VLM", "vlm")["anomaly"])
    assert not gate_flagged(rec("x", "defect", 5.0, "GATE")["anomaly"])  # policy gate: decided_by says it


def test_roc_picture_and_report_section(tmp_path):
    a = figures(RECORDS)
    path = roc_picture(RECORDS, a, tmp_path / "roc.png")
    assert path.read_bytes().startswith(PNG)
    text = "\n".join(anomaly_lines({**a, "roc_png": path.name}))
    assert "| escape (defects the gate passed) | 25.0% (1/4;" in text and "![anomaly gate ROC](roc.png)" in text
    assert roc_picture(RECORDS[:3], figures(RECORDS[:3]), tmp_path / "none.png") is None  # no defects: no curve


def result(escape, overkill, gate_escape=None):
    out = {"metrics": {"escape": {"k": escape[0], "n": escape[1]}, "overkill": {"k": overkill[0], "n": overkill[1]}}}
    if gate_escape is not None:
        out["anomaly"] = {"escaped": gate_escape[0], "n_defect": gate_escape[1], "flagged_good": 0, "n_good": 20}
    return out


def test_baseline_gate_fails_on_the_anomaly_gates_escape_alone():
    base = result((1, 20), (2, 20), gate_escape=(0, 20))  # gate escape 0% (95% CI up to 16.1%)
    assert gate.check(result((1, 20), (2, 20), gate_escape=(3, 20)), base) == []  # 15%: inside the interval
    failed = gate.check(result((1, 20), (2, 20), gate_escape=(5, 20)), base)
    assert [r.metric for r in failed] == ["anomaly gate escape"]
    assert failed[0].describe().startswith("anomaly gate escape got worse: 5/20 = 25.0%")
    assert "baseline 0/20 = 0.0%" in failed[0].describe()
    # Only one side measured the gate: nothing to compare, and the difference is said.
    assert gate.check(result((1, 20), (2, 20), gate_escape=(5, 20)), result((1, 20), (2, 20))) == []
    notes = gate._anomaly_differences(None, base["anomaly"])
    assert notes and "carry no anomaly finding" in notes[0]
