"""Outputs without a broker: signed webhooks against a real HTTP server in the test, 5xx retried with backoff,
4xx dropped, the outbox bounded (drop_oldest) and durable across a restart, outputs independent, shadow reports never
queued."""

from __future__ import annotations

import logging
import time

import pytest
from line_peers import SECRET, Receiver
from prometheus_client import REGISTRY

from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.services.outputs.fanout import Outputs
from edgeinspect.services.outputs.outbox import OutboxWriter
from edgeinspect.services.outputs.result import LineResult, from_report, is_shadow
from edgeinspect.services.outputs.webhook import sign, verify
from edgeinspect.services.store.database import SQLiteDatabase
from edgeinspect.v1 import inspection_pb2


def result(i: int, station: str = "station-3") -> LineResult:
    return LineResult(f"r{i:03d}", station, "cam", "HSG-210", "DEFECT", ("scratch",), "major", 1.0e9, 1.0e9 + 2, 2000.0)


def outputs_for(tmp_path, *hooks: dict, **kw) -> Outputs:
    cfg = OutputsConfig(webhooks=[{"secret": SECRET, **h} for h in hooks], retry_base_s=0.2, retry_max_s=2.0, **kw)
    return Outputs.local(cfg, tmp_path / "outbox")


def dropped(output: str, reason: str) -> float | None:
    return REGISTRY.get_sample_value("edgeinspect_output_dropped_total", {"output": output, "reason": reason})


def wait_for(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_signed_posts_verify_and_a_500_is_retried_with_growing_delays(tmp_path):
    receiver = Receiver(script=[500, 500, 500])
    outputs = outputs_for(tmp_path, {"url": receiver.url})
    try:
        for i in range(3):
            outputs.publish_result(result(i))
        wait_for(lambda: len(receiver.delivered()) == 3, 20, "three deliveries")
    finally:
        outputs.close()
        receiver.close()
    assert receiver.delivered() == ["r000", "r001", "r002"]  # in order, the failed one first
    assert all(r["ok"] for r in receiver.requests)  # every POST carried a valid signature
    tries = [r["at"] for r in receiver.requests if r["id"] == "r000"]
    assert len(tries) == 4
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= 0.15 and gaps[1] > gaps[0] and gaps[2] > gaps[1]  # backoff, not a hot loop
    body = receiver.requests[-1]["body"]
    assert body["report_id"] == "r002" and body["classes"] == ["scratch"] and body["severity"] == "major"


def test_a_signature_from_another_secret_or_an_old_timestamp_fails_verification():
    body, ts = b'{"report_id":"r1"}', f"{time.time():.3f}"
    assert verify(SECRET, ts, body, sign(SECRET, ts, body))
    assert not verify(SECRET, ts, body, sign("another-secret-000000", ts, body))
    assert not verify(SECRET, ts, body + b" ", sign(SECRET, ts, body))
    old = f"{time.time() - 3600:.3f}"
    assert not verify(SECRET, old, body, sign(SECRET, old, body))


def test_a_4xx_is_dropped_and_counted_not_retried(tmp_path):
    receiver = Receiver(script=[422])
    outputs = outputs_for(tmp_path, {"url": receiver.url, "name": "rejecting"})
    try:
        outputs.publish_result(result(0))
        outputs.publish_result(result(1))
        wait_for(lambda: receiver.delivered() == ["r001"], 10, "the second delivery")
    finally:
        outputs.close()
        receiver.close()
    assert [r["id"] for r in receiver.requests] == ["r000", "r001"]
    assert (
        REGISTRY.get_sample_value("edgeinspect_output_dropped_total", {"output": "rejecting", "reason": "rejected"})
        == 1
    )


def test_drop_oldest_keeps_the_newest_max_queued_per_station_with_a_metric_and_a_log_line(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    cfg = OutputsConfig(webhooks=[{"url": "http://127.0.0.1:9/down", "secret": SECRET, "name": "down"}],
                        max_queued=2, on_full="drop_oldest", retry_base_s=5.0)  # fmt: skip
    outputs = Outputs.local(cfg, tmp_path / "outbox")
    try:
        for i in range(4):
            outputs.publish_result(result(i))
        outputs.publish_result(result(9, station="station-4"))  # another station's queue is its own
        rows = outputs.outbox.db.execute("SELECT report_id FROM outbox ORDER BY seq").fetchall()
    finally:
        outputs.close(drain_s=0)
    ids = [r for (r,) in rows]
    # the newest two of station-3 and station-4's own; at most one older row more: the one in flight (leased, kept
    # for its drainer)
    assert ids[-3:] == ["r002", "r003", "r009"] and len(ids) <= 4 and set(ids[:-3]) <= {"r000", "r001"}, ids
    assert "dropped the" in caplog.text
    assert dropped("down", "outbox_full") >= 1


def test_queued_results_survive_a_restart_and_go_out_when_the_peer_is_back(tmp_path):
    receiver = Receiver()
    receiver.close()  # nobody listens on that port now
    first = outputs_for(tmp_path, {"url": receiver.url, "name": "hook"})
    for i in range(2):
        first.publish_result(result(i))
    time.sleep(0.5)
    first.close(drain_s=0)
    back = Receiver()
    second = Outputs.local(
        OutputsConfig(webhooks=[{"url": back.url, "secret": SECRET, "name": "hook"}], retry_base_s=0.1),
        tmp_path / "outbox",
    )
    try:
        wait_for(lambda: back.delivered() == ["r000", "r001"], 10, "the queued results")
    finally:
        second.close()
        back.close()


def test_a_slow_output_never_delays_another(tmp_path):
    slow, fast = Receiver(delay_s=3.0), Receiver()
    outputs = outputs_for(
        tmp_path, {"url": slow.url, "name": "slow", "timeout_s": 10}, {"url": fast.url, "name": "fast"}
    )
    try:
        t0 = time.monotonic()
        for i in range(3):
            outputs.publish_result(result(i))
        assert time.monotonic() - t0 < 0.1  # publish returns at once
        wait_for(lambda: len(fast.delivered()) == 3, 2.5, "the fast receiver")  # before the slow one got even one
        assert slow.delivered() == []
    finally:
        outputs.close(drain_s=0)
        slow.close()
        fast.close()


@pytest.mark.parametrize("shadow", [True, False])
def test_shadow_reports_never_leave_the_box(tmp_path, shadow):
    receiver = Receiver()
    cfg = OutputsConfig(webhooks=[{"url": receiver.url, "secret": SECRET}])
    store = ReportStore(tmp_path / "reports.sqlite", outbox=OutboxWriter.of(cfg))
    outputs = Outputs(cfg, lambda: SQLiteDatabase(tmp_path / "reports.sqlite"))
    report = inspection_pb2.DefectReport(report_id="r-s", station="station-3", verdict=inspection_pb2.VERDICT_OK)
    report.model.shadow = shadow
    report.created_time.GetCurrentTime()
    try:
        assert is_shadow(report) is shadow
        store.complete(report, to_line=True)
        outputs.notify()
        assert outputs.wait_idle(5)
        time.sleep(0.2)
    finally:
        outputs.close()
        store.close()
        receiver.close()
    assert receiver.delivered() == ([] if shadow else ["r-s"])
    assert from_report(report).verdict == "OK"
