"""Report store schema 1: attempts keep their key, restarts fail pending rows, frames and retention, reviews,
class/camera/review filters, aggregates against ListReports-style counts, migration from the first release."""

from __future__ import annotations

import io
import random
import sqlite3
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from PIL import Image

from edgeinspect.errors import InvalidInput, NotFound
from edgeinspect.services.gateway.reports.frames import FrameFiles
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.gateway.settings import FrameSettings
from edgeinspect.services.store.claims import RESTARTED
from edgeinspect.services.store.schema import SCHEMA_VERSION
from edgeinspect.v1 import inspection_pb2
from edgeinspect.v1.inspection_pb2 import DefectReport

T0 = datetime(2025, 3, 1, 6, 0, tzinfo=UTC)
OK, DEFECT, UNCERTAIN = inspection_pb2.VERDICT_OK, inspection_pb2.VERDICT_DEFECT, inspection_pb2.VERDICT_UNCERTAIN


def _jpeg(seed: int, size: int = 320) -> bytes:
    rng = random.Random(seed)
    img = Image.new("RGB", (size, size), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    for _ in range(200):  # noise so frames differ in content and do not compress to nothing
        img.putpixel((rng.randrange(size), rng.randrange(size)), (rng.randrange(256),) * 3)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _store(report_db, **frames) -> ReportStore:
    # frames.dir named: a store on a database server keeps its frames where it is told.
    return report_db.store(frames=FrameSettings(dir=report_db.tmp / "frames", **frames) if frames else None)


def _finish(store, *, key="", when=T0, station="st1", camera="cam1", verdict=OK, classes=(), image=None):
    report_id, _ = store.claim(key, "req")
    r = DefectReport(report_id=report_id, station=station, camera_id=camera, verdict=verdict, idempotency_key=key)
    for c in classes:
        r.defects.add(defect_class=c, severity="minor")
    r.created_time.FromDatetime(when)
    store.complete(r, image=image)
    return r


def test_failed_attempt_keeps_its_key_and_a_retry_links_to_it(report_db):
    store = _store(report_db)
    first, _ = store.claim("k", "req-1")
    store.fail(first, "stage 2 [3,5): UNAVAILABLE connection refused")
    retry, existing = store.claim("k", "req-2")
    assert existing is None and retry != first
    report = DefectReport(report_id=retry, idempotency_key="k")
    store.complete(report)
    assert report.previous_attempt_id == first
    assert store.get(retry).previous_attempt_id == first
    attempts = store.attempts("k")
    assert [(a.report_id, a.status) for a in attempts] == [(first, "failed"), (retry, "done")]
    assert attempts[0].reason == "stage 2 [3,5): UNAVAILABLE connection refused"
    assert attempts[1].previous_attempt_id == first
    # The finished retry answers further retries.
    assert store.claim("k", "req-3") == (retry, store.get(retry))


def test_restart_fails_rows_left_pending_with_the_reason(report_db):
    store = _store(report_db)
    crashed, _ = store.claim("key-x", "req")
    store.close()
    reopened = _store(report_db)
    assert reopened.is_pending(crashed)  # opening alone does not touch another gateway's rows
    assert reopened.recover_interrupted() == 1
    assert not reopened.is_pending(crashed)
    with pytest.raises(NotFound, match=RESTARTED):
        reopened.get(crashed)
    retry, existing = reopened.claim("key-x", "req-2")
    assert existing is None and retry != crashed
    assert [a.status for a in reopened.attempts("key-x")] == ["failed", "pending"]


def test_frames_are_content_addressed_with_thumbnails(report_db):
    store = _store(report_db, max_bytes=10 << 20, thumbnail_px=64)
    frame = _jpeg(1, 400)
    a = _finish(store, image=frame)
    b = _finish(store, image=frame)  # the same frame twice: one file
    full = store.image(a.report_id)
    assert full.state == inspection_pb2.IMAGE_STATE_STORED and full.data == frame
    assert (full.frame.media_type, full.frame.width, full.frame.height) == ("image/jpeg", 400, 400)
    assert store.image(b.report_id).frame.sha256 == full.frame.sha256
    thumb = store.image(a.report_id, thumbnail=True)
    assert max(Image.open(io.BytesIO(thumb.data)).size) == 64
    assert len([p for p in (report_db.tmp / "frames").rglob("*") if p.is_file()]) == 2  # frame + thumbnail
    without = _finish(store)
    assert store.image(without.report_id).state == inspection_pb2.IMAGE_STATE_NOT_STORED


def test_frames_beyond_the_byte_budget_are_pruned_oldest_first_and_reports_stay(report_db):
    frames = [_jpeg(i) for i in range(6)]
    sizes = [FrameFiles(report_db.tmp / "scratch").write(f).nbytes for f in frames]  # frame + thumbnail each
    store = _store(report_db, max_bytes=sum(sizes[3:]))
    reports = [_finish(store, image=f, when=T0 + timedelta(seconds=i)) for i, f in enumerate(frames)]
    states = [store.image(r.report_id).state for r in reports]
    assert states[:3] == [inspection_pb2.IMAGE_STATE_EXPIRED] * 3
    assert states[3:] == [inspection_pb2.IMAGE_STATE_STORED] * 3
    total = sum(p.stat().st_size for p in (report_db.tmp / "frames").rglob("*") if p.is_file())  # files on disk
    assert total == sum(sizes[3:])
    assert [r.report_id for r in store.list()[0]] == [r.report_id for r in reversed(reports)]
    assert store.image(reports[0].report_id).frame.sha256  # an expired frame still names its hash


def test_frames_older_than_max_age_are_pruned(report_db):
    store = _store(report_db, max_age_s=3600)
    old = _finish(store, image=_jpeg(7))
    store._db.execute("UPDATE frames SET stored_us = stored_us - 7200000000")  # as if stored two hours ago
    fresh = _finish(store, image=_jpeg(8))
    assert store.image(old.report_id).state == inspection_pb2.IMAGE_STATE_EXPIRED
    assert store.image(fresh.report_id).state == inspection_pb2.IMAGE_STATE_STORED


def test_review_is_its_own_record_and_filters_find_reviewed_and_disagreed(report_db):
    store = _store(report_db)
    agreed = _finish(store, verdict=DEFECT, classes=["Scratch"])
    overridden = _finish(store, verdict=OK, when=T0 + timedelta(seconds=1))
    untouched = _finish(store, when=T0 + timedelta(seconds=2))
    r1 = store.review(agreed.report_id, DEFECT, [], "right", "ann", "operator")
    assert r1.agrees and list(r1.defect_classes) == ["scratch"]
    r2 = store.review(overridden.report_id, DEFECT, ["dent"], "missed a dent", "bob", "admin")
    assert not r2.agrees and r2.model_verdict == OK
    got = store.get(overridden.report_id)
    assert got.verdict == OK  # the model's report is never rewritten
    assert (got.review.verdict, got.review.reviewer, got.review.comment) == (DEFECT, "bob", "missed a dent")

    def ids(**kw):
        return {r.report_id for r in store.list(**kw)[0]}

    assert ids(review=inspection_pb2.REVIEW_FILTER_REVIEWED) == {agreed.report_id, overridden.report_id}
    assert ids(review=inspection_pb2.REVIEW_FILTER_UNREVIEWED) == {untouched.report_id}
    assert ids(review=inspection_pb2.REVIEW_FILTER_DISAGREED) == {overridden.report_id}
    # A second review replaces the first as the report's state: now it agrees.
    store.review(overridden.report_id, OK, [], "on second look fine", "bob", "admin")
    assert ids(review=inspection_pb2.REVIEW_FILTER_DISAGREED) == set()
    assert store._db.execute("SELECT COUNT(*) FROM reviews").fetchone()[0] == 3


@pytest.mark.parametrize(
    "verdict, classes, comment, match",
    [(UNCERTAIN, [], "", "VERDICT_OK or VERDICT_DEFECT"), (OK, ["dent"], "", "no defect classes"),
     (DEFECT, ["x" * 200], "", "at most"), (DEFECT, [], "c" * 3000, "comment")],
)  # fmt: skip
def test_bad_review_is_invalid_input(report_db, verdict, classes, comment, match):
    store = _store(report_db)
    r = _finish(store)
    with pytest.raises(InvalidInput, match=match):
        store.review(r.report_id, verdict, classes, comment, "ann", "operator")


def test_list_filters_by_camera_and_defect_class(report_db):
    store = _store(report_db)
    a = _finish(store, camera="c1", verdict=DEFECT, classes=["porosity", "scratch"])
    b = _finish(store, camera="c2", verdict=DEFECT, classes=["Porosity"], when=T0 + timedelta(seconds=1))
    _finish(store, camera="c1", when=T0 + timedelta(seconds=2))

    def ids(**kw):
        return [r.report_id for r in store.list(**kw)[0]]

    assert ids(defect_class="porosity") == [b.report_id, a.report_id]
    assert ids(defect_class="SCRATCH") == [a.report_id]
    assert ids(defect_class="porosity", camera_id="c2") == [b.report_id]
    # The fields are there for SQL too (SQLite's JSON1, PostgreSQL's jsonb).
    json_query = {
        "sqlite": "SELECT COUNT(*) FROM reports, json_each(reports.fields, '$.defects') d "
        "WHERE json_extract(d.value, '$.defect_class') = 'porosity'",
        "postgres": "SELECT COUNT(*) FROM reports, jsonb_array_elements(reports.fields::jsonb -> 'defects') d "
        "WHERE d ->> 'defect_class' = 'porosity'",
    }[report_db.backend]
    assert store._db.execute(json_query).fetchone()[0] == 1  # 'Porosity' as the model wrote it is case-preserved


def test_aggregates_equal_counts_from_list_on_500_reports(report_db):
    store = _store(report_db)
    rng = random.Random(17)
    classes = ["porosity", "scratch", "dent", "crack"]
    for _ in range(500):
        verdict = rng.choice([OK, OK, DEFECT, UNCERTAIN])
        picked = rng.sample(classes, rng.randint(1, 2)) if verdict == DEFECT else []
        when = T0 + timedelta(seconds=rng.randrange(3 * 86400))
        _finish(store, station=f"station-{rng.randint(1, 4)}", verdict=verdict, classes=picked, when=when)
    listed, token = [], ""
    while True:
        page, token = store.list(page_size=500, page_token=token)
        listed += page
        if not token:
            break
    assert len(listed) == 500
    bucket = 8 * 3600
    expected_verdicts, expected_classes = Counter(), Counter()
    for r in listed:
        start = r.created_time.seconds // bucket * bucket
        expected_verdicts[r.station, start, inspection_pb2.Verdict.Name(r.verdict)] += 1
        for c in {d.defect_class for d in r.defects}:
            expected_classes[r.station, start, c] += 1
    rows = store.aggregate(bucket_s=bucket)
    got_verdicts = Counter({(r["station"], r["bucket_start_us"] // 10**6, v): n for r in rows
                            for v, n in r["by_verdict"].items()})  # fmt: skip
    got_classes = Counter({(r["station"], r["bucket_start_us"] // 10**6, c): n for r in rows
                           for c, n in r["by_class"].items()})  # fmt: skip
    assert got_verdicts == expected_verdicts
    assert got_classes == expected_classes
    assert sum(r["total"] for r in rows) == 500
    # One bucket, one station, a time range: the same as a filtered list.
    since, until = T0 + timedelta(hours=10), T0 + timedelta(hours=40)
    (one,) = store.aggregate(station="station-2", since=since, until=until)
    in_range = [r for r in listed if r.station == "station-2" and since <= r.created_time.ToDatetime(UTC) < until]
    assert one["total"] == len(in_range)
    assert one["by_verdict"].get("VERDICT_DEFECT", 0) == sum(r.verdict == DEFECT for r in in_range)


_FIRST_RELEASE_SCHEMA = """
CREATE TABLE reports (
    report_id TEXT PRIMARY KEY, idempotency_key TEXT UNIQUE, request_id TEXT NOT NULL DEFAULT '',
    station TEXT NOT NULL DEFAULT '', part TEXT NOT NULL DEFAULT '', verdict INTEGER NOT NULL DEFAULT 0,
    created_us INTEGER NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', report BLOB
);
CREATE INDEX reports_by_time ON reports (status, created_us DESC, report_id DESC);
CREATE INDEX reports_by_station ON reports (station, created_us DESC);
CREATE INDEX reports_by_part ON reports (part, created_us DESC);
"""


def test_database_of_the_first_release_migrates_and_lists_the_same_reports(tmp_path):
    path = tmp_path / "old.sqlite"
    old = []
    with sqlite3.connect(path) as db:  # written exactly as the first release's store wrote it
        db.executescript(_FIRST_RELEASE_SCHEMA)
        for i in range(30):
            r = DefectReport(report_id=f"{i:032x}", station=f"s{i % 3}", part="p", camera_id=f"cam{i % 2}",
                             verdict=DEFECT if i % 4 == 0 else OK, idempotency_key=f"k{i}")  # fmt: skip
            if r.verdict == DEFECT:
                r.defects.add(defect_class="porosity")
            r.created_time.FromDatetime(T0 + timedelta(minutes=i))
            created_us = r.created_time.ToMicroseconds()
            db.execute(
                "INSERT INTO reports VALUES (?, ?, 'req', ?, ?, ?, ?, 'done', '', ?)",
                (r.report_id, r.idempotency_key, r.station, r.part, r.verdict, created_us, r.SerializeToString()),
            )
            old.append(r)
        db.execute("INSERT INTO reports VALUES ('f' , 'kf', 'req', '', '', 0, 1, 'failed', 'inspection failed', NULL)")
    with ReportStore(path) as store:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        listed, _ = store.list(page_size=100)
        assert listed == sorted(old, key=lambda r: r.created_time.ToMicroseconds(), reverse=True)
        assert {r.report_id for r in store.list(defect_class="porosity")[0]} == {
            r.report_id for r in old if r.verdict == DEFECT
        }
        assert len(store.list(camera_id="cam1", page_size=100)[0]) == 15
        assert store.claim("k3", "again") == (old[3].report_id, old[3])
        assert store.attempts("kf")[0].reason == "inspection failed"
    with ReportStore(path) as again:  # opening a migrated database changes nothing
        assert again.list(page_size=100)[0] == listed


@pytest.mark.parametrize(
    "token",
    ["WzExODA1OTE2MjA3MTc0MTEzMDM0MjQsIngiXQ", "W" * 300],  # [2**70, "x"]; a deeply nested array's start
)
def test_out_of_range_or_oversized_page_token_is_invalid_input(report_db, token):
    store = _store(report_db)
    with pytest.raises(InvalidInput, match="page_token"):
        store.list(page_token=token)


def test_huge_report_id_is_invalid_input_without_echo(report_db):
    store = _store(report_db)
    with pytest.raises(InvalidInput) as err:
        store.get("x" * 1_000_000)
    assert len(str(err.value)) < 200
