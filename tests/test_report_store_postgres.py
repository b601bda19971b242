"""The report store on a real PostgreSQL shared by a gateway pair: two processes claiming the same keys, restarts
that fail only their own rows, a migration from an empty database, settings and a startup error that keeps the
password to itself."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time

import pytest
from bench_scripts import run_bench
from pg_testing import unavailable_reason

from edgeinspect.errors import InvalidInput, NotFound, Unavailable
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.store.claims import RESTARTED
from edgeinspect.services.store.database import PostgresDatabase, open_database
from edgeinspect.services.store.schema import SCHEMA_VERSION
from edgeinspect.services.store.settings import StoreBackend, StoreSettings
from edgeinspect.v1.inspection_pb2 import VERDICT_OK, DefectReport

# One gateway of a pair: claims every key, runs (completes) those it wins, and waits out keys the other gateway is
# running (Unavailable), as a client retrying by key would. Prints {key: report_id} it ended with.
_GATEWAY = """
import json, sys, time
from edgeinspect.errors import Unavailable
from edgeinspect.services.store.database import PostgresDatabase
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.v1.inspection_pb2 import VERDICT_OK, DefectReport
dsn, owner, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = ReportStore(PostgresDatabase(dsn), owner=owner)
print("ready", flush=True)
sys.stdin.readline()  # the test releases both gateways at once
answers, won = {}, 0
for i in range(n):
    key = f"key-{i:03d}"
    while key not in answers:
        try:
            report_id, existing = store.claim(key, owner)
        except Unavailable:
            time.sleep(0.01)
            continue
        if existing is None:
            store.complete(DefectReport(report_id=report_id, idempotency_key=key, station=owner))
            won += 1
        answers[key] = report_id
print(json.dumps({"answers": answers, "won": won}), flush=True)
"""


def test_two_gateway_processes_claiming_the_same_100_keys_store_one_report_per_key(postgres_server):
    dsn = postgres_server.fresh_schema_dsn()
    ReportStore(PostgresDatabase(dsn)).close()  # migrated once, so both start claiming at the same moment
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _GATEWAY, dsn, owner, "100"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for owner in ("gw-a", "gw-b")
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    a, b = results
    assert a["answers"] == b["answers"]  # both gateways answer every key with the same report
    assert a["won"] + b["won"] == 100
    with ReportStore(PostgresDatabase(dsn)) as store:
        rows = store._db.execute("SELECT idempotency_key, status, owner, station FROM reports").fetchall()
        assert len(rows) == 100 and {r[1] for r in rows} == {"done"}
        assert sorted(r[0] for r in rows) == sorted(a["answers"])
        assert all(r[2] == r[3] for r in rows)  # the report was completed by the gateway whose claim won
        for key, report_id in a["answers"].items():
            assert store.get(report_id).idempotency_key == key


def test_a_restart_fails_only_the_pending_rows_this_gateway_owned(postgres_server):
    dsn = postgres_server.fresh_schema_dsn()
    a = ReportStore(PostgresDatabase(dsn), owner="gw-a")
    b = ReportStore(PostgresDatabase(dsn), owner="gw-b")
    a_row, _ = a.claim("key-a", "req")
    b_row, _ = b.claim("key-b", "req")
    a.close()  # gw-a crashed mid-inspection and comes back
    restarted = ReportStore(PostgresDatabase(dsn), owner="gw-a")
    assert restarted.recover_interrupted() == 1
    with pytest.raises(NotFound, match=RESTARTED):
        restarted.get(a_row)
    assert b.is_pending(b_row)  # gw-b is still running its inspection
    restarted.close()
    b.close()


def test_a_key_pending_on_the_other_gateway_is_unavailable_with_pushback(postgres_server):
    dsn = postgres_server.fresh_schema_dsn()
    with ReportStore(PostgresDatabase(dsn), owner="gw-a") as a, ReportStore(PostgresDatabase(dsn), owner="gw-b") as b:
        report_id, _ = a.claim("k", "req")
        with pytest.raises(Unavailable, match="running on gateway 'gw-a'") as err:
            b.claim("k", "retry")
        assert err.value.retry_after_ms == 1000
        assert a.claim("k", "retry") == (report_id, None)  # its own gateway sees its own run, as on SQLite
        a.complete(DefectReport(report_id=report_id, idempotency_key="k"))
        assert b.claim("k", "retry") == (report_id, a.get(report_id))


def test_a_silent_gateways_key_is_taken_over_and_its_late_answer_is_refused(postgres_server):
    """Gateway pair: gw-a claims a key and stops beating (killed, or frozen); within its lease gw-b is told to retry,
    after it gw-b runs the key itself. Should gw-a wake up and finish, its answer is refused: one report per key."""
    dsn = postgres_server.fresh_schema_dsn()
    lease = 0.6
    with (
        ReportStore(PostgresDatabase(dsn), owner="gw-a", owner_lease_s=lease) as a,
        ReportStore(PostgresDatabase(dsn), owner="gw-b", owner_lease_s=lease) as b,
    ):
        a.heartbeat()
        b.heartbeat()
        a_row, _ = a.claim("k", "req")
        with pytest.raises(Unavailable, match="running on gateway 'gw-a'") as err:
            b.claim("k", "retry")
        assert 200 <= err.value.retry_after_ms <= 1000  # pushback: about what is left of gw-a's lease
        time.sleep(lease + 0.2)
        b.heartbeat()  # gw-b is alive, gw-a has been silent past its lease
        b_row, done = b.claim("k", "retry")
        assert b_row != a_row and done is None
        b.complete(DefectReport(report_id=b_row, idempotency_key="k", verdict=VERDICT_OK))
        with pytest.raises(Unavailable, match="taken over"):
            a.complete(DefectReport(report_id=a_row, idempotency_key="k", verdict=VERDICT_OK))
        attempts = b.attempts("k")
        assert [(x.report_id, x.status) for x in attempts if x.status == "done"] == [(b_row, "done")]
        assert b.get(b_row).previous_attempt_id == a_row
        assert a.claim("k", "again") == (b_row, b.get(b_row))  # both gateways answer the key with gw-b's report


def test_an_empty_database_migrates_once_when_gateways_start_together(postgres_server):
    dsn = postgres_server.fresh_schema_dsn()
    stores, errors = [], []
    barrier = threading.Barrier(4)

    def start():
        barrier.wait()
        try:
            stores.append(ReportStore(PostgresDatabase(dsn)))
        except Exception as exc:  # noqa: BLE001 (the assertion below names it)
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    db = stores[0]._db
    assert db.schema_version() == SCHEMA_VERSION
    assert db.execute("SELECT COUNT(*) FROM report_schema").fetchone()[0] == 1
    tables = {r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
    assert tables == {"reports", "report_classes", "reviews", "frames", "report_schema", "outbox", "gateways", "banks"}
    sql = "SELECT column_name FROM information_schema.columns WHERE table_name = 'reports'"
    columns = {r[0] for r in db.execute(sql)}
    assert {"owner", "idempotency_key", "created_us", "report"} <= columns
    for s in stores:
        s.close()


def test_a_wrong_password_is_a_clear_startup_error_without_the_password(postgres_server, caplog):
    wrong = "not-the-password-0451"
    dsn = postgres_server.dsn(password=wrong)
    cfg = StoreSettings(backend=StoreBackend.postgres, dsn=dsn)
    with caplog.at_level(logging.DEBUG), pytest.raises(Unavailable) as err:
        open_database(cfg, postgres_server.root / "unused.sqlite")
    message = str(err.value)
    assert "cannot connect to the report database" in message and "password authentication failed" in message
    assert f"user={postgres_server.dsn().split('user=')[1].split()[0]}" in message  # says who it tried as
    assert wrong not in message and wrong not in caplog.text
    assert wrong not in repr(cfg) and wrong not in str(cfg)


def test_a_malformed_dsn_is_refused_without_echoing_it():
    with pytest.raises(InvalidInput, match="does not parse") as err:
        PostgresDatabase("host=x password=s3cret-value dbname")
    assert "s3cret" not in str(err.value)


def test_store_settings_from_the_environment_and_from_a_file(tmp_path, monkeypatch):
    base = {"checkpoint": tmp_path, "vision": "127.0.0.1:1", "stages": ["127.0.0.1:2"]}
    assert GatewaySettings(**base).store.backend == StoreBackend.sqlite  # the embedded default, unchanged
    assert GatewaySettings(**base).store.owner() == ""
    monkeypatch.setenv("EDGEINSPECT_STORE__BACKEND", "postgres")
    monkeypatch.setenv("EDGEINSPECT_STORE__DSN", "postgresql://edge:pw-from-env@db:5432/reports")
    monkeypatch.setenv("EDGEINSPECT_STORE__INSTANCE", "gateway-0")
    cfg = GatewaySettings(**base)
    assert cfg.store.read_dsn().endswith("pw-from-env@db:5432/reports") and cfg.store.owner() == "gateway-0"
    assert "pw-from-env" not in repr(cfg)
    monkeypatch.delenv("EDGEINSPECT_STORE__DSN")
    secret = tmp_path / "dsn"
    secret.write_text("host=db dbname=reports user=edge password=pw-from-file\n")
    cfg = GatewaySettings(**base, store={"backend": "postgres", "dsn_file": secret})
    assert cfg.store.read_dsn() == "host=db dbname=reports user=edge password=pw-from-file"
    with pytest.raises(ValueError, match="exactly one of store.dsn and store.dsn_file"):
        GatewaySettings(**base, store={"backend": "postgres"})


def test_writers_bench_compares_both_backends(tmp_path):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    result = run_bench("report_store_bench", "--writers", "2", "--per-writer", "3", out=tmp_path / "w.json")
    assert set(result["results"]) == {
        f"{backend}/{mode}"
        for backend in ("sqlite_full", "postgres")
        for mode in ("store_per_writer", "one_store_shared")
    }
    assert all(r["reports_per_s"] > 0 and r["complete_commit_ms"]["p99"] > 0 for r in result["results"].values())


def test_a_gateway_process_with_a_wrong_database_password_exits_with_one_clear_line(postgres_server, tmp_path):
    wrong = "wrong-pw-7731"
    env = {
        **os.environ,
        "EDGEINSPECT_CHECKPOINT": str(tmp_path / "ckpt"),
        "EDGEINSPECT_VISION": "127.0.0.1:1",
        "EDGEINSPECT_STAGES": '["127.0.0.1:2"]',
        "EDGEINSPECT_DB_PATH": str(tmp_path / "reports.sqlite"),
        "EDGEINSPECT_ALLOW_UNAUTHENTICATED": "true",
        "EDGEINSPECT_STORE__BACKEND": "postgres",
        "EDGEINSPECT_STORE__DSN": postgres_server.dsn(password=wrong),
    }
    proc = subprocess.run([sys.executable, "-m", "edgeinspect.services.gateway"], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "gateway cannot start: cannot connect to the report database" in output
    assert "password authentication failed" in output and wrong not in output
