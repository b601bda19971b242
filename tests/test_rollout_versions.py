"""Rollout bookkeeping without processes: the record, which settings a restarted gateway takes, the shadow
comparison, and the store a candidate writes through (a real SQLite ReportStore)."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.gateway.rollout import versions as v
from edgeinspect.services.gateway.rollout.manager import RoutingStore
from edgeinspect.services.gateway.settings import FrameSettings, GatewaySettings
from edgeinspect.v1 import inspection_pb2, rollout_pb2


def settings(tmp_path: Path) -> GatewaySettings:
    return GatewaySettings(
        checkpoint=tmp_path / "ckpt-a",
        vision="127.0.0.1:1",
        stages=["127.0.0.1:2", "127.0.0.1:3"],
        db_path=tmp_path / "reports.sqlite",
        allow_unauthenticated=True,
    )


def test_a_promotion_survives_a_restart_and_an_edited_config_wins_otherwise(tmp_path):
    cfg = settings(tmp_path)
    a = v.version_of(cfg)
    b = v.Version("b", str(tmp_path / "ckpt-b"), "127.0.0.1:11", ("127.0.0.1:12",), prompt="look closer")
    path = v.state_path(cfg)
    v.save_record(path, v.Record(v.SHADOW, a, b, None, [], v.now_iso(), (2, 16)))
    assert v.load_record(path) == v.Record(v.SHADOW, a, b, None, [], v.load_record(path).started, (2, 16))
    assert v.apply_record(cfg) == cfg  # shadowing: the gateway starts as configured
    v.save_record(path, v.Record(v.PROMOTED, b, None, a, [], v.now_iso()))
    promoted = v.apply_record(cfg)
    assert (promoted.checkpoint, promoted.vision, promoted.stages) == (tmp_path / "ckpt-b", [b.vision], list(b.stages))
    assert promoted.db_path == cfg.db_path and promoted.retrieval == cfg.retrieval
    status = v.load_record(path).to_proto()
    assert status.state == rollout_pb2.ROLLOUT_STATE_PROMOTED and status.previous.name == a.name
    assert v.Version.from_proto(b.to_proto()) == b


def report(rid: str, verdict: int, *classes: str, station: str = "s1") -> inspection_pb2.DefectReport:
    return inspection_pb2.DefectReport(
        report_id=rid,
        station=station,
        verdict=verdict,
        defects=[inspection_pb2.Defect(defect_class=c) for c in classes],
    )


def test_the_shadow_agrees_on_the_same_verdict_and_classes_only():
    ok, defect = inspection_pb2.VERDICT_OK, inspection_pb2.VERDICT_DEFECT
    pairs = [
        (report("l1", ok), report("s1", ok)),
        (report("l2", defect, "Scratch"), report("s2", defect, "scratch ")),  # same class, spelled differently
        (report("l3", defect, "scratch"), report("s3", defect, "dent")),
        (report("l4", ok), report("s4", inspection_pb2.VERDICT_UNCERTAIN)),
    ]
    shadowed, agreed, listed = v.compare(pairs, max_listed=1)
    assert (shadowed, agreed) == (4, 2)
    assert [(d.live_report_id, d.shadow_report_id, list(d.shadow_classes)) for d in listed] == [("l3", "s3", ["dent"])]


def test_the_candidates_shadow_runs_are_stored_apart_and_flagged(tmp_path):
    live = ReportStore(tmp_path / "live.sqlite")
    shadow = ReportStore(tmp_path / "shadow.sqlite", frames=FrameSettings(keep=False))
    store = RoutingStore(live, shadow)
    rid, _ = store.claim(v.SHADOW_KEY + "live-1", "req")
    r = report(rid, inspection_pb2.VERDICT_OK)
    r.idempotency_key = v.SHADOW_KEY + "live-1"
    store.complete(r, image=b"frame")
    canary_id, _ = store.claim("camera-7-0001", "req")
    c = report(canary_id, inspection_pb2.VERDICT_DEFECT, "dent")
    c.idempotency_key = "camera-7-0001"
    store.complete(c)
    failed_id, _ = store.claim(v.SHADOW_KEY + "live-2", "req")
    store.fail(failed_id, "stage down")
    assert [x.report_id for x in shadow.list()[0]] == [rid] and shadow.get(rid).model.shadow
    assert [x.report_id for x in live.list()[0]] == [canary_id] and not live.get(canary_id).model.shadow
    # The failed shadow run freed its key in the shadow store: a retry runs again.
    again, existing = shadow.claim(v.SHADOW_KEY + "live-2", "req")
    assert existing is None and again != failed_id
