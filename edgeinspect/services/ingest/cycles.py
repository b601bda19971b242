"""Triggered cycles: a PLC trigger (an OPC UA node or `POST /trigger/<camera>?wait=1`) captures the camera's
current frame, inspects it within the station's takt budget and answers on the same channel.

Also the ingest-hosted outputs: every report this role receives goes to its `outputs:` (the same contract and
fan-out as the gateway's), with the line's decision attached for triggered cycles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from edgeinspect.errors import EdgeInspectError
from edgeinspect.services.common.errors import status_for
from edgeinspect.services.ingest.camera import CameraReader
from edgeinspect.services.ingest.config import CameraConfig, IngestSettings
from edgeinspect.services.ingest.delivery import (
    FrameStore,
    InspectionJob,
    ReportSink,
    ReportSummary,
    encode_jpeg,
    idempotency_key,
)
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.line.config import StationLineConfig
from edgeinspect.services.line.handshake import ErrorCode, Outcome, Start, line_signals
from edgeinspect.services.outputs.fanout import Outputs
from edgeinspect.services.outputs.result import LineResult, rank_defects

logger = logging.getLogger(__name__)
UNAVAILABLE_RETRY_S = 0.1  # a restarting gateway is retried this often while the cycle's budget lasts
DEFAULT_HTTP_BUDGET = StationLineConfig()


class CaptureFailed(EdgeInspectError):
    status = "UNAVAILABLE"


def error_code_for(exc: BaseException) -> ErrorCode:
    if isinstance(exc, CaptureFailed):
        return ErrorCode.capture_failed
    code = status_for(exc)
    if code is grpc.StatusCode.UNAVAILABLE:
        return ErrorCode.unavailable
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ErrorCode.timeout
    return ErrorCode.inspection_failed


def line_word(ok: bool, ng: bool, recheck: bool) -> str:
    return "OK" if ok else "RECHECK" if recheck else "NG"


class LineSide:
    """The ingest role's triggered cycles, OPC UA server and outputs; `start()` once the readers exist."""

    def __init__(
        self,
        settings: IngestSettings,
        readers: dict[str, CameraReader],
        sink: ReportSink | None,
        metrics: IngestMetrics,
        frame_store: FrameStore | None,
        on_report: Callable[[ReportSummary], None] | None,
    ) -> None:
        self.settings = settings
        self.readers = readers  # filled by the Ingestor before start()
        self.sink = sink
        self.metrics = metrics
        self._frames = frame_store
        self._user_on_report = on_report
        base = settings.frames_dir.parent if settings.frames_dir is not None else Path("var")
        self.outputs = Outputs.local(settings.outputs, base / "outbox")
        # Every line cycle (OPC UA and HTTP `?wait=1`) in one journal: the OPC UA server's, else beside the outbox.
        self._journal_path = settings.opcua.journal if settings.opcua is not None else base / "line.sqlite"
        self.server = None
        self.journal = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._saves: set[asyncio.Task] = set()  # frames being written after their verdict went out

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        cfg = self.settings.opcua
        stations = [c for c in self.settings.cameras if c.line is not None]
        if self.sink is None:
            return
        from edgeinspect.services.line.journal import CycleJournal

        if self.settings.trigger.port is not None or (cfg is not None and stations):
            self.journal = CycleJournal(self._journal_path)
        if cfg is None or not stations:
            return
        from edgeinspect.services.line.opcua import LineServer, LineStation

        line_stations = [LineStation(c.station, c.id, c.line) for c in stations]
        self.server = await LineServer(cfg, line_stations, self.run_cycle, self.journal).start()

    async def stop(self) -> None:
        await asyncio.gather(*self._saves, return_exceptions=True)
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.journal is not None:
            self.journal.close()
        await asyncio.to_thread(self.outputs.close)

    def on_report(self, report: ReportSummary, line: dict | None = None, capture_time: float | None = None) -> None:
        """Every report this role receives (sampled or triggered): the user's hook, then the outputs."""
        if self._user_on_report is not None:
            self._user_on_report(report)
        cam = next((c for c in self.settings.cameras if c.id == report.camera_id), None)
        classes, severity = rank_defects(list(report.defects))
        now = time.time()
        self.outputs.publish_result(
            LineResult(
                report_id=report.report_id,
                station=cam.station if cam else "",
                camera=report.camera_id,
                part=report.part,
                verdict=report.verdict,
                classes=classes,
                severity=severity,
                capture_time=capture_time,
                created_time=now,
                latency_ms=None if capture_time is None else round((now - capture_time) * 1e3, 1),
                line=line or {},
                anomaly=report.anomaly,
            )
        )

    async def capture_and_inspect(self, cam: CameraConfig, cycle_id: str, part: str, budget_s: float) -> tuple:
        """(report, capture time) for the first frame after now; UNAVAILABLE retried while the budget lasts."""
        if self.sink is None:
            raise EdgeInspectError("a dry run inspects nothing")
        ends = time.monotonic() + budget_s
        try:
            frame = await asyncio.wait_for(asyncio.wrap_future(self.readers[cam.id].grab()), timeout=budget_s)
        except TimeoutError as exc:
            raise CaptureFailed(f"camera {cam.id}: no frame within {budget_s:.1f}s") from exc
        except EdgeInspectError as exc:
            raise CaptureFailed(str(exc)) from exc
        jpeg = await asyncio.to_thread(encode_jpeg, frame.image, cam.jpeg_quality)
        job = InspectionJob(
            camera_id=cam.id,
            station=cam.station,
            part=part or cam.part,
            image_jpeg=jpeg,
            capture_time=frame.wall_time,
            idempotency_key=cycle_id,
            prompt=cam.prompt,
            max_new_tokens=cam.max_new_tokens,
        )
        while True:
            try:
                report = await self.sink.inspect(job)
                break
            except Exception as exc:
                self.metrics.delivery_errors.labels(camera=cam.id, code=status_for(exc).name).inc()
                # Stop with a tenth of the budget left, so the PLC hears "unavailable" before the deadline.
                reserve = max(2 * UNAVAILABLE_RETRY_S, 0.1 * budget_s)
                if status_for(exc) is not grpc.StatusCode.UNAVAILABLE or ends - time.monotonic() < reserve:
                    raise
                await asyncio.sleep(UNAVAILABLE_RETRY_S)
        self.metrics.frames_inspected.labels(camera=cam.id).inc()
        if self._frames is not None:  # off the line's critical path: the PLC hears the verdict first
            save = asyncio.create_task(asyncio.to_thread(self._frames.save, report.report_id, jpeg, frame.wall_time))
            self._saves.add(save)
            save.add_done_callback(self._saves.discard)
        return report, frame.wall_time

    async def run_cycle(self, station, start: Start, recipe: str, lot_id: str) -> Outcome:
        """One OPC UA cycle (services/line/opcua.py CycleRunner); failures become outcomes with an error code."""
        cam = self.settings.line_camera(station.name)
        try:
            report, captured = await self.capture_and_inspect(
                cam, start.cycle_id, recipe, station.cfg.result_deadline_ms / 1000.0
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code = error_code_for(exc)
            logger.warning("station %s: cycle %s failed (%s): %s", station.name, start.cycle_id, code.name, exc)
            return Outcome(start.cycle, error=code)
        classes, _ = rank_defects(list(report.defects))
        ok, ng, recheck = line_signals(report.verdict, ErrorCode.none, station.cfg)
        line = {"cycle_id": start.cycle_id, "lot_id": lot_id, "recipe": recipe, "line": line_word(ok, ng, recheck)}
        asyncio.get_running_loop().call_soon(self.on_report, report, line, captured)  # after the PLC's write
        return Outcome(
            start.cycle,
            verdict=report.verdict,
            defect_class=classes[0] if classes else "",
            report_id=report.report_id,
            anomaly=report.anomaly,
        )

    async def http_cycle(self, camera_id: str) -> tuple[int, dict]:
        """`POST /trigger/<camera>?wait=1`: (HTTP status, verdict JSON). Within the station's deadline when the
        camera has a `line:` block; a miss answers 504 with the fail-safe NG, the report still comes later."""
        cam = next((c for c in self.settings.cameras if c.id == camera_id), None)
        if cam is None:
            raise KeyError(camera_id)
        policy = cam.line or DEFAULT_HTTP_BUDGET
        budget_s = policy.result_deadline_ms / 1000.0 if cam.line else self.settings.request_timeout_s
        cycle_id = idempotency_key(cam.id, time.time())
        t0 = time.monotonic()
        if self.journal is not None:
            self.journal.started(cycle_id, cam.station, 0, "", "")  # 0: an HTTP cycle has no PLC cycle counter
        task = asyncio.ensure_future(self.capture_and_inspect(cam, cycle_id, "", budget_s))
        body: dict = {"camera": cam.id, "station": cam.station, "cycle_id": cycle_id}
        try:
            report, captured = await asyncio.wait_for(asyncio.shield(task), budget_s)
        except Exception as exc:
            code = ErrorCode.timeout if isinstance(exc, TimeoutError) else error_code_for(exc)
            ok, ng, recheck = line_signals("", code, policy)
            body.update(line=line_word(ok, ng, recheck), error=code.name, message=str(exc)[:200] or code.name)
            self._journal_written(cycle_id, body["line"], code, t0)
            if isinstance(exc, TimeoutError):  # the late report is stored by the gateway and linked here
                task.add_done_callback(lambda t: self._journal_late(cycle_id, t))
            return (504 if code is ErrorCode.timeout else 503), body
        classes, severity = rank_defects(list(report.defects))
        ok, ng, recheck = line_signals(report.verdict, ErrorCode.none, policy)
        body.update(
            report_id=report.report_id,
            verdict=report.verdict,
            classes=list(classes),
            severity=severity,
            line=line_word(ok, ng, recheck),
            error="none",
        )
        if report.anomaly:
            body["anomaly"] = report.anomaly
        self._journal_written(cycle_id, body["line"], ErrorCode.none, t0)
        if self.journal is not None:
            self.journal.resolved(cycle_id, report.report_id, report.verdict, late=False)
        self.on_report(report, {"cycle_id": cycle_id, "line": body["line"]}, captured)
        return 200, body

    def _journal_written(self, cycle_id: str, line: str, code: ErrorCode, t0: float) -> None:
        if self.journal is not None:
            self.journal.written(cycle_id, line, int(code), (time.monotonic() - t0) * 1e3)

    def _journal_late(self, cycle_id: str, task: asyncio.Future) -> None:
        if task.cancelled() or task.exception() is not None or self.journal is None:
            return
        report, _ = task.result()
        self.journal.resolved(cycle_id, report.report_id, report.verdict, late=True)

    def http_cycle_blocking(self, camera_id: str, timeout_s: float) -> tuple[int, dict]:
        """For the trigger endpoint's threads: runs http_cycle on the role's event loop."""
        if self._loop is None:
            raise EdgeInspectError("the ingest role is still starting")
        future = asyncio.run_coroutine_threadsafe(self.http_cycle(camera_id), self._loop)
        return future.result(timeout_s)
