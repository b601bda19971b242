"""Store hygiene across a real crash: kill -9 of the gateway mid-inspection, restart from its run config: no row is
left pending, the crashed attempt says why and keeps its key, and a retry with the key runs and names it."""

from __future__ import annotations

import http.cookiejar
import sqlite3
import threading
import time
import urllib.parse
import urllib.request
import uuid

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.services.store.claims import RESTARTED
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

pytestmark = pytest.mark.e2e


def _rows(db_path, key: str) -> list[tuple]:
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT report_id, status, reason FROM reports WHERE idempotency_key = ? ORDER BY created_us", (key,)
        ).fetchall()


def test_gateway_killed_mid_inspection_leaves_no_pending_row_and_the_key_retries(reviewing_stack):
    stack = reviewing_stack.stack
    db_path = stack.opts.workdir / "reports.sqlite"
    md = [("authorization", f"Bearer {reviewing_stack.admin}")]
    key = f"kill9-{uuid.uuid4().hex}"
    image = asset_path("part_dent.jpg").read_bytes()
    outcome: list[object] = []

    def inspect() -> None:
        with grpc.insecure_channel(stack.gateway_address) as channel:
            stub = inspection_pb2_grpc.InspectionServiceStub(channel)
            request = inspection_pb2.InspectRequest(image=image, station="st-crash", idempotency_key=key,
                                                    max_new_tokens=1024)  # fmt: skip
            try:
                outcome.append(stub.Inspect(request, metadata=md, timeout=120))
            except grpc.RpcError as exc:
                outcome.append(exc.code())

    # A console user logged in before the crash (the console is a client of the gateway like any other).
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    login = urllib.parse.urlencode({"token": reviewing_stack.reader, "next": "/stations"}).encode()
    assert opener.open(f"{stack.console_url}/login", data=login, timeout=30).status == 200

    caller = threading.Thread(target=inspect)
    caller.start()
    deadline = time.monotonic() + 60
    while not (rows := _rows(db_path, key)) or rows[-1][1] != "pending":
        assert time.monotonic() < deadline, "the inspection never got admitted"
        time.sleep(0.01)
    crashed_id = rows[-1][0]
    stack.kill("gateway")  # SIGKILL while the row is pending
    caller.join(60)
    assert outcome and outcome[0] == grpc.StatusCode.UNAVAILABLE, outcome
    assert _rows(db_path, key) == [(crashed_id, "pending", "")]  # what the crash left behind
    live = opener.open(f"{stack.console_url}/stations/live", timeout=30).read().decode()
    assert "gateway unavailable since" in live and "No reports yet" not in live  # stale, and says so

    stack.restart("gateway")
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        assert db.execute("SELECT COUNT(*) FROM reports WHERE status = 'pending'").fetchone()[0] == 0
    assert _rows(db_path, key) == [(crashed_id, "failed", RESTARTED)]

    with grpc.insecure_channel(stack.gateway_address) as channel:
        stub = inspection_pb2_grpc.InspectionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetReport(inspection_pb2.GetReportRequest(report_id=crashed_id), metadata=md, timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and RESTARTED in err.value.details()
        retry = stub.Inspect(
            inspection_pb2.InspectRequest(image=image, station="st-crash", idempotency_key=key, max_new_tokens=4),
            metadata=md,
            timeout=300,
        )
    assert retry.report_id != crashed_id and retry.previous_attempt_id == crashed_id
    assert [r[1] for r in _rows(db_path, key)] == ["failed", "done"]
