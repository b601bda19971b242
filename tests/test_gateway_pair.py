"""Issue 58, the gateway pair: two gateway processes on one real PostgreSQL, in front of the session's embedded stack
(vision + 2 stages), and the project's own client holding both addresses (services/common/gateways.py).

A gateway SIGKILLed mid-inspection loses nothing and duplicates nothing: the client sends the same request (same
idempotency key) to the other gateway, which takes the key over once the dead one's heartbeat lease has run out,
and the one stored report carries the tokens an undisturbed run produces. Either gateway answers any key, and any
report's frame: each gateway keeps its own frames folder and reads the other's from it, as the same caller."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import psycopg
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.config import ApiToken, ServerConfig, TokenRole, write_yaml
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.common.auth import hash_token
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.store.settings import StoreBackend, StoreSettings
from edgeinspect.v1 import inspection_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
FRAME = asset_path("part_ok.jpg").read_bytes()
LEASE_S = 3.0  # the pair's owner lease, short so the test does not wait out the 10 s default
TOKENS = 48
START_S = 120
TOKEN = "ei_gateway-pair-test-token"  # an inspect token both gateways accept


class PairGateway:
    """One gateway of the pair: its own port and frames, the shared database, named `instance`."""

    def __init__(self, stack, folder: Path, dsn: str, instance: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        base = GatewaySettings.load(stack.role("gateway").config_path)
        self.folder, self.name = folder, instance
        self.cfg = base.model_copy(
            update={
                "api_tokens": [ApiToken(name="pair-test", role=TokenRole.inspect, hash=hash_token(TOKEN))],
                "allow_unauthenticated": False,
                "db_path": folder / "reports.sqlite",  # frames beside it: each gateway keeps its own
                "store": StoreSettings(
                    backend=StoreBackend.postgres, dsn=dsn, instance=instance, owner_lease_s=LEASE_S
                ),
                "server": ServerConfig(host="127.0.0.1", port=0, port_file=folder / "gateway.port", grace_s=1.0),
            }
        )
        write_yaml(self.cfg, folder / "gateway.yaml")
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self) -> PairGateway:
        (self.folder / "gateway.port").unlink(missing_ok=True)
        with (self.folder / "gateway.log").open("ab") as out:
            argv = [sys.executable, "-m", "edgeinspect.services.gateway", "--config", str(self.folder / "gateway.yaml")]
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        port_file, deadline = self.folder / "gateway.port", time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            if port_file.is_file() and port_file.read_text().strip():
                self.address = f"127.0.0.1:{int(port_file.read_text())}"
                with contextlib.suppress(grpc.RpcError), InspectionClient(self.address, TOKEN) as client:
                    client.call("GetClusterStatus", inspection_pb2.ClusterStatusRequest(), timeout_s=2)
                    return self
            time.sleep(0.2)
        raise AssertionError(f"{self.name} did not serve within {START_S} s:\n{self.log()}")

    def log(self) -> str:
        return (self.folder / "gateway.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def pair(embedded_stack, postgres_server, tmp_path_factory):
    dsn = postgres_server.fresh_schema_dsn()
    root = tmp_path_factory.mktemp("gateway-pair")
    gateways = [PairGateway(embedded_stack, root / name, dsn, name) for name in ("gw-a", "gw-b")]
    try:
        for g in gateways:
            g.start()
        yield gateways, dsn
    finally:
        for g in gateways:
            g.stop()


def rows(dsn: str, key: str) -> list[tuple[str, str, str, str]]:
    """(report_id, status, owner, reason) of every attempt at `key`, oldest first."""
    with psycopg.connect(dsn) as db:
        return db.execute(
            "SELECT report_id, status, owner, reason FROM reports WHERE idempotency_key = %s ORDER BY created_us",
            (key,),
        ).fetchall()


def test_either_gateway_answers_a_key_with_the_one_stored_report(pair):
    (a, b), dsn = pair
    key = uuid.uuid4().hex
    with InspectionClient(a.address, TOKEN) as only_a, InspectionClient(b.address, TOKEN) as only_b:
        first = only_a.inspect(FRAME, station="pair", idempotency_key=key, max_new_tokens=8)
        again = only_b.inspect(FRAME, station="pair", idempotency_key=key, max_new_tokens=8)
        assert again.report_id == first.report_id and only_b.get(first.report_id) == first
    assert [(r[1], r[2]) for r in rows(dsn, key)] == [("done", "gw-a")]


def test_a_gateway_killed_mid_inspection_loses_and_duplicates_nothing(pair):
    (a, b), dsn = pair
    with InspectionClient(f"{a.address},{b.address}", TOKEN, timeout_s=180) as client:
        reference = client.inspect(FRAME, station="pair", max_new_tokens=TOKENS)  # undisturbed, same frame
        assert client.gateways.current == 0, "the client starts on the first gateway of its list"
        key, result, errors = uuid.uuid4().hex, [], []

        def run() -> None:
            try:
                result.append(client.inspect(FRAME, station="pair", idempotency_key=key, max_new_tokens=TOKENS))
            except Exception as exc:  # noqa: BLE001 (asserted below)
                errors.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 60
        while not rows(dsn, key):  # gw-a has claimed the key: the inspection is in flight there
            assert time.monotonic() < deadline and worker.is_alive(), f"no claim seen: {errors}"
            time.sleep(0.02)
        a.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        worker.join(120)
        assert not errors, errors
        report = result[0]
        failover_s = time.monotonic() - killed_at
    assert a.proc.wait(5) == -signal.SIGKILL
    assert client.gateways.current == 1, "the client moved to the surviving gateway"
    attempts = rows(dsn, key)
    assert [(r[1], r[2]) for r in attempts] == [("failed", "gw-a"), ("done", "gw-b")], attempts
    assert "taken over" in attempts[0][3]
    assert report.report_id == attempts[1][0] and report.previous_attempt_id == attempts[0][0]
    assert list(report.generated_token_ids) == list(reference.generated_token_ids)
    assert failover_s < LEASE_S + 60, f"the survivor answered {failover_s:.1f} s after the kill"
    a.start()  # back as gw-a: its own pending rows are failed at start, gw-b's report stays the one
    assert [(r[1], r[2]) for r in rows(dsn, key)] == [("failed", "gw-a"), ("done", "gw-b")]


def _unique_frame() -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(FRAME)) as img:
        img = img.convert("RGB")
    img.putpixel((0, 0), tuple(uuid.uuid4().bytes[:3]))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


def test_a_frame_kept_by_one_gateway_is_read_through_the_other(pair):
    (a, b), _ = pair
    with InspectionClient(a.address, TOKEN) as on_a, InspectionClient(b.address, TOKEN) as on_b:
        image = _unique_frame()  # a frame gw-b never stored itself
        report = on_a.inspect(image, station="pair", max_new_tokens=8)
        frame, thumbnail = (
            inspection_pb2.GetReportImageRequest(report_id=report.report_id, thumbnail=small) for small in (False, True)
        )
        for request in (frame, thumbnail):
            here, there = on_a.call("GetReportImage", request), on_b.call("GetReportImage", request)
            assert here.state == inspection_pb2.IMAGE_STATE_STORED and there == here
        sha = on_b.call("GetReportImage", frame).image_sha256
        assert here.data and sha == hashlib.sha256(image).hexdigest()
        assert not list((b.folder / "frames").rglob(f"{sha}*")), "gw-b keeps no copy"
        with InspectionClient(b.address, "ei_not-a-token") as stranger, pytest.raises(grpc.RpcError) as refused:
            stranger.call("GetReportImage", thumbnail)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        a.stop()  # its frames stay on its disk: gw-b says at once which gateway holds them (the module's last test)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as held:
            on_b.call("GetReportImage", thumbnail, timeout_s=30)
        assert time.monotonic() - started < 5
        assert held.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "'gw-a'" in held.value.details() and a.address not in held.value.details()
