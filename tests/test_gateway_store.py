"""The gateway's report store on SQLite and PostgreSQL: round trip, idempotency under concurrency, filters, keyset
pages, durability."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest

from edgeinspect.errors import InvalidInput, NotFound
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.v1 import inspection_pb2
from edgeinspect.v1.inspection_pb2 import DefectReport

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def store(report_db):
    s = report_db.store()
    yield s
    s.close()


def _report(report_id: str, *, when: datetime = T0, station="st1", part="p1", verdict=inspection_pb2.VERDICT_OK):
    r = DefectReport(report_id=report_id, station=station, part=part, verdict=verdict, description="fine")
    r.created_time.FromDatetime(when)
    return r


def _finish(store: ReportStore, key: str = "", **kw) -> DefectReport:
    report_id, _ = store.claim(key, "req")
    report = _report(report_id, **kw)
    report.idempotency_key = key
    store.complete(report)
    return report


def _row_count(store: ReportStore, key=None) -> int:
    if key is None:
        return store._db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
    return store._db.execute("SELECT COUNT(*) FROM reports WHERE idempotency_key = ?", (key,)).fetchone()[0]


def test_complete_then_get_returns_the_same_report(store):
    report_id, existing = store.claim("k1", "req-1")
    assert existing is None and len(report_id) == 32
    report = _report(report_id, verdict=inspection_pb2.VERDICT_DEFECT)
    report.defects.add(defect_class="scratch", severity="minor", location="edge", evidence="line")
    report.raw_text = "Verdict: DEFECT"
    store.complete(report)
    assert store.get(report_id) == report
    assert not store.is_pending(report_id)


def test_sqlite_store_uses_wal_and_full_sync(tmp_path):
    store = ReportStore(tmp_path / "db" / "reports.sqlite")
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_complete_sets_created_time_when_unset(store):
    report_id, _ = store.claim("", "req")
    report = DefectReport(report_id=report_id)
    store.complete(report)
    assert report.HasField("created_time")
    assert store.get(report_id).created_time == report.created_time
    assert abs(report.created_time.ToDatetime(UTC) - datetime.now(UTC)) < timedelta(minutes=5)


def test_same_key_twice_gives_the_same_report_and_one_row(store):
    first = _finish(store, "key-a")
    report_id, existing = store.claim("key-a", "req-retry")
    assert report_id == first.report_id
    assert existing == first
    assert _row_count(store) == 1


def test_claim_of_a_pending_key_returns_its_id_without_a_report(store):
    report_id, _ = store.claim("key-b", "req-1")
    again, existing = store.claim("key-b", "req-2")
    assert (again, existing) == (report_id, None)
    assert store.is_pending(report_id)
    assert _row_count(store) == 1


def test_empty_key_always_admits_a_new_row(store):
    ids = {store.claim("", "req")[0] for _ in range(3)}
    assert len(ids) == 3
    assert _row_count(store) == 3


def test_concurrent_claims_of_one_key_make_one_row(store):
    barrier = threading.Barrier(8)
    results = []

    def claim():
        barrier.wait()
        results.append(store.claim("hot-key", "req")[0])

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 8
    assert _row_count(store) == 1


def test_concurrent_claims_from_separate_connections_make_one_row(report_db):
    # Separate ReportStore objects share nothing but the database, as two gateway processes would.
    stores = [report_db.store() for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    results = []

    def claim(s):
        barrier.wait()
        results.append(s.claim("shared-key", "req")[0])

    threads = [threading.Thread(target=claim, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == len(stores)
    assert _row_count(stores[0], "shared-key") == 1
    for s in stores:
        s.close()


def test_pending_report_is_not_returned_by_get_or_list(store):
    report_id, _ = store.claim("k", "req")
    with pytest.raises(NotFound, match="no report with id"):
        store.get(report_id)
    assert store.list() == ([], "")


def test_get_unknown_id_raises_not_found(store):
    with pytest.raises(NotFound, match="no report with id 'nope'"):
        store.get("nope")


def test_fail_keeps_the_key_and_lets_a_retry_run(store):
    report_id, _ = store.claim("k", "req-1")
    store.fail(report_id, "stage 1 unavailable")
    assert not store.is_pending(report_id)
    with pytest.raises(NotFound, match="stage 1 unavailable"):
        store.get(report_id)
    retry_id, existing = store.claim("k", "req-2")
    assert existing is None and retry_id != report_id
    assert store.is_pending(retry_id)
    assert _row_count(store, "k") == 2  # the failed attempt can still be found by its key


def test_fail_does_not_touch_a_finished_report(store):
    done = _finish(store, "k")
    store.fail(done.report_id, "late failure")
    assert store.get(done.report_id) == done
    assert store.claim("k", "req")[0] == done.report_id


def test_abandoned_pending_key_is_taken_over_after_the_ttl(report_db):
    s = report_db.store(pending_ttl_s=0.0)
    old_id, _ = s.claim("k", "req-1")
    new_id, existing = s.claim("k", "req-2")
    assert existing is None and new_id != old_id
    assert not s.is_pending(old_id) and s.is_pending(new_id)
    s.close()


def test_list_filters_by_station_part_verdict_and_time(store):
    defect = inspection_pb2.VERDICT_DEFECT
    a = _finish(store, when=T0, station="s1", part="p1")
    b = _finish(store, when=T0 + timedelta(hours=1), station="s2", part="p1", verdict=defect)
    c = _finish(store, when=T0 + timedelta(hours=2), station="s1", part="p2", verdict=defect)

    def ids(**kw):
        return [r.report_id for r in store.list(**kw)[0]]

    assert ids() == [c.report_id, b.report_id, a.report_id]
    assert ids(station="s1") == [c.report_id, a.report_id]
    assert ids(part="p1") == [b.report_id, a.report_id]
    assert ids(verdict=defect) == [c.report_id, b.report_id]
    assert ids(station="s1", verdict=defect) == [c.report_id]
    assert ids(since=T0 + timedelta(hours=1)) == [c.report_id, b.report_id]
    assert ids(until=T0 + timedelta(hours=1)) == [a.report_id]
    # A naive datetime is UTC.
    assert ids(since=(T0 + timedelta(minutes=30)).replace(tzinfo=None), until=T0 + timedelta(hours=2)) == [b.report_id]
    assert ids(station="nowhere") == []


def test_pages_cover_every_report_once_in_a_stable_order(store):
    # Three reports per second: the report_id tie-break must keep pages from overlapping or skipping.
    made = [_finish(store, when=T0 + timedelta(seconds=i // 3)) for i in range(23)]
    expected = [r.report_id for r in sorted(made, key=lambda r: (r.created_time.ToMicroseconds(), r.report_id))]
    expected.reverse()
    seen, token, pages = [], "", 0
    while True:
        page, token = store.list(page_size=5, page_token=token)
        pages += 1
        seen += [r.report_id for r in page]
        if not token:
            break
    assert pages == 5 and [len(p) for p in (seen[:5], seen[20:])] == [5, 3]
    assert seen == expected


def test_exactly_full_last_page_ends_with_an_empty_token(store):
    for i in range(10):
        _finish(store, when=T0 + timedelta(seconds=i))
    first, token = store.list(page_size=5)
    second, token2 = store.list(page_size=5, page_token=token)
    assert len(first) == len(second) == 5 and token and token2 == ""


def test_page_size_zero_means_fifty(store):
    for i in range(51):
        _finish(store, when=T0 + timedelta(seconds=i))
    page, token = store.list(page_size=0)
    assert len(page) == 50 and token


@pytest.mark.parametrize("size", [-1, 501])
def test_bad_page_size_is_invalid_input(store, size):
    with pytest.raises(InvalidInput, match="page_size"):
        store.list(page_size=size)


@pytest.mark.parametrize("token", ["%%%", "bm90IGpzb24", "WyJ4IiwxXQ", "e30"])
def test_malformed_page_token_is_invalid_input(store, token):
    with pytest.raises(InvalidInput, match="page_token"):
        store.list(page_token=token)


def test_unknown_verdict_filter_is_invalid_input(store):
    with pytest.raises(InvalidInput, match="verdict"):
        store.list(verdict=42)


_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.v1.inspection_pb2 import DefectReport
store = ReportStore(Path(sys.argv[1]))
report_id, _ = store.claim("durable-key", "req")
store.complete(DefectReport(report_id=report_id, station="st9", description="kept"))
print("acked", report_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_acknowledged_report_survives_kill_9(tmp_path):
    path = tmp_path / "reports.sqlite"
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    word, report_id = proc.stdout.split()
    assert word == "acked"
    assert os.path.exists(str(path) + "-wal")  # killed before a checkpoint: the report lives in the WAL
    with ReportStore(path) as reopened:
        report = reopened.get(report_id)
        assert (report.station, report.description) == ("st9", "kept")
        assert reopened.claim("durable-key", "req-2") == (report_id, report)


def test_a_unique_prefix_of_a_report_id_finds_it_and_an_ambiguous_one_names_the_candidates(store):
    ids = ["abc1230000000000000000000000000a", "abc1230000000000000000000000000b", "f00d" + "0" * 28]
    for report_id in ids:
        store.complete(DefectReport(report_id=report_id, station="st"))
    assert store.get("f00d").report_id == ids[2]  # `reports list` shows 12 characters: fewer do, while unique
    assert store.get(ids[0][:31] + "a").report_id == ids[0]
    with pytest.raises(InvalidInput, match="ambiguous") as ambiguous:
        store.get("abc123")
    assert ids[0][:16] in str(ambiguous.value) and "give more characters" in str(ambiguous.value)
    with pytest.raises(NotFound, match="no report with id 'abd'"):
        store.get("abd")
