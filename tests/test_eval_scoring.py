"""Evaluation arithmetic without processes: Wilson intervals on published cases, scoring, the gate, datasets."""

from __future__ import annotations

import pytest

from edgeinspect.errors import InvalidInput
from edgeinspect.services.evaluation import gate
from edgeinspect.services.evaluation.datasets import load_dataset, normalise_class, parse_class_map
from edgeinspect.services.evaluation.scoring import misses, score
from edgeinspect.services.evaluation.stats import latency_summary, percentile, quantile_interval, rate, wilson_interval


@pytest.mark.parametrize(
    "k,n,low,high",
    [
        (0, 10, 0.0, 0.2775),  # z^2 / (n + z^2): the upper bound when nothing was seen
        (1, 10, 0.0179, 0.4042),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        (81, 263, 0.2553, 0.3662),
    ],
)
def test_wilson_interval_matches_published_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_interval_refuses_impossible_counts():
    with pytest.raises(ValueError):
        wilson_interval(0, 0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    assert rate(0, 0).value is None and rate(0, 0).as_dict()["n"] == 0


def test_percentiles_and_their_interval():
    xs = [float(v) for v in range(1, 101)]
    assert percentile(xs, 0.5) == pytest.approx(50.5)
    assert percentile([3.0], 0.99) == 3.0
    lo, hi = quantile_interval(xs, 0.5)
    assert (lo, hi) == (40.0, 60.0)  # order statistics 40 and 60 of 100
    few = [float(v) for v in range(1, 11)]
    lo, hi = quantile_interval(few, 0.99)
    assert lo <= percentile(few, 0.99) <= hi == 10.0
    summary = latency_summary([5.0, 1.0, 3.0])
    assert summary["n"] == 3 and summary["p50"]["value"] == 3.0 and summary["p99"]["high"] == 5.0


def rec(path, label, classes, verdict, predicted=(), latency=10.0):
    return {
        "key": path,
        "path": path,
        "label": label,
        "classes": list(classes),
        "verdict": verdict,
        "predicted_classes": list(predicted),
        "latency_ms": latency,
        "report_id": f"r-{path}",
    }


RECORDS = [
    rec("g1", "good", [], "OK"),
    rec("g2", "good", [], "OK"),
    rec("g3", "good", [], "DEFECT", ["dent"]),  # overkill
    rec("g4", "good", [], "UNCERTAIN"),
    rec("s1", "defect", ["scratch"], "DEFECT", ["scratch"]),
    rec("s2", "defect", ["scratch"], "OK"),  # escape
    rec("d1", "defect", ["dent"], "DEFECT", ["dent", "scratch"]),
    rec("d2", "defect", ["dent"], "UNCERTAIN", ["dent"]),
    {"key": "bad", "path": "bad", "error": "INVALID_ARGUMENT: not an image"},
]


def test_score_counts_escape_overkill_and_uncertain_by_the_plant_definitions():
    m = score(RECORDS)
    assert m["counts"] == {
        "images": 8,
        "good": 4,
        "defect": 4,
        "errors": 1,
        "by_verdict": {"OK": 3, "DEFECT": 3, "UNCERTAIN": 2},
    }
    assert (m["escape"]["k"], m["escape"]["n"]) == (1, 4)
    assert (m["overkill"]["k"], m["overkill"]["n"]) == (1, 4)
    assert (m["uncertain"]["k"], m["uncertain"]["n"]) == (2, 8)
    assert m["escape"]["low"] == pytest.approx(wilson_interval(1, 4)[0], abs=1e-6)
    assert m["confusion"] == {
        "rows": ["good", "dent", "scratch"],
        "columns": ["OK", "DEFECT", "UNCERTAIN"],
        "counts": [[2, 1, 1], [0, 1, 1], [1, 1, 0]],
    }
    dent, scratch, good = m["per_class"]["dent"], m["per_class"]["scratch"], m["per_class"]["good"]
    assert (dent["recall"]["k"], dent["recall"]["n"]) == (2, 2)
    assert (dent["precision"]["k"], dent["precision"]["n"]) == (2, 3)  # g3 named a dent that is not there
    assert (scratch["recall"]["k"], scratch["recall"]["n"]) == (1, 2)
    assert (scratch["precision"]["k"], scratch["precision"]["n"]) == (1, 2)
    assert (good["recall"]["k"], good["recall"]["n"]) == (2, 4)
    assert (good["precision"]["k"], good["precision"]["n"]) == (2, 3)  # s2 answered OK
    assert [(x["path"], x["miss"]) for x in misses(RECORDS)] == [
        ("s2", "escape"),
        ("g3", "overkill"),
        ("d2", "uncertain"),
        ("g4", "uncertain"),
    ]


def result(escape, overkill):
    return {"metrics": {"escape": {"k": escape[0], "n": escape[1]}, "overkill": {"k": overkill[0], "n": overkill[1]}}}


def test_gate_fails_only_beyond_the_baselines_interval_and_names_the_metric():
    base = result((1, 20), (2, 20))  # escape 5% (95% CI up to 23.6%), overkill 10% (up to 30.1%)
    assert gate.check(result((1, 20), (2, 20)), base) == []
    assert gate.check(result((4, 20), (5, 20)), base) == []  # 20% and 25%: inside what chance gives
    failed = gate.check(result((6, 20), (2, 20)), base)
    assert [r.metric for r in failed] == ["escape"]
    assert "escape got worse: 6/20 = 30.0%" in failed[0].describe() and "baseline 1/20 = 5.0%" in failed[0].describe()
    # A tolerance widens the allowance; an unmeasured side (no good parts) is not judged.
    assert gate.check(result((6, 20), (2, 20)), base, tolerance=0.1) == []
    assert gate.check(result((6, 20), (0, 0)), result((6, 20), (1, 20))) == []
    # UNCERTAIN for every part is a regression too (each goes to manual recheck).
    all_uncertain = {"metrics": {**base["metrics"], "uncertain": {"k": 20, "n": 20}}}
    failed = gate.check(all_uncertain, {"metrics": {**base["metrics"], "uncertain": {"k": 1, "n": 20}}})
    assert [r.metric for r in failed] == ["uncertain"] and "uncertain got worse: 20/20" in failed[0].describe()


def test_mvtec_and_manifest_layouts_give_the_same_samples(tmp_path):
    from PIL import Image

    for folder, n in (("good", 2), ("scratch", 1), ("Missing_Hole", 1)):
        d = tmp_path / "mv" / "bracket" / "test" / folder
        d.mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", (8, 8), (i, 0, 0)).save(d / f"{i}.png")
    (tmp_path / "mv" / "bracket" / "test" / "good" / "notes.txt").write_text("not an image")
    layout, samples = load_dataset(tmp_path / "mv", "bracket")
    assert layout == "mvtec"
    assert [(s.rel, s.label, s.classes, s.part) for s in samples] == [
        ("bracket/test/Missing_Hole/0.png", "defect", ("missing hole",), "bracket"),
        ("bracket/test/good/0.png", "good", (), "bracket"),
        ("bracket/test/good/1.png", "good", (), "bracket"),
        ("bracket/test/scratch/0.png", "defect", ("scratch",), "bracket"),
    ]
    _, one_part = load_dataset(tmp_path / "mv" / "bracket", "", parse_class_map(["missing_hole=missing feature"]))
    assert one_part[0].classes == ("missing feature",)
    manifest = tmp_path / "mv" / "set.csv"
    manifest.write_text("path,label,classes\nbracket/test/good/0.png,ok,\nbracket/test/scratch/0.png,NG,Scratch|dent\n")
    layout, rows = load_dataset(manifest)
    assert layout == "manifest" and [(s.label, s.classes) for s in rows] == [
        ("good", ()),
        ("defect", ("dent", "scratch")),
    ]
    with pytest.raises(InvalidInput, match="parts there: bracket"):
        load_dataset(tmp_path / "mv", "housing")
    manifest.write_text("path,label\nbracket/test/good/0.png,maybe\n")
    with pytest.raises(InvalidInput, match="set.csv:2: label 'maybe'"):
        load_dataset(manifest)
    assert normalise_class(" Missing-Hole ") == "missing hole"


def test_eval_cli_names_bad_input_and_an_unreachable_gateway(tmp_path):
    import socket

    from PIL import Image
    from typer.testing import CliRunner

    from edgeinspect.cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["eval", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o1")])
    said = " ".join(missing.output.split())  # rich wraps at the terminal width
    assert missing.exit_code == 2 and "expected an MVTec-layout folder or a .csv manifest" in said
    good = tmp_path / "set" / "part" / "test" / "good"
    good.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(good / "0.png")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = runner.invoke(
        app, ["eval", str(tmp_path / "set"), "--out", str(tmp_path / "o2"), "--gateway", f"127.0.0.1:{port}"]
    )
    said = " ".join(down.output.split())
    assert down.exit_code == 3 and "UNAVAILABLE" in said and "rerun to resume" in said
