"""The line's outbox under a real gateway process (in front of the session's embedded stack) publishing to a real
Mosquitto: a gateway SIGKILLed right after a report's commit (fault point `report_committed`, edgeinspect/faults.py)
sends the result after its restart, once; a full outbox while the broker is down refuses that station's inspections
with RESOURCE_EXHAUSTED naming the output, the count and the peer, other stations and reads go on, and the station
is admitted again once the broker is back and the queue drained."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
from line_peers import Subscriber

from edgeinspect.assets import asset_path
from edgeinspect.config import ServerConfig, write_yaml
from edgeinspect.faults import ENV
from edgeinspect.services.gateway.settings import AnomalyPolicy, GatewayAnomalySettings, GatewaySettings, StationGate
from edgeinspect.services.line.testing import MosquittoBroker
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs Debian's mosquitto"),
]
START_S = 120
FRAME = asset_path("part_ok.jpg").read_bytes()
RESULTS = "edgeinspect/+/+/result"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with MosquittoBroker(tmp_path_factory.mktemp("mosquitto-outbox")) as b:
        yield b


class Gateway:
    """One gateway process on its own SQLite store, publishing to `url`; start() again = a restart."""

    def __init__(self, stack, folder: Path, url: str, anomaly: GatewayAnomalySettings | None = None, **outputs) -> None:
        cfg = GatewaySettings.load(stack.role("gateway").config_path)
        self.folder = folder
        self.cfg = cfg.model_copy(
            update={
                "api_tokens": [],
                "allow_unauthenticated": True,
                "db_path": folder / "reports.sqlite",
                "server": ServerConfig(host="127.0.0.1", port=0, port_file=folder / "gateway.port", grace_s=1.0),
                "outputs": OutputsConfig(mqtt={"url": url, "node": "gw-test"}, retry_max_s=0.5, **outputs),
                "anomaly": anomaly or cfg.anomaly,
            }
        )
        write_yaml(self.cfg, folder / "gateway.yaml")
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self, env: dict | None = None) -> Gateway:
        (self.folder / "gateway.port").unlink(missing_ok=True)
        with (self.folder / "gateway.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edgeinspect.services.gateway", "--config", str(self.folder / "gateway.yaml")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        self.address = self._wait_serving()
        return self

    def _wait_serving(self) -> str:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        port_file, deadline = self.folder / "gateway.port", time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()[-3000:]
            if port_file.is_file() and port_file.read_text().strip():
                address = f"127.0.0.1:{int(port_file.read_text())}"
                with contextlib.suppress(grpc.RpcError), grpc.insecure_channel(address) as ch:
                    if health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                        return address
            time.sleep(0.2)
        raise AssertionError(f"the gateway was not SERVING within {START_S}s:\n" + self.log()[-3000:])

    def log(self) -> str:
        return (self.folder / "gateway.log").read_text(errors="replace")

    def stub(self):
        return inspection_pb2_grpc.InspectionServiceStub(grpc.insecure_channel(self.address))

    def inspect(self, station: str) -> inspection_pb2.DefectReport:
        request = inspection_pb2.InspectRequest(
            image=FRAME, station=station, max_new_tokens=4, idempotency_key=uuid.uuid4().hex
        )
        return self.stub().Inspect(request, timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_a_gateway_killed_after_the_commit_sends_the_result_once_after_its_restart(embedded_stack, broker, tmp_path):
    sub = Subscriber(broker.port, RESULTS, f"crash-{uuid.uuid4().hex[:6]}")
    gateway = Gateway(embedded_stack, tmp_path, broker.url, lease_s=2.0)
    try:
        sub.wait_subscribed()
        gateway.start(env={ENV: "report_committed"})
        with pytest.raises(grpc.RpcError) as err:
            gateway.inspect("station-crash")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert gateway.proc.wait(10) == -9  # died at the fault point: committed, nothing sent
        with sqlite3.connect(tmp_path / "reports.sqlite") as db:
            stored = db.execute("SELECT report_id FROM reports WHERE status = 'done'").fetchall()
        assert len(stored) == 1 and sub.bodies() == []
        (report_id,) = stored[0]

        gateway.start()  # no fault: the drainer finds the committed row
        sub.wait_for(lambda s: report_id in s.unique_ids(), 30, "the result after the restart")
        time.sleep(1.0)  # a second copy would arrive by now
        assert sub.unique_ids() == [report_id]
        assert [b["report_id"] for b in sub.bodies()] == [report_id]  # exactly once
        got = gateway.stub().GetReport(inspection_pb2.GetReportRequest(report_id=report_id), timeout=10)
        assert got.station == "station-crash"
        with sqlite3.connect(tmp_path / "reports.sqlite") as db:
            assert db.execute("SELECT COUNT(*) FROM reports WHERE status = 'done'").fetchone()[0] == 1
            assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 0  # delivered rows are gone
        gateway.stop()
        crash_after_send(gateway, sub)
    finally:
        gateway.stop()
        sub.close()


def crash_after_send(gateway: Gateway, sub: Subscriber) -> None:
    """Killed between the broker's acknowledgement and the outbox row's delete (`output_sent`): after the restart
    the result is sent again, so the line sees it twice, identical, under one report id (receivers dedupe by it)."""
    gateway.start(env={ENV: "output_sent"})
    key = uuid.uuid4().hex
    request = inspection_pb2.InspectRequest(image=FRAME, station="station-sent", max_new_tokens=4, idempotency_key=key)
    report = gateway.stub().Inspect(request, timeout=60)  # answered: the gateway dies only once it has sent it
    assert gateway.proc.wait(30) == -9
    gateway.start()  # the row's lease (lease_s) runs out, the drainer sends it again
    sub.wait_for(lambda s: [b["report_id"] for b in s.bodies()].count(report.report_id) == 2, 60, "the redelivery")
    copies = [b for b in sub.bodies() if b["report_id"] == report.report_id]
    assert copies[0] == copies[1]  # the same result, byte for byte: a receiver keeps the first
    with sqlite3.connect(gateway.folder / "reports.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 0


def test_a_full_outbox_refuses_that_station_until_the_broker_is_back(embedded_stack, broker, tmp_path):
    gateway = Gateway(embedded_stack, tmp_path, broker.url, max_queued=2).start()
    try:
        broker.stop()
        first = [gateway.inspect("station-x") for _ in range(2)]  # queued: the broker is down
        with pytest.raises(grpc.RpcError) as err:
            gateway.inspect("station-x")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        details = err.value.details()
        assert "output 'mqtt' has 2 results queued for station 'station-x' (limit 2)" in details, details
        assert "its peer is down" in details and str(broker.port) not in details, details  # the address: log, status
        trailers = dict(err.value.trailing_metadata())
        assert trailers["edgeinspect-error-code"] == "outbox_full"

        assert gateway.inspect("station-y").report_id  # another station's queue has room
        got = gateway.stub().GetReport(inspection_pb2.GetReportRequest(report_id=first[0].report_id), timeout=10)
        assert got.report_id == first[0].report_id  # reads go on
        status = gateway.stub().GetClusterStatus(inspection_pb2.ClusterStatusRequest(), timeout=10)
        assert any("station 'station-x'" in n and f"127.0.0.1:{broker.port}" in n for n in status.notes), status.notes
        assert "refusing inspections for station station-x" in gateway.log()
    finally:
        broker.start()
    try:
        deadline = time.monotonic() + 30
        while True:  # the queue drains once the broker is back; then the station is admitted
            try:
                assert gateway.inspect("station-x").report_id
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.5)
        status = gateway.stub().GetClusterStatus(inspection_pb2.ClusterStatusRequest(), timeout=10)
        assert not any("station 'station-x'" in n for n in status.notes)
    finally:
        gateway.stop()


def test_a_gateway_killed_between_a_decision_and_its_explanation_loses_neither(embedded_stack, broker, tmp_path):
    """Decide at takt, explain after (services/gateway/explain.py): the decision reaches the line at once; a gateway
    SIGKILLed while the VLM explains it marks the explanation failed at its restart and tells the line so; a later
    decision is explained and both events reach the line once each."""
    from edgeinspect.models.anomaly.sample import write_sample_set
    from edgeinspect.v1 import vision_pb2, vision_pb2_grpc

    part, station = "takt-board", "takt-1"
    write_sample_set(tmp_path / "set", parts=["board"])
    board = tmp_path / "set" / "board"
    frames = [p.read_bytes() for p in sorted((board / "train" / "good").glob("*.png"))]
    with grpc.insecure_channel(embedded_stack.address_of("vision")) as channel:
        vision_pb2_grpc.VisionServiceStub(channel).Teach(vision_pb2.TeachRequest(part=part, frames=frames), timeout=300)
    labels = json.loads((board / "defects.json").read_text())
    flagged = [board / n for n, label in sorted(labels.items()) if label["severity"] == 3][:2]
    gate_it = GatewayAnomalySettings(stations={station: StationGate(policy=AnomalyPolicy.gate)})
    sub = Subscriber(broker.port, "edgeinspect/+/+/+", f"takt-{uuid.uuid4().hex[:6]}")
    gateway = Gateway(embedded_stack, tmp_path, broker.url, anomaly=gate_it, lease_s=2.0)

    def inspect(path: Path) -> inspection_pb2.DefectReport:
        request = inspection_pb2.InspectRequest(image=path.read_bytes(), station=station, part=part,
                                                max_new_tokens=8, idempotency_key=uuid.uuid4().hex)  # fmt: skip
        return gateway.stub().Inspect(request, timeout=120)

    def events(report_id: str) -> list[tuple[str, str]]:
        return [(topic.rsplit("/", 1)[1], body.get("event", "")) for topic, body, _ in sub.messages
                if body.get("report_id") == report_id and not topic.endswith("/last")]  # fmt: skip

    try:
        sub.wait_subscribed()
        gateway.start(env={ENV: "explaining"})
        decision = inspect(flagged[0])  # answered at takt; the VLM then explains it and the gateway dies there
        assert decision.verdict == inspection_pb2.VERDICT_DEFECT
        assert decision.explanation == inspection_pb2.EXPLANATION_PENDING
        assert gateway.proc.wait(120) == -9
        sub.wait_for(lambda s: ("result", "decided") in events(decision.report_id), 30, "the decision on the line")

        gateway.start()  # the restart finds the explanation that never came
        got = gateway.stub().GetReport(inspection_pb2.GetReportRequest(report_id=decision.report_id), timeout=10)
        assert got.explanation == inspection_pb2.EXPLANATION_FAILED and "restarted" in got.explanation_error
        assert got.verdict == decision.verdict and got.anomaly == decision.anomaly  # the decision stands as sent
        sub.wait_for(lambda s: ("explained", "explained") in events(decision.report_id), 30, "the failed explanation")
        failed = [b for _, b, _ in sub.messages if b.get("event") == "explained"]
        assert failed[-1]["explanation"]["state"] == "failed" and failed[-1]["verdict"] == "DEFECT"

        second = inspect(flagged[1])
        sub.wait_for(lambda s: ("explained", "explained") in events(second.report_id), 120, "the explanation")
        done = gateway.stub().GetReport(inspection_pb2.GetReportRequest(report_id=second.report_id), timeout=10)
        assert done.explanation == inspection_pb2.EXPLANATION_DONE and done.generated_token_ids
        assert done.verdict == second.verdict and done.vlm_verdict != inspection_pb2.VERDICT_UNSPECIFIED
        time.sleep(1.0)  # a second copy of either event would arrive by now
        assert sorted(events(second.report_id)) == [("explained", "explained"), ("result", "decided")]
        assert sorted(events(decision.report_id)) == [("explained", "explained"), ("result", "decided")]
    finally:
        gateway.stop()
        sub.close()
