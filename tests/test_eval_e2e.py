"""`edgeinspect eval` as a user runs it (a subprocess of the real CLI) against the embedded stack (vision, two
stages, gateway as processes, tiny checkpoint) on a generated MVTec-layout set of the sample part. The tiny
checkpoint's verdicts are arbitrary but deterministic, which is all counting needs."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
from eval_dataset import make_mvtec_set

from edgeinspect.services.evaluation.stats import wilson_interval
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

pytestmark = pytest.mark.e2e
PART = "HSG-210"
GOOD, PER_DEFECT = 4, 2  # 4 good + 3 defect types x 2 = 10 parts
N = GOOD + 3 * PER_DEFECT


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_mvtec_set(tmp_path_factory.mktemp("mvtec"), PART, GOOD, PER_DEFECT)


def eval_cli(stack, dataset: Path, out: Path, station: str, *extra: str, check: bool = True):
    cmd = [sys.executable, "-m", "edgeinspect.cli", "eval", str(dataset), "--part", PART, "--out", str(out)]
    cmd += ["--gateway", stack.gateway_address, "--token", stack.api_token, "--station", station, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def stored_reports(stack, station: str) -> list[inspection_pb2.DefectReport]:
    """Every stored report of a station, through the public ListReports."""
    with grpc.insecure_channel(stack.gateway_address) as channel:
        stub = inspection_pb2_grpc.InspectionServiceStub(channel)
        out, token = [], ""
        while True:
            resp = stub.ListReports(
                inspection_pb2.ListReportsRequest(station=station, page_size=500, page_token=token),
                metadata=[("authorization", f"Bearer {stack.api_token}")],
                timeout=30,
            )
            out += resp.reports
            token = resp.next_page_token
            if not token:
                return out


def results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def comparable(result: dict) -> dict:
    """The result without what differs between two runs of one configuration: run id, latencies, report ids."""
    r = copy.deepcopy(result)
    r.pop("run")
    r["metrics"].pop("latency_ms")
    r["measured"].pop("partitions")  # stage addresses: the same stack, but kept out in case a role restarts
    for miss in r["misses"]:
        miss.pop("report_id")
    return r


def test_eval_counts_the_set_and_its_rates_are_those_of_the_stored_reports(embedded_stack, dataset, tmp_path):
    station = f"eval-{uuid.uuid4().hex[:8]}"
    first = eval_cli(embedded_stack, dataset, tmp_path / "a", station, "--json", "--concurrency", "3")
    result = json.loads(first.stdout)
    m = result["metrics"]
    assert m["counts"] == {**m["counts"], "images": N, "good": GOOD, "defect": N - GOOD, "errors": 0}
    assert sum(map(sum, m["confusion"]["counts"])) == N
    assert m["confusion"]["rows"] == ["good", "dent", "missing hole", "scratch"]

    # By hand, from the reports the gateway stored (ListReports), joined to the labels by report id.
    stored = {r.report_id: r for r in stored_reports(embedded_stack, station)}
    assert len(stored) == N
    label = {rec["report_id"]: rec["label"] for rec in results(tmp_path / "a")}
    assert set(label) == set(stored)
    verdict = {rid: inspection_pb2.Verdict.Name(r.verdict) for rid, r in stored.items()}
    good = [rid for rid in stored if label[rid] == "good"]
    bad = [rid for rid in stored if label[rid] == "defect"]
    by_hand = {
        "escape": (sum(verdict[r] == "VERDICT_OK" for r in bad), len(bad)),
        "overkill": (sum(verdict[r] == "VERDICT_DEFECT" for r in good), len(good)),
        "uncertain": (sum(verdict[r] == "VERDICT_UNCERTAIN" for r in stored), N),
    }
    for name, (k, n) in by_hand.items():
        low, high = wilson_interval(k, n)
        assert (m[name]["k"], m[name]["n"]) == (k, n), name
        assert m[name]["low"] == pytest.approx(low, abs=1e-6) and m[name]["high"] == pytest.approx(high, abs=1e-6)
    fingerprints = {r.model.checkpoint_fingerprint for r in stored.values()}
    assert result["measured"]["checkpoint_fingerprints"] == sorted(fingerprints)
    assert m["latency_ms"]["n"] == N and m["latency_ms"]["p50"]["value"] > 0

    # The report: Markdown, both pictures, a frame per listed miss.
    report = (tmp_path / "a" / "report.md").read_text()
    assert "![confusion matrix](confusion.png)" in report and (tmp_path / "a" / "per_class.png").stat().st_size > 0
    assert len(list((tmp_path / "a" / "misses").glob("*.jpg"))) == min(len(result["misses"]), 12)

    # A rerun on the same folder inspects nothing and prints the same bytes; a fresh run of the same configuration
    # gives the same result but for run id, latencies and report ids.
    again = eval_cli(embedded_stack, dataset, tmp_path / "a", station, "--json", "--concurrency", "3")
    assert again.stdout == first.stdout
    assert len(stored_reports(embedded_stack, station)) == N
    fresh = eval_cli(embedded_stack, dataset, tmp_path / "b", station, "--json", "--concurrency", "3")
    assert comparable(json.loads(fresh.stdout)) == comparable(result)
    assert len(stored_reports(embedded_stack, station)) == 2 * N

    # The regression gate. Baseline from the first run: an identical rerun passes.
    baseline = tmp_path / "a" / "result.json"
    passed = eval_cli(embedded_stack, dataset, tmp_path / "b", station, "--baseline", str(baseline))
    assert "gate passed" in passed.stderr
    # A baseline that measured better than this configuration does (0 of n on the worse of escape and overkill):
    # this run is worse beyond the baseline's interval, so the gate fails and names the metric and the numbers.
    worse = max(("escape", "overkill"), key=lambda k: m[k]["value"])
    k, n = m[worse]["k"], m[worse]["n"]
    assert k / n > wilson_interval(0, n)[1], f"the tiny checkpoint's {worse} {k}/{n} leaves nothing to regress"
    better = json.loads(baseline.read_text())
    better["metrics"][worse]["k"] = 0
    perturbed = tmp_path / "better-baseline.json"
    perturbed.write_text(json.dumps(better))
    failed = eval_cli(embedded_stack, dataset, tmp_path / "b", station, "--baseline", str(perturbed), check=False)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert f"GATE FAILED: {worse} got worse: {k}/{n}" in " ".join(failed.stderr.split())
    assert f"baseline 0/{n} = 0.0%" in " ".join(failed.stderr.split())
    assert "FAIL:" in (tmp_path / "b" / "report.md").read_text()
    # A deliberately worse configuration, run for real: a generation budget too short for any report leaves every
    # part UNCERTAIN, and the gate against the first run's baseline fails naming that metric.
    assert m["uncertain"]["k"] / N < wilson_interval(N, N)[0], "the baseline is already all UNCERTAIN"
    crippled = eval_cli(
        embedded_stack, dataset, tmp_path / "c", station, "--baseline", str(baseline), "--max-new-tokens", "2",
        check=False,
    )  # fmt: skip
    assert crippled.returncode == 1, crippled.stderr[-2000:]
    assert f"GATE FAILED: uncertain got worse: {N}/{N}" in " ".join(crippled.stderr.split())


def test_an_eval_killed_half_way_continues_without_inspecting_done_images_again(embedded_stack, dataset, tmp_path):
    station = f"eval-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "edgeinspect.cli", "eval", str(dataset), "--part", PART, "--out", str(out)]
    cmd += ["--gateway", embedded_stack.gateway_address, "--token", embedded_stack.api_token, "--station", station]
    proc = subprocess.Popen([*cmd, "--concurrency", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "results.jsonl").is_file() and len(results(out)) >= N // 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the eval ended before it could be killed half way"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done_before = {r["key"]: r["report_id"] for r in results(out)}
    assert N // 2 <= len(done_before) < N
    # The image in flight at the kill may still finish inside the gateway: wait until nothing is running there.
    time.sleep(2.0)
    stored_before = len(stored_reports(embedded_stack, station))
    assert len(done_before) <= stored_before <= len(done_before) + 1

    resumed = eval_cli(embedded_stack, dataset, out, station, "--json")
    assert json.loads(resumed.stdout)["metrics"]["counts"]["images"] == N
    final = {r["key"]: r["report_id"] for r in results(out)}
    assert len(final) == N and all(final[k] == rid for k, rid in done_before.items())
    # Exactly one report per image: done images were skipped, and the one in flight at the kill was answered from
    # the gateway's store (same idempotency key) instead of being inspected again.
    assert len(stored_reports(embedded_stack, station)) == N


def test_operator_reviews_become_the_labelled_set(embedded_stack, dataset, tmp_path):
    from edgeinspect.services.client import InspectionClient

    station = f"line-{uuid.uuid4().hex[:8]}"
    test_dir = dataset / PART / "test"
    frames = {"good": test_dir / "good" / "000.png", "scratch": test_dir / "scratch" / "000.png"}
    frames["dent"] = test_dir / "dent" / "001.png"
    labels = {"good": (inspection_pb2.VERDICT_OK, []), "scratch": (inspection_pb2.VERDICT_DEFECT, ["Scratch"])}
    labels["dent"] = (inspection_pb2.VERDICT_DEFECT, ["dent"])
    with InspectionClient(embedded_stack.gateway_address, embedded_stack.api_token) as client:
        for name, path in frames.items():
            report = client.inspect(path.read_bytes(), station=station, part=PART)
            verdict, classes = labels[name]
            client.stub.ReviewReport(
                inspection_pb2.ReviewReportRequest(report_id=report.report_id, verdict=verdict, defect_classes=classes),
                metadata=client.metadata,
                timeout=30,
            )
        client.inspect(frames["good"].read_bytes(), station=station, part=PART)  # not reviewed: not a label

    again_at = f"eval-{station}"
    proc = eval_cli(embedded_stack, Path(f"reviews:{station}"), tmp_path / "r", again_at, "--json")
    result = json.loads(proc.stdout)
    assert result["dataset"]["layout"] == "reviews"
    assert result["metrics"]["counts"] == {**result["metrics"]["counts"], "images": 3, "good": 1, "defect": 2}
    assert sorted(result["metrics"]["confusion"]["rows"]) == ["dent", "good", "scratch"]
    # The frames came back from the gateway's frame store byte for byte, and were inspected again.
    kept = sorted(p.read_bytes() for p in (tmp_path / "r" / "reviewed-frames").iterdir())
    assert kept == sorted(p.read_bytes() for p in frames.values())
    assert len(stored_reports(embedded_stack, again_at)) == 3
