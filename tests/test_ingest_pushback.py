"""Ingest honours the gateway's RESOURCE_EXHAUSTED pushback: it waits the `grpc-retry-pushback-ms` it was given
(counted in its metrics) before the next try, never retrying hot; without a pushback the frame is dropped.

The refusing side is a stand-in InspectionService on the project's own server stack (start_server: interceptors,
abort_with), which is what writes the pushback trailer for the real gateway too; the gateway's own admission
control is the lead's and is tested there. Ingest, its gRPC sink and the sample video are the real ones.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from edgeinspect.assets import asset_path
from edgeinspect.config import ServerConfig
from edgeinspect.errors import ResourceExhausted
from edgeinspect.services.common.server import RunningServer, start_server
from edgeinspect.services.ingest.config import CameraConfig, IngestSettings
from edgeinspect.services.ingest.delivery import GrpcReportSink
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.ingest.service import Ingestor
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

INSPECTION = inspection_pb2.DESCRIPTOR.services_by_name["InspectionService"].full_name


class FullThenFree(inspection_pb2_grpc.InspectionServiceServicer):
    """Inspect: RESOURCE_EXHAUSTED for the first `full` calls (pushback `pushback_ms`; None: no pushback), then
    an OK report, each answer `delay_s` after the call. Records when each call arrived."""

    def __init__(self, full: int, pushback_ms: int | None, delay_s: float = 0.0) -> None:
        self.full, self.pushback_ms, self.delay_s = full, pushback_ms, delay_s
        self.calls: list[float] = []
        self.keys: list[str] = []

    async def Inspect(self, request, context):
        self.calls.append(time.monotonic())
        self.keys.append(request.idempotency_key)
        await asyncio.sleep(self.delay_s)
        if len(self.calls) <= self.full:
            exc = ResourceExhausted("gateway full: 8 of 8 inspections running, 8 of 8 queued")
            if self.pushback_ms is None:
                exc.retry_after_ms = None  # a server that gives no pushback
            else:
                exc.retry_after_ms = self.pushback_ms
            raise exc
        return inspection_pb2.DefectReport(
            report_id=f"r{len(self.calls)}",
            idempotency_key=request.idempotency_key,
            part=request.part,
            camera_id=request.camera_id,
            verdict=inspection_pb2.VERDICT_OK,
        )


@pytest.fixture
async def gateway(request) -> AsyncIterator[tuple[RunningServer, FullThenFree]]:
    servicer = FullThenFree(*request.param)
    running = await start_server(
        [lambda s: inspection_pb2_grpc.add_InspectionServiceServicer_to_server(servicer, s)],
        [INSPECTION],
        ServerConfig(host="127.0.0.1", port=0),
        role="gateway-standin",
    )
    yield running, servicer
    await running.stop(0)


def _settings(port: int, tmp_path, in_flight: int = 1) -> IngestSettings:
    sample = IngestSettings.load(asset_path("cameras.sample.yaml")).cameras[0].model_dump()
    cam = CameraConfig.model_validate({**sample, "realtime": False, "loop": False, "max_in_flight": in_flight})
    return IngestSettings(
        cameras=[cam], gateway=f"127.0.0.1:{port}", api_token="", frames_dir=tmp_path / "frames",
        retry_attempts=4, retry_base_s=0.05, retry_max_s=0.2, request_timeout_s=10,
    )  # fmt: skip


async def _run(port: int, tmp_path, in_flight: int = 1) -> tuple[object, IngestMetrics]:
    cfg = _settings(port, tmp_path, in_flight)
    sink = GrpcReportSink(cfg.gateway, cfg.api_token, cfg.request_timeout_s)
    metrics = IngestMetrics(CollectorRegistry())
    try:
        result = await asyncio.wait_for(Ingestor(cfg, sink, metrics).run(max_reports=1), 60)
    finally:
        await sink.close()
    return result, metrics


@pytest.mark.parametrize("gateway", [(2, 400)], indirect=True)
async def test_pushback_is_waited_out_and_counted_then_the_frame_is_delivered(gateway, tmp_path):
    running, servicer = gateway
    result, metrics = await _run(running.port, tmp_path)
    assert [r.report_id for r in result.reports] == ["r3"]
    first = [t for t, key in zip(servicer.calls, servicer.keys, strict=True) if key == servicer.keys[0]]
    gaps = [b - a for a, b in zip(first, first[1:], strict=False)]  # (a next frame may start as the run stops)
    assert len(gaps) == 2 and all(gap >= 0.38 for gap in gaps), gaps  # 400 ms each, not retry_base_s (50 ms)
    camera = result.reports[0].camera_id
    assert metrics.value("edgeinspect_ingest_pushbacks_total", camera=camera) == 2
    assert metrics.value("edgeinspect_ingest_pushback_seconds_total", camera=camera) == pytest.approx(0.8)


@pytest.mark.parametrize("gateway", [(1000, 0)], indirect=True)
async def test_a_zero_pushback_is_never_a_hot_loop_and_tries_are_bounded(gateway, tmp_path):
    running, servicer = gateway
    t0 = time.monotonic()
    result, metrics = await _run(running.port, tmp_path)
    assert result.reports == [] and "RESOURCE_EXHAUSTED" in result.failures
    assert max(Counter(servicer.keys).values()) <= 1 + 4  # one try + retry_attempts pushbacks per frame
    gaps = [b - a for a, b in zip(servicer.calls, servicer.calls[1:], strict=False)]
    assert min(gaps) >= 0.045, gaps  # every try waited at least retry_base_s, also a new frame's first
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("gateway", [(1000, None)], indirect=True)
async def test_resource_exhausted_without_pushback_drops_the_frame_without_retrying(gateway, tmp_path):
    running, servicer = gateway
    result, metrics = await _run(running.port, tmp_path)
    count, example = result.failures["RESOURCE_EXHAUSTED"]
    assert count == len(servicer.calls)  # each frame tried once
    assert example == "RESOURCE_EXHAUSTED: gateway full: 8 of 8 inspections running, 8 of 8 queued"
    assert metrics.value("edgeinspect_ingest_pushbacks_total", camera="conveyor-1") == 0


@pytest.mark.parametrize("gateway", [(0, None, 1.0)], indirect=True)
async def test_max_reports_inspects_that_many_frames_not_whatever_else_was_in_flight(gateway, tmp_path):
    """Room for two at once and a gateway that takes a second per report: with one report wanted, ingest sends one
    frame (and, had it failed, would send the next), never a second inspection the stop would then cut off."""
    running, servicer = gateway
    result, metrics = await _run(running.port, tmp_path, in_flight=2)
    assert [r.report_id for r in result.reports] == ["r1"] and len(servicer.calls) == 1
    assert metrics.value("edgeinspect_ingest_frames_inspected_total", camera=result.reports[0].camera_id) == 1
