"""Shadow, canary, promote and rollback end to end: a live embedded stack (tiny checkpoint A, a webhook output as
the line), a second set of vision + stage processes on checkpoint B (another seed) as the candidate, driven by
the real `edgeinspect rollout` CLI against the gateway's RolloutService."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.tiny import TinySpec, make_tiny
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.gateway.store import ReportStore
from edgeinspect.services.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2

pytestmark = pytest.mark.e2e
INSPECTIONS = 20
NEW_TOKENS = 24  # short reports: this test counts and routes, it does not read them


class LineReceiver(BaseHTTPRequestHandler):
    """The line's end of the webhook output: records each delivered result's report id."""

    received: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        LineReceiver.received.append(json.loads(body)["report_id"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def line():
    server = ThreadingHTTPServer(("127.0.0.1", 0), LineReceiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/results"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def stacks(tiny_checkpoint, tmp_path_factory, line):
    ckpt_b = make_tiny(tmp_path_factory.mktemp("ckpt-b") / "tiny-b", TinySpec(seed=7))
    webhook = json.dumps([{"url": line, "secret": "s" * 32, "name": "line"}])
    live_opts = StackOptions(
        workdir=tmp_path_factory.mktemp("live"),
        checkpoint=tiny_checkpoint,
        stages=2,
        extra_env={"EDGEINSPECT_OUTPUTS__WEBHOOKS": webhook, "EDGEINSPECT_OUTPUTS__RETRY_BASE_S": "0.05"},
    )
    cand_opts = StackOptions(workdir=tmp_path_factory.mktemp("candidate"), checkpoint=ckpt_b, stages=2)
    with LocalStack(live_opts) as live, LocalStack(cand_opts) as candidate:
        yield live, candidate, ckpt_b


def cli(live: LocalStack, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "edgeinspect.cli", *args, "--gateway", live.gateway_address, "--token", live.api_token]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def status(live: LocalStack) -> dict:
    return json.loads(cli(live, "rollout", "status", "--json").stdout)


def inspect(client: InspectionClient, station: str) -> inspection_pb2.DefectReport:
    image = Path(__file__).resolve().parents[1] / "edgeinspect" / "assets" / "part_dent.jpg"
    return client.inspect(image.read_bytes(), station=station, part="HSG-210", max_new_tokens=NEW_TOKENS)


def test_a_candidate_shadows_is_promoted_to_a_canary_then_all_and_rolls_back(stacks, tiny_checkpoint):
    live, candidate, ckpt_b = stacks
    fp_a, fp_b = open_checkpoint(tiny_checkpoint).fingerprint, open_checkpoint(ckpt_b).fingerprint
    assert fp_a != fp_b
    stage_args = [a for k in range(2) for a in ("--stage", candidate.stage_endpoints(k)[0])]
    started = cli(
        live, "rollout", "start", "--checkpoint", str(ckpt_b), "--vision", candidate.address_of("vision"),
        *stage_args, "--name", "seed7", "--queue", str(INSPECTIONS), "--json",
    )  # fmt: skip
    s = json.loads(started.stdout)
    assert s["state"] == "ROLLOUT_STATE_SHADOW" and s["candidate"]["checkpoint_fingerprint"] == fp_b

    # 20 live inspections: 20 live reports from A answered and delivered to the line, 20 shadow reports from B
    # stored apart, none of which reaches the caller or the line.
    with InspectionClient(live.gateway_address, live.api_token) as client:
        answered = [inspect(client, f"station-{k % 2}") for k in range(INSPECTIONS)]
        assert {r.model.checkpoint_fingerprint for r in answered} == {fp_a}
        assert not any(r.model.shadow for r in answered)
        deadline = time.monotonic() + 180
        while (s := status(live))["shadowed"] < INSPECTIONS and time.monotonic() < deadline:
            time.sleep(0.5)
        assert s["shadowed"] == INSPECTIONS, s
        assert s["skipped"] == 0 and s["shadow_failed"] == 0
        shadow = ReportStore(live.opts.workdir / "shadow-reports.sqlite").list(page_size=500)[0]
        assert len(shadow) == INSPECTIONS
        assert all(r.model.shadow and r.model.checkpoint_fingerprint == fp_b for r in shadow)
        assert {r.idempotency_key.removeprefix("shadow:") for r in shadow} == {r.report_id for r in answered}
        listed = client.stub.ListReports(
            inspection_pb2.ListReportsRequest(page_size=500), metadata=client.metadata, timeout=30
        ).reports
        assert {r.report_id for r in listed} == {r.report_id for r in answered}
        agreed = s["agreed"]
        assert s["agreement"] == pytest.approx(agreed / INSPECTIONS)
        assert len(s["disagreements"]) == min(INSPECTIONS - agreed, 20)
        shown = cli(live, "rollout", "status").stdout
        assert f"{agreed}/{INSPECTIONS}" in shown
        deadline = time.monotonic() + 30
        while len(LineReceiver.received) < INSPECTIONS and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(LineReceiver.received) == sorted(r.report_id for r in answered)

        # Canary: station-1 gets B, station-0 still A.
        cli(live, "rollout", "promote", "--station", "station-1")
        assert inspect(client, "station-1").model.checkpoint_fingerprint == fp_b
        assert inspect(client, "station-0").model.checkpoint_fingerprint == fp_a
        # Promote to all: B everywhere, A kept as the previous version; a restarted gateway still serves B.
        promoted = json.loads(cli(live, "rollout", "promote", "--json").stdout)
        assert promoted["state"] == "ROLLOUT_STATE_PROMOTED" and promoted["previous"]["checkpoint_fingerprint"] == fp_a
        assert inspect(client, "station-0").model.checkpoint_fingerprint == fp_b
    live.restart("gateway")
    with InspectionClient(live.gateway_address, live.api_token) as client:
        assert inspect(client, "station-0").model.checkpoint_fingerprint == fp_b
    assert status(live)["live"]["checkpoint_fingerprint"] == fp_b
    cli(live, "verify", "--checkpoint", str(ckpt_b), "--max-new-tokens", "8")

    # Rollback: A everywhere again, checked by status, a report and a verify run against A.
    rolled = json.loads(cli(live, "rollout", "rollback", "--json").stdout)
    assert rolled["state"] == "ROLLOUT_STATE_ROLLED_BACK" and rolled["live"]["checkpoint_fingerprint"] == fp_a
    with InspectionClient(live.gateway_address, live.api_token) as client:
        assert inspect(client, "station-1").model.checkpoint_fingerprint == fp_a
    cli(live, "verify", "--checkpoint", str(tiny_checkpoint), "--max-new-tokens", "8")
    assert cli(live, "verify", "--checkpoint", str(ckpt_b), "--max-new-tokens", "8", check=False).returncode == 1
    assert cli(live, "rollout", "rollback", check=False).returncode == 1  # nothing left to roll back
