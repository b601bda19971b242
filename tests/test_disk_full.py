"""A full disk under a real gateway: frames expire first, then new inspections are refused with RESOURCE_EXHAUSTED
naming the disk (reads go on, the store stays intact), and inspections resume by themselves once space is freed.

The disk is a 4 MiB tmpfs mounted (as root) under the gateway's work dir, holding its SQLite store and frames; the
test fills it with a file of its own. The gateway is an extra process in front of the session's embedded stack.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.config import ServerConfig, write_yaml
from edgeinspect.services.common.logging import configure_logging
from edgeinspect.services.gateway import disk as disk_mod
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.testing import stop_process
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

pytestmark = pytest.mark.timeout(300)  # bounded: two short stories on a 4 MiB disk

START_S = 120
FLOOR_MB = 1.0  # frames and store share the tmpfs: one floor of 1 MiB on a 4 MiB disk
PUSHBACK_S = 2.0
FRAME = asset_path("part_ok.jpg").read_bytes()


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path_factory.mktemp("disk-full") / "disk"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture(scope="module")
def gateway(embedded_stack, disk):
    """A gateway whose store and frames live on the tmpfs (its log and config stay off it)."""
    folder = disk.parent
    cfg = GatewaySettings.load(embedded_stack.role("gateway").config_path)
    cfg = cfg.model_copy(
        update={
            "api_tokens": [],
            "allow_unauthenticated": True,
            "db_path": disk / "reports.sqlite",
            "server": ServerConfig(host="127.0.0.1", port=0, port_file=folder / "gateway.port", grace_s=1.0),
            "disk": cfg.disk.model_copy(
                update={
                    "frames_min_free_mb": FLOOR_MB,
                    "store_min_free_mb": FLOOR_MB,
                    "headroom": 0.1,
                    "pushback_s": PUSHBACK_S,
                }
            ),
        }
    )
    write_yaml(cfg, folder / "gateway.yaml")
    log = folder / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinspect.services.gateway", "--config", str(folder / "gateway.yaml")],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        address = _wait_serving(proc, folder / "gateway.port", log)
        yield address, log
    finally:
        stop_process(proc)


def _wait_serving(proc: subprocess.Popen, port_file: Path, log: Path) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if port_file.is_file() and port_file.read_text().strip():
            address = f"127.0.0.1:{int(port_file.read_text())}"
            with contextlib.suppress(grpc.RpcError), grpc.insecure_channel(address) as ch:
                if health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                    return address
        time.sleep(0.2)
    raise AssertionError(f"the gateway was not SERVING within {START_S}s:\n" + log.read_text()[-3000:])


def _stub(address: str):
    return inspection_pb2_grpc.InspectionServiceStub(grpc.insecure_channel(address))


def _inspect(address: str, frame: bytes = FRAME) -> inspection_pb2.DefectReport:
    request = inspection_pb2.InspectRequest(image=frame, max_new_tokens=4, idempotency_key=uuid.uuid4().hex)
    return _stub(address).Inspect(request, timeout=60)


def _distinct_frame() -> bytes:
    return FRAME + uuid.uuid4().bytes  # bytes after the JPEG's end: the same picture, a frame of its own (sha256)


def _free(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def _fill(folder: Path, leave: int) -> Path:
    """Writes a file until `leave` bytes are free (0: until the disk refuses)."""
    filler = folder / f"filler-{uuid.uuid4().hex[:6]}"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):  # ENOSPC: the disk is full
        while (room := _free(folder) - leave) > 0:
            f.write(chunk[: min(len(chunk), room)])
    return filler


def _image_state(address: str, report_id: str) -> int:
    return _stub(address).GetReportImage(inspection_pb2.GetReportImageRequest(report_id=report_id), timeout=10).state


def _integrity(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def test_frames_expire_first_when_the_disk_is_short(gateway, disk):
    address, _ = gateway
    reports = [_inspect(address, _distinct_frame()) for _ in range(4)]
    assert all(_image_state(address, r.report_id) == inspection_pb2.IMAGE_STATE_STORED for r in reports)
    filler = _fill(disk, leave=int(FLOOR_MB * 2**20) - 60_000)  # just below the floor; the frames can lift it
    try:
        assert _inspect(address, _distinct_frame()).report_id  # admitted: the oldest frames made room
        assert _image_state(address, reports[0].report_id) == inspection_pb2.IMAGE_STATE_EXPIRED
        assert _image_state(address, reports[-1].report_id) == inspection_pb2.IMAGE_STATE_STORED
        got = _stub(address).GetReport(inspection_pb2.GetReportRequest(report_id=reports[0].report_id), timeout=10)
        assert got.report_id == reports[0].report_id  # the report stays; only its frame expired
    finally:
        filler.unlink()


def test_a_full_disk_refuses_inspections_keeps_reads_and_resumes_when_space_returns(gateway, disk):
    address, log = gateway
    earlier = _inspect(address)
    filler = _fill(disk, leave=0)
    try:
        with pytest.raises(grpc.RpcError) as err:
            _inspect(address, _distinct_frame())
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        details = err.value.details()
        assert "disk has" in details and "MiB free, below its floor of 1.0 MiB" in details, details
        assert str(disk) not in details  # the folder goes to the log and the status, not to every caller
        trailers = dict(err.value.trailing_metadata())
        assert trailers["grpc-retry-pushback-ms"] == str(int(PUSHBACK_S * 1000))
        assert trailers["edgeinspect-error-code"] == "disk_full"

        # reads go on: the report, the list, the health (SERVING: reads are served), and the status says why
        got = _stub(address).GetReport(inspection_pb2.GetReportRequest(report_id=earlier.report_id), timeout=10)
        assert got.report_id == earlier.report_id
        listed = _stub(address).ListReports(inspection_pb2.ListReportsRequest(), timeout=10)
        assert earlier.report_id in [r.report_id for r in listed.reports]
        status = _stub(address).GetClusterStatus(inspection_pb2.ClusterStatusRequest(), timeout=10)
        assert any("inspections refused" in n and str(disk) in n for n in status.notes), status.notes
        assert _integrity(disk / "reports.sqlite") == "ok"
        assert "refusing inspections" in log.read_text()
    finally:
        filler.unlink()

    # no restart, no reset: the next inspection measures again and is admitted
    report = _inspect(address)
    assert report.report_id and len(report.generated_token_ids) > 0
    assert _integrity(disk / "reports.sqlite") == "ok"


def test_pruning_for_space_frees_the_shortfall_of_disks_on_the_frames_filesystem_only():
    frames = disk_mod.Disk("frames", Path("/f"), 100)
    store = disk_mod.Disk("store", Path("/s"), 200)
    spaces = [disk_mod.Space(frames, 150, 1), disk_mod.Space(store, 150, 1)]
    assert disk_mod.frames_shortfall(spaces, 1, 0.0) == 50  # the store's floor on the same filesystem
    assert disk_mod.frames_shortfall(spaces, 1, 0.5) == 150
    assert disk_mod.frames_shortfall(spaces, 2, 0.5) == 0  # frames elsewhere: pruning them frees nothing here
    text = disk_mod.refusal([s for s in spaces if s.short])
    assert text.startswith("the store disk has 0.0 MiB free, below its floor of 0.0 MiB")


def test_a_role_log_file_rotates_at_its_size_and_keeps_its_backups(tmp_path):
    log_file = tmp_path / "logs" / "gateway.log"
    configure_logging("INFO", json=True, role="gateway", file=log_file, max_bytes=4096, backups=2)
    try:
        for i in range(200):
            logging.getLogger("edgeinspect.test").info("line %d of a chatty role", i)
    finally:
        configure_logging("INFO", json=True, role="")  # back to stderr for the rest of the session
    names = sorted(p.name for p in log_file.parent.iterdir())
    assert names == ["gateway.log", "gateway.log.1", "gateway.log.2"]
    assert all(p.stat().st_size <= 4096 for p in log_file.parent.iterdir())
    assert '"line 199 of a chatty role"' in log_file.read_text()
