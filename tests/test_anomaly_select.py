"""Extractors chosen by measurement: `eval --compare` on labelled frames, `teach --extractor auto` on a held-out
quarter of the good frames with painted defects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinspect.errors import InvalidInput
from edgeinspect.models.anomaly import photos, select
from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.models.anomaly.teach import load_frames

EXE = Path(sys.executable).with_name("edgeinspect")


def _cli(*args: str) -> str:
    cmd = [str(EXE)] if EXE.is_file() else [sys.executable, "-m", "edgeinspect.cli"]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    root = tmp_path_factory.mktemp("select")
    write_sample_set(root, parts=["metal"], seed=2, n_train=16, n_test_good=6, per_severity=1)
    return root


def test_painted_defects_change_a_small_area_of_each_frame_and_are_seeded():
    frames = [photos.good_frame("gravel", np.random.default_rng(i)) for i in range(3)]
    a, b = select.painted(frames, seed=5), select.painted(frames, seed=5)
    assert len(a) == 6 and all(x.shape == frames[0].shape and x.dtype == np.uint8 for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    for i, x in enumerate(a):
        changed = np.abs(x.astype(int) - frames[i // 2].astype(int)).max(-1) > 20
        assert 0.0005 < changed.mean() < 0.1, changed.mean()  # a defect, not a repaint of the frame


def test_the_pick_is_the_best_auroc_and_a_near_tie_goes_to_the_first_listed(drawn):
    frames = load_frames(drawn / "metal" / "train" / "good")
    chosen, rows = select.pick_on_held_out(frames, "metal", ["raw-pixel", "efficientnet-lite0"])
    assert [r.extractor for r in rows] == ["raw-pixel", "efficientnet-lite0"]
    assert all(r.n_good == 4 and r.n_defect == 8 and 0.0 <= r.image_auroc <= 1.0 for r in rows)
    best = max(r.image_auroc for r in rows)
    first_near = next(r.extractor for r in rows if r.image_auroc >= best - select.AUROC_TIE)
    assert chosen == first_near
    with pytest.raises(InvalidInput, match="too few"):
        select.pick_on_held_out(frames[:10], "metal", ["raw-pixel"])


@pytest.mark.slow  # two teaches and two evaluations through the CLI: ~2 min on the shared 2-core box
def test_eval_compare_teaches_each_extractor_and_scores_the_labelled_frames_side_by_side(drawn):
    out = json.loads(_cli("anomaly", "eval", str(drawn), "--part", "metal", "--compare",
                          "raw-pixel,efficientnet-lite0", "--json"))  # fmt: skip
    rows = {r["extractor"]: r for r in out["compared"]}
    assert set(rows) == {"raw-pixel", "efficientnet-lite0"}
    n_defects = len(json.loads((drawn / "metal" / "defects.json").read_text()))
    for r in rows.values():
        assert r["n_good"] == 6 and r["n_defect"] == n_defects and r["bank_mb"] > 0 and r["ms_per_frame"] > 0
    assert rows["raw-pixel"]["fingerprint"] != rows["efficientnet-lite0"]["fingerprint"]
    assert not (drawn / "banks").exists()  # nothing published


@pytest.mark.slow  # an efficientnet-lite0 teach through the CLI: ~1.5 min on the shared 2-core box
def test_teach_auto_says_what_it_chose(drawn, tmp_path):
    out = _cli("anomaly", "teach", "--part", "metal", "--from", str(drawn / "metal" / "train" / "good"),
               "--extractor", "auto", "--banks", str(tmp_path / "banks"))  # fmt: skip
    bank = json.loads(_cli("anomaly", "banks", "show", "metal", "--banks", str(tmp_path / "banks")))
    installed = select.installed_candidates()
    assert bank["extractor"]["name"] in installed
    if len(installed) == 1:
        assert f"auto: {installed[0]} is the only pretrained extractor installed here" in out
    else:
        assert f"chose {bank['extractor']['name']}" in out
