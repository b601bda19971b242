"""Decide at takt, explain after, in the report store (both databases): a decision is stored and queued for the line
at once with its explanation pending; the explanation completes the same report later without touching what went to
the line (verdict, its reason, time, the gate's finding), and reaches every output as its own row; a restart marks
an explanation that never came failed, and says so to the line."""

from __future__ import annotations

import json

import pytest

from edgeinspect.services.outputs.outbox import OutboxWriter
from edgeinspect.v1 import inspection_pb2 as pb

pytestmark = pytest.mark.timeout(120)


def _decision(report_id: str) -> pb.DefectReport:
    return pb.DefectReport(
        report_id=report_id, idempotency_key=f"key-{report_id}", station="press-7", part="bracket",
        verdict=pb.VERDICT_DEFECT, verdict_reason="the anomaly gate flagged this frame above its OK cut",
        description="flagged by the anomaly gate; the VLM's explanation follows",
        anomaly=pb.AnomalyFinding(score=31.0, threshold=20.0, bank_id="bracket@v1:ab", decided_by=pb.DECIDED_BY_GATE),
        explanation=pb.EXPLANATION_PENDING,
    )  # fmt: skip


def _rows(store) -> list[tuple[str, str, dict]]:
    rows = store._db.execute("SELECT output, report_id, payload FROM outbox ORDER BY seq").fetchall()
    return [(output, key, json.loads(payload)) for output, key, payload in rows]


@pytest.fixture
def store(report_db):
    s = report_db.store(outbox=OutboxWriter(("mqtt", "hook"), 100, False))
    yield s
    s.close()


def test_the_explanation_completes_the_decided_report_and_reaches_the_line_as_its_own_event(store):
    report_id, _ = store.claim("key-r1", "req")
    store.complete(_decision(report_id), to_line=True)
    decided = store.get(report_id)
    assert decided.explanation == pb.EXPLANATION_PENDING and decided.verdict == pb.VERDICT_DEFECT
    assert [(o, p["event"], p["verdict"]) for o, _, p in _rows(store)] == [
        ("mqtt", "decided", "DEFECT"), ("hook", "decided", "DEFECT")
    ]  # fmt: skip

    explained = pb.DefectReport()
    explained.CopyFrom(decided)
    explained.explanation, explained.vlm_verdict = pb.EXPLANATION_DONE, pb.VERDICT_OK
    explained.verdict, explained.verdict_reason = pb.VERDICT_OK, "the VLM saw no defect"  # never what the line keeps
    explained.description = "A scratch 4 mm long at the upper left, beyond SPEC-12's 2 mm."
    explained.defects.add(defect_class="scratch", severity="major")
    explained.anomaly.score = 0.0
    store.explain(explained, to_line=True)

    got = store.get(report_id)
    assert got.verdict == pb.VERDICT_DEFECT and got.verdict_reason == decided.verdict_reason
    assert got.anomaly.score == 31.0 and got.created_time == decided.created_time
    assert (
        got.explanation == pb.EXPLANATION_DONE and got.vlm_verdict == pb.VERDICT_OK and got.HasField("explained_time")
    )
    assert got.description.startswith("A scratch") and [d.defect_class for d in got.defects] == ["scratch"]
    listed, _ = store.list(defect_class="scratch")
    assert [r.report_id for r in listed] == [report_id]  # the explanation's classes are queryable
    rows = _rows(store)
    assert len(rows) == 4 and len({(o, key) for o, key, _ in rows}) == 4
    explained_rows = [p for _, _, p in rows if p.get("event") == "explained"]
    assert len(explained_rows) == 2 and all(
        p["verdict"] == "DEFECT" and p["classes"] == ["scratch"] for p in explained_rows
    )
    assert explained_rows[0]["explanation"] == {"state": "done", "vlm_verdict": "OK"}
    assert all(p["report_id"] == report_id for _, _, p in rows)  # receivers dedupe by report id + event

    store.explain(explained, to_line=True)  # a second explanation (a retried job) changes nothing
    assert len(_rows(store)) == 4 and store.get(report_id).description == got.description


def test_a_restart_marks_a_pending_explanation_failed_and_tells_the_line(store, report_db):
    report_id, _ = store.claim("key-r2", "req")
    store.complete(_decision(report_id), to_line=True)
    done_id, _ = store.claim("key-r3", "req")
    store.complete(pb.DefectReport(report_id=done_id, station="press-7", verdict=pb.VERDICT_OK), to_line=True)
    store.close()
    again = report_db.store(outbox=OutboxWriter(("mqtt", "hook"), 100, False))  # the gateway's next start
    try:
        assert again.fail_unexplained("the gateway restarted while the VLM explained this report") == 1
        got = again.get(report_id)
        assert got.verdict == pb.VERDICT_DEFECT and got.explanation == pb.EXPLANATION_FAILED
        assert "restarted" in got.explanation_error and again.get(done_id).explanation == pb.EXPLANATION_UNSPECIFIED
        failed = [p for _, _, p in _rows(again) if p.get("event") == "explained"]
        assert [p["explanation"]["state"] for p in failed] == ["failed", "failed"]
        assert again.fail_unexplained("again") == 0
    finally:
        again.close()


def test_a_station_whose_vlm_may_clear_a_flag_says_it_waits_for_the_vlm():
    from edgeinspect.services.gateway.api.status import station_gates
    from edgeinspect.services.gateway.settings import AnomalyPolicy, GatewayAnomalySettings, StationGate

    cfg = GatewayAnomalySettings(
        stations={
            "press-7": StationGate(policy=AnomalyPolicy.gate),
            "press-8": StationGate(policy=AnomalyPolicy.gate, vlm_may_clear=True),
        }
    )
    rows = {g.station: g.flagged for g in station_gates(cfg)}
    assert rows == {"*": "decided at takt, explained after", "press-7": "decided at takt, explained after",
                    "press-8": "waits for the VLM (it may clear one)"}  # fmt: skip
