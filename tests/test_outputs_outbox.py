"""The transactional outbox on both report databases (SQLite, a real PostgreSQL): a store process SIGKILLed inside
the report's transaction leaves neither the report nor its outbox rows, one killed just after the commit leaves both;
two drainers on one PostgreSQL deliver each row once, in order; a dead drainer's row is taken over after its lease;
the per-output files of older releases are imported once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest
from line_peers import SECRET, Receiver

from edgeinspect.faults import ENV
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.services.outputs.fanout import Outputs
from edgeinspect.services.outputs.outbox import Outbox, OutboxWriter
from edgeinspect.services.store.database import PostgresDatabase, SQLiteDatabase

pytestmark = pytest.mark.timeout(120)

# One gateway's store: claims a key and completes its report for the line (two outputs), unless its fault point
# SIGKILLs it first.
_COMPLETE = """
import sys
from edgeinspect.services.store.database import PostgresDatabase
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.outputs.outbox import OutboxWriter
from edgeinspect.v1.inspection_pb2 import DefectReport
where, key = sys.argv[1], sys.argv[2]
db = where if where.endswith(".sqlite") else PostgresDatabase(where)
store = ReportStore(db, outbox=OutboxWriter(("mqtt", "hook"), 100, False))
report_id, _ = store.claim(key, "req")
print(report_id, flush=True)
store.complete(DefectReport(report_id=report_id, idempotency_key=key, station="st-1"), to_line=True)
"""


def _where(report_db) -> str:
    return str(report_db.tmp / "reports.sqlite") if report_db.backend == "sqlite" else report_db.dsn


def _open(report_db):
    if report_db.backend == "sqlite":
        return SQLiteDatabase(report_db.tmp / "reports.sqlite")
    return PostgresDatabase(report_db.dsn)


@pytest.mark.parametrize("fault", ["report_in_transaction", "report_committed"])
def test_outbox_rows_exist_iff_the_report_is_committed(report_db, fault):
    report_db.store().close()  # migrated before the child starts
    child = subprocess.run(
        [sys.executable, "-c", _COMPLETE, _where(report_db), f"key-{fault}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, ENV: fault},
    )
    assert child.returncode == -9, child.stderr  # SIGKILLed at its fault point
    report_id = child.stdout.split()[0]
    db = _open(report_db)
    try:
        status = db.execute("SELECT status FROM reports WHERE report_id = ?", (report_id,)).fetchone()[0]
        rows = db.execute("SELECT output FROM outbox WHERE report_id = ? ORDER BY output", (report_id,)).fetchall()
    finally:
        db.close()
    if fault == "report_in_transaction":
        assert status == "pending" and rows == []  # neither the report nor a line result
    else:
        assert status == "done" and [r for (r,) in rows] == ["hook", "mqtt"]  # both, one row per output


def _result_rows(db, n: int, station: str = "st-1") -> list[str]:
    from edgeinspect.services.outputs.result import LineResult

    writer = OutboxWriter(("hook",), 1000, False)
    outbox = Outbox(db, "writer", 30.0)
    ids = [f"r{i:03d}" for i in range(n)]
    for rid in ids:
        outbox.put(writer, LineResult(rid, station, "cam", "P", "OK", (), "", None, 1.0e9, None))
    return ids


def test_two_drainers_on_one_postgres_deliver_each_row_once_in_order(postgres_server):
    dsn = postgres_server.fresh_schema_dsn()
    from edgeinspect.services.gateway.reports.store import ReportStore

    ReportStore(PostgresDatabase(dsn)).close()
    ids = _result_rows(PostgresDatabase(dsn), 30)
    receiver = Receiver(delay_s=0.01)
    cfg = OutputsConfig(webhooks=[{"url": receiver.url, "secret": SECRET, "name": "hook"}], poll_s=0.05)
    pair = [Outputs(cfg, lambda: PostgresDatabase(dsn), holder=h) for h in ("gw-a", "gw-b")]
    try:
        deadline = time.monotonic() + 30
        while len(receiver.delivered()) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(o.wait_idle(5) for o in pair)
    finally:
        for o in pair:
            o.close(drain_s=0)
        receiver.close()
    assert receiver.delivered() == ids  # each once, oldest first, across both gateways


def test_a_dead_drainers_row_is_taken_over_after_its_lease(postgres_server):
    dsn = postgres_server.fresh_schema_dsn()
    from edgeinspect.services.gateway.reports.store import ReportStore

    ReportStore(PostgresDatabase(dsn)).close()
    ids = _result_rows(PostgresDatabase(dsn), 2)
    dead = Outbox(PostgresDatabase(dsn), "gw-dead", lease_s=1.0)
    assert dead.claim("hook").report_id == "r000"  # ... and it never acks: the gateway died
    receiver = Receiver()
    cfg = OutputsConfig(webhooks=[{"url": receiver.url, "secret": SECRET, "name": "hook"}], poll_s=0.1)
    live = Outputs(cfg, lambda: PostgresDatabase(dsn), holder="gw-live")
    try:
        time.sleep(0.5)
        assert receiver.delivered() == []  # the lease still runs: nothing overtakes the head row
        deadline = time.monotonic() + 10
        while len(receiver.delivered()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        live.close(drain_s=0)
        receiver.close()
        dead.close()
    assert receiver.delivered() == ids


def test_results_left_in_an_old_per_output_outbox_file_are_imported_once_and_sent(tmp_path):
    folder = tmp_path / "outbox"
    folder.mkdir()
    with sqlite3.connect(folder / "hook.sqlite") as old:  # the previous release's format
        old.execute("CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE NOT NULL, "
                    "payload BLOB NOT NULL)")  # fmt: skip
        for rid in ("old-1", "old-2"):
            old.execute("INSERT INTO outbox (key, payload) VALUES (?, ?)", (rid, f'{{"report_id":"{rid}"}}'.encode()))
    receiver = Receiver()
    cfg = OutputsConfig(webhooks=[{"url": receiver.url, "secret": SECRET, "name": "hook"}])
    outputs = Outputs.local(cfg, folder)
    try:
        assert not (folder / "hook.sqlite").exists()
        assert outputs.wait_idle(10)
    finally:
        outputs.close()
        receiver.close()
    assert receiver.delivered() == ["old-1", "old-2"]
