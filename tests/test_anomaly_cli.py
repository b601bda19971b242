"""`edgeinspect anomaly` as a subprocess: sample -> teach -> banks list/show -> eval --json -> rollback, and bad input
(0 or 1 frames, a corrupt image, a 12000x12000 frame, a mask of the wrong size) ending as one line and a non-zero
exit with the existing bank untouched. raw-pixel features keep it quick; the extractor does not change the paths."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

EXE = Path(sys.executable).with_name("edgeinspect")
PART = "board"


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [str(EXE)] if EXE.is_file() else [sys.executable, "-m", "edgeinspect.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _tree_digest(folder: Path) -> dict[str, str]:
    """Every file under the bank folder with its sha256: 'untouched' means this is equal before and after."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}  # fmt: skip


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    """A drawn sample set of one part and a banks folder holding its bank, version 1."""
    base = tmp_path_factory.mktemp("anomaly-cli")
    _ok(_cli("anomaly", "sample", str(base / "set"), "--part", PART, "--seed", "1"))
    banks = base / "banks"
    out = _ok(_cli("anomaly", "teach", "--part", PART, "--from", str(base / "set" / PART / "train" / "good"),
                   "--extractor", "raw-pixel", "--banks", str(banks)))  # fmt: skip
    assert "version 1" in out and "OK cut" in out and "outliers refused: 0" in out
    assert "expected overkill on new good parts like these: 3.2% (up to 11.3% at 95%, 30 frames held out)" in out
    return base, banks


def test_teach_then_list_show_and_eval_json(taught):
    base, banks = taught
    listed = json.loads(_ok(_cli("anomaly", "banks", "list", "--banks", str(banks), "--json")))
    assert [(r["part"], r["current"], r["extractor"]) for r in listed] == [(PART, 1, "raw-pixel")]
    shown = json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--banks", str(banks))))
    assert shown["version"] == 1 and shown["fingerprint"] == shown["extractor"]["fingerprint"]
    assert len(shown["teach_hashes"]) == 30
    roc = base / "roc.png"
    figures = json.loads(_ok(_cli("anomaly", "eval", str(base / "set"), "--part", PART, "--banks", str(banks),
                                  "--json", "--roc", str(roc))))  # fmt: skip
    for key in ("image_auroc", "pixel_auroc", "escape", "overkill", "threshold", "n_good", "n_defect"):
        assert key in figures, key
    assert figures["n_good"] == 15 and figures["n_defect"] == 18
    assert 0 <= figures["escape"] <= 1 and 0 <= figures["overkill"] <= 1 and 0 <= figures["image_auroc"] <= 1
    assert figures["bank_id"] == shown["bank_id"]
    assert roc.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = _ok(_cli("anomaly", "eval", str(base / "set"), "--part", PART, "--banks", str(banks)))
    assert "image AUROC" in table and "95% CI" in table


def _bad_inputs(base: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, words its one-line error must hold); the folders they need are made here."""
    from PIL import Image

    good = sorted((base / "set" / PART / "train" / "good").glob("*.png"))
    empty, one, corrupt, huge = (base / "bad" / n for n in ("empty", "one", "corrupt", "huge"))
    for folder in (empty, one, corrupt, huge):
        folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(good[0], one)
    for f in good[:8]:
        shutil.copy(f, corrupt)
        shutil.copy(f, huge)
    (corrupt / "zz_corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(300))
    Image.new("1", (12000, 12000)).save(huge / "zz_huge.png")  # 1-bit: a few kB on disk, 144 MP decoded
    wrong = base / "wrong-mask"
    shutil.copytree(base / "set" / PART, wrong / PART)
    Image.new("L", (100, 80)).save(wrong / PART / "ground_truth" / "scratch" / "003_mask.png")

    def teach(folder: Path) -> list[str]:
        return ["anomaly", "teach", "--part", PART, "--from", str(folder), "--extractor", "raw-pixel"]

    return {
        "no frames": (teach(empty), "at least"),
        "one frame": (teach(one), "at least"),
        "corrupt image": (teach(corrupt), "zz_corrupt.png"),
        "12000x12000 frame": (teach(huge), "zz_huge.png"),
        "mask of the wrong size": (["anomaly", "eval", str(wrong), "--part", PART], "003_mask.png"),
    }


def test_bad_input_is_one_line_a_non_zero_exit_and_the_bank_untouched(taught):
    base, banks = taught
    before = _tree_digest(banks)
    cases = _bad_inputs(base)
    with ThreadPoolExecutor(3) as pool:  # each is a fresh Python start-up: run them side by side
        procs = list(pool.map(lambda argv: _cli(*argv, "--banks", str(banks)), [a for a, _ in cases.values()]))
    failures = []
    for (name, (_, words)), proc in zip(cases.items(), procs, strict=True):
        lines = proc.stderr.strip().splitlines()
        if proc.returncode == 0 or len(lines) != 1 or "Traceback" in proc.stderr or words not in lines[0]:
            failures.append(f"{name}: rc={proc.returncode} stderr={proc.stderr[-600:]!r}")
    assert not failures, "\n".join(failures)
    assert _tree_digest(banks) == before  # same CURRENT, same version folders, same bytes
    assert (banks / PART / "CURRENT").read_text().strip() == "v0001"


def test_a_second_teach_is_a_new_version_and_rollback_restores_the_first(taught):
    base, banks = taught
    out = _ok(_cli("anomaly", "teach", "--part", PART, "--from", str(base / "set" / PART / "train" / "good"),
                   "--extractor", "raw-pixel", "--coreset", "0.2", "--banks", str(banks)))  # fmt: skip
    assert "version 2" in out
    listed = json.loads(_ok(_cli("anomaly", "banks", "list", "--banks", str(banks), "--json")))
    assert listed[0]["current"] == 2 and listed[0]["versions"] == [1, 2]
    assert "now board@v1:" in _ok(_cli("anomaly", "banks", "rollback", PART, "1", "--banks", str(banks)))
    assert (banks / PART / "CURRENT").read_text().strip() == "v0001"
    assert json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--banks", str(banks))))["version"] == 1
    missing = _cli("anomaly", "banks", "rollback", PART, "9", "--banks", str(banks))
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1
    assert "Traceback" not in missing.stderr
    assert (banks / PART / "CURRENT").read_text().strip() == "v0001"


def test_eval_adopt_publishes_the_operating_point_as_a_new_version_and_rollback_returns(taught, tmp_path):
    # Threshold from labelled frames: the operating point for a target escape becomes the bank's OK cut, as a new
    # version (on a copy of the banks, so the other tests keep their versions).
    base, banks = taught
    mine = tmp_path / "banks"
    shutil.copytree(banks, mine)
    before = json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--banks", str(mine))))
    out = json.loads(_ok(_cli("anomaly", "eval", str(base / "set"), "--part", PART, "--banks", str(mine), "--json",
                              "--target-escape", "0", "--adopt")))  # fmt: skip
    op, adopted = out["operating_point"], out["adopted"]
    assert op["escape"] == 0 and adopted["version"] > before["version"]  # the next number after the highest
    assert adopted["ok_below"] == pytest.approx(op["threshold"], rel=1e-5)  # the JSON rounds to 6 places
    shown = json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--banks", str(mine))))
    assert shown["bank_id"] == adopted["bank_id"] and shown["fingerprint"] == before["fingerprint"]
    assert shown["stats"]["threshold_from_labels"]["from_bank"] == before["bank_id"]
    # Scored again with the adopted bank: no defect of the labelled set passes as OK.
    again = json.loads(_ok(_cli("anomaly", "eval", str(base / "set"), "--part", PART, "--banks", str(mine), "--json")))
    assert again["escape"] == 0 and again["bank_id"] == adopted["bank_id"]
    _ok(_cli("anomaly", "banks", "rollback", PART, str(before["version"]), "--banks", str(mine)))
    assert json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--banks", str(mine))))["bank_id"] == before["bank_id"]


def test_eval_adopt_refuses_an_operating_point_resting_on_a_handful_of_defects_unless_forced(taught, tmp_path):
    # Three defective frames: whatever the cut, 0 of 3 escaping still allows an escape up to ~56% (Wilson 95%).
    base, banks = taught
    mine, few = tmp_path / "banks", tmp_path / "few"
    shutil.copytree(banks, mine)
    shutil.copytree(base / "set" / PART / "test" / "good", few / PART / "test" / "good")
    defects = sorted(p for p in (base / "set" / PART / "test").rglob("*.png") if p.parent.name != "good")[:3]
    for frame in defects:
        (few / PART / "test" / frame.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(frame, few / PART / "test" / frame.parent.name / frame.name)
    before = _tree_digest(mine)
    args = ["anomaly", "eval", str(few), "--part", PART, "--banks", str(mine), "--target-escape", "0", "--adopt"]
    refused = _cli(*args)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "rests on 3 defective frames" in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert _tree_digest(mine) == before  # nothing published
    adopted = json.loads(_ok(_cli(*args, "--force", "--json")))["adopted"]
    assert adopted["n_defect"] == 3 and adopted["escape_ci95"][1] > 0.5
    shown = json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--banks", str(mine))))
    assert shown["bank_id"] == adopted["bank_id"] and shown["stats"]["threshold_from_labels"]["forced"] is True


def test_a_staged_teach_waits_for_its_go_live_figures_before_promote_makes_it_current(taught, tmp_path):
    base, banks = taught
    mine = tmp_path / "banks"
    shutil.copytree(banks, mine)
    current = json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--banks", str(mine))))["version"]
    out = _ok(_cli("anomaly", "teach", "--part", PART, "--from", str(base / "set" / PART / "train" / "good"),
                   "--extractor", "raw-pixel", "--banks", str(mine), "--stage"))  # fmt: skip
    assert "staged" in out and "--golive" in out
    listed = json.loads(_ok(_cli("anomaly", "banks", "list", "--banks", str(mine), "--json")))[0]
    staged = listed["staged"]
    assert listed["current"] == current and staged > current  # held back: the line still runs the old version
    shown = json.loads(_ok(_cli("anomaly", "banks", "show", PART, "--version", str(staged), "--banks", str(mine))))
    assert shown["state"] == "staged"
    refused = _cli("anomaly", "banks", "promote", PART, str(staged), "--banks", str(mine))
    assert refused.returncode != 0 and "no go-live figures" in refused.stderr and "Traceback" not in refused.stderr
    record = json.loads(_ok(_cli("anomaly", "eval", str(base / "set"), "--part", PART, "--banks", str(mine),
                                 "--version", str(staged), "--golive", "--json")))  # fmt: skip
    assert record["passed"] and record["baseline_bank_id"] and record["candidate"]["n_defect"] > 0
    assert f"@v{staged}" in _ok(_cli("anomaly", "banks", "promote", PART, str(staged), "--banks", str(mine)))
    after = json.loads(_ok(_cli("anomaly", "banks", "list", "--banks", str(mine), "--json")))[0]
    assert after["current"] == staged and after["staged"] is None


def test_a_damaged_version_is_listed_as_damaged_and_banks_remove_deletes_it(taught, tmp_path):
    _, banks = taught
    mine = tmp_path / "banks"
    shutil.copytree(banks, mine)
    shutil.copytree(mine / PART, mine / "bracket")  # a second part, untouched by the damage
    before = {r["part"]: r for r in json.loads(_ok(_cli("anomaly", "banks", "list", "--banks", str(mine), "--json")))}
    current, held = before[PART]["current"], before[PART]["versions"]
    damaged = mine / PART / f"v{max(held) + 1:04d}"
    shutil.copytree(mine / PART / f"v{current:04d}", damaged)
    features = damaged / "features.npy"
    features.write_bytes(features.read_bytes()[:100])  # a disk that lost the end of the file
    listed = {r["part"]: r for r in json.loads(_ok(_cli("anomaly", "banks", "list", "--banks", str(mine), "--json")))}
    assert listed[PART]["current"] == current and listed[PART]["versions"] == held
    assert list(listed[PART]["damaged"]) == [str(max(held) + 1)] and not listed["bracket"]["damaged"]
    table = _ok(_cli("anomaly", "banks", "list", "--banks", str(mine)))
    assert "1 damaged" in table and f"banks remove {PART} {max(held) + 1}" in table
    refused = _cli("anomaly", "banks", "remove", PART, str(current), "--banks", str(mine))
    assert refused.returncode != 0 and "current version" in refused.stderr and "Traceback" not in refused.stderr
    removed = _cli("anomaly", "banks", "remove", PART, str(max(held) + 1), "--banks", str(mine))
    assert f"v{max(held) + 1} removed" in _ok(removed)
    assert not damaged.exists()
    again = json.loads(_ok(_cli("anomaly", "banks", "list", "--banks", str(mine), "--json")))
    assert all(not r["damaged"] for r in again) and {r["part"] for r in again} == {PART, "bracket"}


def test_banks_list_fits_an_80_column_terminal(taught):
    _, banks = taught
    env = {**os.environ, "COLUMNS": "80"}
    cmd = [str(EXE)] if EXE.is_file() else [sys.executable, "-m", "edgeinspect.cli"]
    run = subprocess.run([*cmd, "anomaly", "banks", "list", "--banks", str(banks)], capture_output=True, text=True,
                         timeout=120, env=env)  # fmt: skip
    lines = _ok(run).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    row = next(line for line in lines if line.strip().startswith(PART))
    assert "raw-pixel" in row and "1" in row.split()  # the extractor and the current version, unwrapped
