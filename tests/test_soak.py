"""Soak (slow, bounded): four cameras replaying video files in real time through the embedded stack (vision, two
stages, gateway: real processes) for EDGEINSPECT_SOAK_S seconds (default 420). After a warm-up, every role's RSS
grows < 10% and its open file descriptors stay flat; the stages hold no KV session once the cameras stop; no
role's log has an abandoned asyncio task ("Task was destroyed but it is pending", "never retrieved")."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from edgeinspect.assets import asset_path
from edgeinspect.services.ingest.config import CameraConfig, IngestSettings
from edgeinspect.services.ingest.delivery import GrpcReportSink
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.ingest.service import Ingestor
from edgeinspect.v1 import stage_pb2, stage_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SOAK_S = float(os.environ.get("EDGEINSPECT_SOAK_S", "420"))
WARMUP_S = 60.0
ABANDONED = ("Task was destroyed but it is pending", "Task exception was never retrieved")


def camera_files(folder: Path) -> list[Path]:
    """Four camera recordings: the sample conveyor video as recorded, mirrored, flipped, and both (ffmpeg)."""
    src = asset_path("conveyor.mp4")
    if shutil.which("ffmpeg") is None:
        return [Path(src)] * 4
    out = [Path(src)]
    for name, vf in (("mirrored", "hflip"), ("flipped", "vflip"), ("turned", "hflip,vflip")):
        path = folder / f"{name}.mp4"
        subprocess.run(
            ["ffmpeg", "-loglevel", "error", "-y", "-i", str(src), "-vf", vf, "-c:v", "mpeg4", "-q:v", "3", str(path)],
            check=True,
            timeout=120,
        )
        out.append(path)
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sample(stack) -> dict[str, tuple[float, int]]:
    return {r.name: (rss_mb(r.proc.pid), fds(r.proc.pid)) for r in stack.roles if r.proc.poll() is None}


async def test_four_cameras_for_minutes_leave_every_role_as_it_was(embedded_stack, tmp_path):
    stack = embedded_stack
    sample_cam = IngestSettings.load(asset_path("cameras.sample.yaml")).cameras[0].model_dump()
    cameras = [
        CameraConfig.model_validate(
            {**sample_cam, "id": f"soak-{k}", "source": str(path), "realtime": True, "loop": True}
        )
        for k, path in enumerate(camera_files(tmp_path))
    ]
    cfg = IngestSettings(
        cameras=cameras, gateway=stack.gateway_address, api_token=stack.api_token, frames_dir=tmp_path / "frames",
        max_in_flight=4, retry_attempts=3, retry_base_s=0.5, retry_max_s=2.0, request_timeout_s=120,
    )  # fmt: skip
    sink = GrpcReportSink(cfg.gateway, cfg.api_token, cfg.request_timeout_s)
    metrics = IngestMetrics(CollectorRegistry())
    ingestor = Ingestor(cfg, sink, metrics)
    run = asyncio.create_task(ingestor.run())
    try:
        await asyncio.sleep(WARMUP_S)
        assert not run.done(), run
        warm = sample(stack)
        reports_warm = sum(metrics.value("edgeinspect_ingest_frames_inspected_total", camera=c.id) for c in cameras)
        await asyncio.sleep(max(SOAK_S - WARMUP_S, 60.0))
        end = sample(stack)
    finally:
        ingestor.stop()
        result = await asyncio.wait_for(run, 120)
        await sink.close()

    assert len(result.reports) > reports_warm > 0, "the cameras were inspected through the whole soak"
    for name, (rss0, fd0) in warm.items():
        rss1, fd1 = end[name]
        print(f"soak {name}: RSS {rss0:.0f} -> {rss1:.0f} MB, fds {fd0} -> {fd1}")
        assert rss1 < rss0 * 1.10, f"{name}: RSS {rss0:.0f} -> {rss1:.0f} MB"
        assert fd1 <= fd0 + 4, f"{name}: open fds {fd0} -> {fd1}"

    deadline = time.monotonic() + 30
    for k in range(len(stack.layer_ranges)):
        for address in stack.stage_endpoints(k):
            with grpc.insecure_channel(address) as channel:
                stub = stage_pb2_grpc.DecoderStageStub(channel)
                while (stats := stub.Stats(stage_pb2.StatsRequest(), timeout=10)).sessions and (
                    time.monotonic() < deadline
                ):
                    time.sleep(0.5)
            assert stats.sessions == 0 and stats.kv_reserved_bytes == 0, (address, stats.session_ids)
            assert stats.evicted_budget == 0

    for role in stack.roles:
        log = role.log_path.read_text(errors="replace")
        for line in log.splitlines():
            assert not any(a in line for a in ABANDONED), f"{role.name}: {line[:300]}"
