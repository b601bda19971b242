"""Delivery: JPEG encoding, idempotency keys, the ReportSink interface (gRPC in production), saved frames."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import grpc
import numpy as np

from edgeinspect.config import TLSConfig
from edgeinspect.errors import CodecError
from edgeinspect.services.common.context import REQUEST_ID_KEY
from edgeinspect.services.common.errors import RETRY_PUSHBACK_KEY, status_for
from edgeinspect.services.common.gateways import AsyncGatewayFailover, gateway_addresses
from edgeinspect.services.common.tracing import client_span
from edgeinspect.services.outputs.result import anomaly_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InspectionJob:
    """One frame on its way to the gateway; a retry resends the same job, so the same idempotency key."""

    camera_id: str
    station: str
    part: str
    image_jpeg: bytes
    capture_time: float  # unix seconds
    idempotency_key: str
    prompt: str = ""
    max_new_tokens: int = 0


@dataclass(frozen=True)
class ReportSummary:
    report_id: str
    verdict: str  # OK / DEFECT / UNCERTAIN
    part: str
    camera_id: str
    idempotency_key: str
    description: str = ""
    defects: tuple[tuple[str, str], ...] = ()  # (class, severity): what the line's DefectClass shows
    anomaly: dict = field(default_factory=dict)  # the gate's finding as outputs/result.py's anomaly_of gives it


class ReportSink(Protocol):
    async def inspect(self, job: InspectionJob) -> ReportSummary:
        """Creates (or, for a known idempotency key, returns) the report for one frame; typed errors on failure."""
        ...

    async def close(self) -> None: ...


def pushback_s(exc: BaseException) -> float | None:
    """The gateway's retry pushback on a RESOURCE_EXHAUSTED answer, in seconds; None when it gave none or said
    not to retry (a negative or malformed value, as the gRPC retry design defines it)."""
    if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_PUSHBACK_KEY:
            try:
                ms = int(value)
            except (TypeError, ValueError):
                return None
            return ms / 1e3 if ms >= 0 else None
    return None


def failure_text(exc: BaseException, limit: int = 200) -> str:
    """A failed delivery in one line: the status and the server's message (not the error object's repr, which
    spans lines of debug context)."""
    code = status_for(exc).name
    message = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    text = " ".join((message or type(exc).__name__).split())
    return f"{code}: {text[:limit]}"


def idempotency_key(camera_id: str, capture_time: float) -> str:
    """camera id + capture time in microseconds: unique per frame, identical across retries of that frame."""
    return f"{camera_id}:{round(capture_time * 1_000_000)}"


def encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    """[H, W, 3] uint8 BGR -> JPEG bytes."""
    import cv2

    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise CodecError(f"JPEG encoding failed for a frame of shape {image.shape}")
    return buf.tobytes()


class GrpcReportSink:
    """The gateway's InspectionService.Inspect over gRPC, with the bearer token on every call. `address`: one
    gateway or a pair ("a:50051,b:50051"): a frame whose gateway is gone goes to the other with the same key."""

    def __init__(self, address: str, token: str, timeout_s: float, tls: TLSConfig | None = None) -> None:
        from edgeinspect.services.common.channel import make_channel
        from edgeinspect.v1 import inspection_pb2_grpc

        self._channels: list[grpc.aio.Channel] = []

        def connect(target: str) -> inspection_pb2_grpc.InspectionServiceStub:
            self._channels.append(make_channel(target, tls=tls))
            return inspection_pb2_grpc.InspectionServiceStub(self._channels[-1])

        self._gateways = AsyncGatewayFailover(gateway_addresses(address), connect)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout_s = timeout_s

    async def inspect(self, job: InspectionJob) -> ReportSummary:
        from google.protobuf.timestamp_pb2 import Timestamp

        from edgeinspect.v1 import inspection_pb2

        capture = Timestamp()
        capture.FromNanoseconds(round(job.capture_time * 1e9))
        request = inspection_pb2.InspectRequest(
            image=job.image_jpeg,
            station=job.station,
            part=job.part,
            prompt=job.prompt,
            idempotency_key=job.idempotency_key,
            capture_time=capture,
            max_new_tokens=job.max_new_tokens,
            camera_id=job.camera_id,
        )
        attrs = {"edgeinspect.station": job.station, "edgeinspect.camera_id": job.camera_id}
        with client_span("ingest inspect", attrs) as span:
            # A traced frame's request id is its trace id: the gateway's logs and the trace join on one id.
            rid = ((REQUEST_ID_KEY, f"{span.get_span_context().trace_id:032x}"),) if span is not None else ()
            report = await self._gateways.call(
                lambda stub, left: stub.Inspect(request, metadata=self._metadata + rid, timeout=left), self._timeout_s
            )
            if span is not None:
                span.set_attribute("edgeinspect.report_id", report.report_id)
        return ReportSummary(
            report_id=report.report_id,
            verdict=inspection_pb2.Verdict.Name(report.verdict).removeprefix("VERDICT_"),
            part=report.part,
            camera_id=report.camera_id or job.camera_id,
            idempotency_key=report.idempotency_key,
            description=report.description,
            defects=tuple((d.defect_class, d.severity) for d in report.defects),
            anomaly=anomaly_of(report),
        )

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def plan_prune(
    files: list[tuple[Path, float]], now: float, max_age_s: float | None, max_count: int | None
) -> list[Path]:
    """Which saved frames to delete: those older than max_age_s, then the oldest beyond max_count."""
    newest_first = sorted(files, key=lambda f: f[1], reverse=True)
    doomed = [p for p, t in newest_first if max_age_s is not None and now - t > max_age_s]
    kept = [(p, t) for p, t in newest_first if max_age_s is None or now - t <= max_age_s]
    if max_count is not None:
        doomed += [p for p, _ in kept[max_count:]]
    return doomed


class FrameStore:
    """Saves inspected frames as <dir>/<YYYY-MM-DD>/<report_id>.jpg and applies retention every `prune_every`."""

    def __init__(self, root: Path, max_age_days: float | None, max_count: int | None, prune_every: int = 50) -> None:
        self.root = Path(root)
        self._max_age_s = None if max_age_days is None else max_age_days * 86400.0
        self._max_count = max_count
        self._prune_every = prune_every
        self._saved = 0

    def save(self, report_id: str, jpeg: bytes, capture_time: float) -> Path:
        day = datetime.fromtimestamp(capture_time, UTC).strftime("%Y-%m-%d")
        path = self.root / day / f"{_SAFE_NAME.sub('_', report_id)}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg)
        self._saved += 1
        if self._saved % self._prune_every == 1:  # the first save prunes what earlier runs left
            self.prune()
        return path

    def prune(self, now: float | None = None) -> list[Path]:
        files = [(p, p.stat().st_mtime) for p in self.root.glob("*/*.jpg")]
        doomed = plan_prune(files, time.time() if now is None else now, self._max_age_s, self._max_count)
        for path in doomed:
            path.unlink(missing_ok=True)
        for day in self.root.iterdir():
            if day.is_dir() and not any(day.iterdir()):
                day.rmdir()
        if doomed:
            logger.info("retention: deleted %d saved frames under %s", len(doomed), self.root)
        return doomed
