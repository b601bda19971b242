"""SIGTERM to a gateway with an inspection in flight: the inspection finishes within the grace or fails cleanly
(stored as failed, with the hop and the reason), the report store is closed (WAL checkpointed into the file), and
the process exits 0 before a launcher would SIGKILL it.

Real processes (vision, 2 stages, gateway) on loopback; the inspection is held in flight by SIGSTOP on the vision
node, which every inspection calls first (the anomaly gate's Score, then Encode).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import threading
import time
import uuid

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

pytestmark = pytest.mark.e2e

GRACE_S = 4.0  # the gateway's server.grace_s: in-flight calls get this long after SIGTERM
EXIT_BOUND_S = 10.0  # LocalStack.stop's SIGKILL timeout: a clean stop ends before it


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory):
    # PYTHONFAULTHANDLER: a gateway that hangs on its way out is sent SIGABRT and logs where every thread was.
    env = {"EDGEINSPECT_SERVER__GRACE_S": str(GRACE_S), "EDGEINSPECT_STRUCTURED_OUTPUT": "false",
           "PYTHONFAULTHANDLER": "1"}  # fmt: skip
    opts = StackOptions(workdir=tmp_path_factory.mktemp("shutdown"), checkpoint=tiny_checkpoint, stages=2,
                        extra_env=env)  # fmt: skip
    with LocalStack(opts) as s:
        yield s


def _rows(db_path, key: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        return db.execute(
            "SELECT report_id, status, reason FROM reports WHERE idempotency_key = ? ORDER BY created_us", (key,)
        ).fetchall()


def _inspect_in_flight(stack: LocalStack, key: str) -> tuple[threading.Thread, list[object]]:
    """Starts an inspection with the vision node stopped; returns once its row is pending (it is admitted)."""
    outcome: list[object] = []

    def inspect() -> None:
        with grpc.insecure_channel(stack.gateway_address) as channel:
            stub = inspection_pb2_grpc.InspectionServiceStub(channel)
            request = inspection_pb2.InspectRequest(image=asset_path("part_ok.jpg").read_bytes(), station="st-stop",
                                                    idempotency_key=key, max_new_tokens=4)  # fmt: skip
            md = [("authorization", f"Bearer {stack.api_token}")]
            try:
                outcome.append(stub.Inspect(request, metadata=md, timeout=120))
            except grpc.RpcError as exc:
                outcome.append(exc.code())

    caller = threading.Thread(target=inspect)
    caller.start()
    db_path = stack.opts.workdir / "reports.sqlite"
    deadline = time.monotonic() + 60
    while not (rows := _rows(db_path, key)) or rows[-1][1] != "pending":
        assert time.monotonic() < deadline, f"the inspection never got admitted: {rows}"
        time.sleep(0.02)
    return caller, outcome


def _exit_code(stack: LocalStack, t0: float) -> int:
    """The gateway's exit code once it ends, within EXIT_BOUND_S of t0 (its SIGTERM); else a failure showing where
    it hung."""
    role = stack.role("gateway")
    try:
        return role.proc.wait(max(0.1, t0 + EXIT_BOUND_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        role.proc.send_signal(signal.SIGABRT)
        role.proc.wait(10)
        pytest.fail(f"the gateway did not exit within {EXIT_BOUND_S} s of SIGTERM:\n{role.log_tail(80)}")


def _assert_store_closed(stack: LocalStack) -> None:
    for name in ("reports.sqlite", "shadow-reports.sqlite"):
        db_path = stack.opts.workdir / name
        wal = db_path.with_name(name + "-wal")
        # The last connection's close checkpoints the WAL into the file and deletes it.
        assert not wal.exists() or wal.stat().st_size == 0, f"{wal} left behind: the store was not closed"
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_sigterm_fails_an_inspection_past_the_grace_cleanly_closes_the_store_and_exits_0(stack):
    vision = stack.role("vision")
    key = f"stop-{uuid.uuid4().hex}"
    os.kill(vision.pid, signal.SIGSTOP)
    try:
        caller, outcome = _inspect_in_flight(stack, key)
        t0 = time.monotonic()
        stack.role("gateway").proc.send_signal(signal.SIGTERM)
        code = _exit_code(stack, t0)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(vision.pid, signal.SIGCONT)
    caller.join(60)
    try:
        assert code == 0, stack.role("gateway").log_tail(40)
        assert GRACE_S <= elapsed < EXIT_BOUND_S  # the in-flight call had its grace, then the process ended
        assert outcome and isinstance(outcome[0], grpc.StatusCode), outcome  # the caller got an error, no report
        [(_, status, reason)] = _rows(stack.opts.workdir / "reports.sqlite", key)
        assert status == "failed" and "CANCELLED" in reason and "gateway stopped" in reason, reason
        _assert_store_closed(stack)
        log = stack.role("gateway").log_path.read_text()
        assert f"stopping with {GRACE_S:.1f}s grace" in log and "gateway stopped" in log
    finally:
        stack.restart("gateway")


def test_sigterm_lets_an_inspection_finish_within_the_grace_and_stores_it(stack):
    vision = stack.role("vision")
    key = f"finish-{uuid.uuid4().hex}"
    os.kill(vision.pid, signal.SIGSTOP)
    try:
        caller, outcome = _inspect_in_flight(stack, key)
        gateway = stack.role("gateway").proc
        t0 = time.monotonic()
        gateway.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # the gateway has stopped admitting when the vision node answers again
    finally:
        os.kill(vision.pid, signal.SIGCONT)
    try:
        code = _exit_code(stack, t0)
        elapsed = time.monotonic() - t0
        caller.join(60)
        assert code == 0, stack.role("gateway").log_tail(40)
        assert elapsed < EXIT_BOUND_S
        assert outcome and isinstance(outcome[0], inspection_pb2.DefectReport), outcome
        [(report_id, status, reason)] = _rows(stack.opts.workdir / "reports.sqlite", key)
        assert (report_id, status, reason) == (outcome[0].report_id, "done", "")
        _assert_store_closed(stack)
    finally:
        if gateway.poll() is None:
            gateway.kill()
        stack.restart("gateway")
