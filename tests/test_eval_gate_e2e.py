"""`edgeinspect eval` on a gated station (issue 57, item 5): the embedded stack as processes, the sample part `board`
taught through the vision node's Teach, its MVTec-layout test set from the sample generator sent through the real
CLI. The result gains the gate's own figures and ROC picture, and the baseline gate judges them: a bank that an
admin let defective frames into fails against the bank before it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from edgeinspect.models.anomaly.bank import BankStore
from edgeinspect.models.anomaly.evaluate import evaluate
from edgeinspect.models.anomaly.features import open_extractor
from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.models.anomaly.scoring import Scorer
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, vision_pb2, vision_pb2_grpc

pytestmark = pytest.mark.e2e
PART, STATION = "board", "gated-eval"
PNG = b"\x89PNG\r\n\x1a\n"
KEYS = {"image_auroc", "pixel_auroc", "escape", "escape_ci95", "overkill", "overkill_ci95", "threshold", "n_good",
        "n_defect", "decided_by_gate_alone", "bank_ids", "roc_png"}  # fmt: skip


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("anomaly-sample")
    write_sample_set(root, parts=[PART])
    return root


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory, sample_root):
    opts = StackOptions(workdir=tmp_path_factory.mktemp("eval-gate"), checkpoint=tiny_checkpoint, stages=2,
                        anomaly="vlm", gate_stations=(STATION,))  # fmt: skip
    with LocalStack(opts) as s:
        frames = [p.read_bytes() for p in sorted((sample_root / PART / "train" / "good").glob("*.png"))]
        with grpc.insecure_channel(s.address_of("vision")) as channel:
            taught = vision_pb2_grpc.VisionServiceStub(channel).Teach(
                vision_pb2.TeachRequest(part=PART, frames=frames), timeout=300
            )
        assert taught.bank.version == 1
        yield s


def eval_cli(stack, dataset: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "edgeinspect.cli", "eval", str(dataset), "--part", PART, "--out", str(out),
           "--gateway", stack.gateway_address, "--token", stack.api_token, "--station", STATION,
           "--max-new-tokens", "8", "--concurrency", "2", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def add_to_good_set(stack, report_ids: list[str]) -> str:
    """An admin marks reports as falsely rejected: each becomes a new bank version; returns the last bank id."""
    meta = [("authorization", f"Bearer {stack.api_token}")]
    with grpc.insecure_channel(stack.gateway_address) as channel:
        api = inspection_pb2_grpc.InspectionServiceStub(channel)
        for rid in report_ids:
            version = api.AddToGoodSet(inspection_pb2.AddToGoodSetRequest(report_id=rid), metadata=meta, timeout=300)
    return version.bank_id


def test_eval_on_a_gated_station_reports_the_gates_figures_and_the_baseline_gate_judges_them(
    stack, sample_root, tmp_path
):
    first = eval_cli(stack, sample_root, tmp_path / "v1", "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    result = json.loads(first.stdout)
    a = result["anomaly"]
    assert set(a) >= KEYS, KEYS - set(a)
    assert (a["n_good"], a["n_defect"], a["n_unscored"]) == (15, 18, 0)
    # At most one of the 18 escapes: the default blocks (4 + 7, chosen on real photographs) miss one drawn missing
    # pad, a defect of position that patch kNN sees only through a wide receptive field (DESIGN §8).
    assert a["image_auroc"] >= 0.95 and a["escaped"] <= 1, a
    assert a["threshold"] > 0 and a["bank_ids"][0].startswith(f"{PART}@v1") and a["policies"] == ["gate"]
    # Every frame the gate passed (good parts and escapes) was answered without the VLM: it decided those alone.
    assert a["decided_by_gate_alone"]["k"] == a["n_good"] - a["flagged_good"] + a["escaped"]
    # Pixel AUROC from the stored heatmaps' raw scores agrees with the offline eval of the same bank and frames (the
    # cluster's scores travel as float16; the offline eval batches 16 frames through the extractor, the node one).
    bank = BankStore(stack.banks_dir).load(PART, 1)
    offline = evaluate(sample_root / PART, Scorer(bank, open_extractor(bank.extractor["name"], **bank.extractor.get(
        "options", {}))))  # fmt: skip
    assert offline.pixel_auroc is not None and a["pixel_auroc_note"] == ""
    assert a["pixel_auroc"] == pytest.approx(offline.pixel_auroc, abs=1e-3), (a["pixel_auroc"], offline.pixel_auroc)
    assert (tmp_path / "v1" / a["roc_png"]).read_bytes().startswith(PNG)
    assert "## Anomaly gate" in (tmp_path / "v1" / "report.md").read_text()
    baseline = tmp_path / "v1" / "result.json"

    # Against itself (a rerun answers from results.jsonl): the gate passes.
    same = eval_cli(stack, sample_root, tmp_path / "v1", "--baseline", str(baseline))
    assert same.returncode == 0 and "gate passed" in same.stderr, same.stderr[-2000:]
    assert "anomaly gate" in same.stdout and "image AUROC" in same.stdout

    # A worse candidate, for real: an admin adds the faint (severity 1) defects the gate flagged to the good set.
    # The new bank passes them, so its escape lies far above the first bank's interval and the gate fails.
    labels = json.loads((sample_root / PART / "defects.json").read_text())
    faint = {f"{PART}/{name}" for name, label in labels.items() if label["severity"] == 1}
    records = [json.loads(line) for line in (tmp_path / "v1" / "results.jsonl").read_text().splitlines()]
    flagged_faint = [r["report_id"] for r in records if r["path"] in faint and r["path"] not in a["misses"]]
    assert len(flagged_faint) >= 5, "the first bank should flag the faint defects"
    bank_id = add_to_good_set(stack, flagged_faint)
    worse = eval_cli(stack, sample_root, tmp_path / "candidate", "--baseline", str(baseline))
    stderr = " ".join(worse.stderr.split())
    assert worse.returncode == 1, stderr[-2000:]
    candidate = json.loads((tmp_path / "candidate" / "result.json").read_text())["anomaly"]
    assert candidate["bank_ids"] == [bank_id] and candidate["escaped"] >= 5
    assert f"GATE FAILED: anomaly gate escape got worse: {candidate['escaped']}/18" in stderr
    assert f"vs baseline {a['escaped']}/18" in stderr
    assert "anomaly bank_ids:" in stderr  # the differences name the bank that changed
