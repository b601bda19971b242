"""The ingest role: reader threads per camera feed asyncio dispatchers that deliver frames to a ReportSink."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgeinspect.services.common.errors import status_for
from edgeinspect.services.common.retry import retry_async
from edgeinspect.services.ingest.camera import CameraReader, CameraState, DecisionHook
from edgeinspect.services.ingest.config import CameraConfig, IngestSettings
from edgeinspect.services.ingest.cycles import LineSide
from edgeinspect.services.ingest.delivery import (
    FrameStore,
    InspectionJob,
    ReportSink,
    ReportSummary,
    encode_jpeg,
    failure_text,
    idempotency_key,
    pushback_s,
)
from edgeinspect.services.ingest.flow import InFlightLimits, LatestSlot
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.ingest.sampling import Sampler, thumbnail
from edgeinspect.services.ingest.sources import Frame
from edgeinspect.services.ingest.trigger import TriggerServer

logger = logging.getLogger(__name__)

TERMINAL = (CameraState.finished, CameraState.failed, CameraState.stopped)


@dataclass
class IngestResult:
    reports: list[ReportSummary] = field(default_factory=list)
    states: dict[str, CameraState] = field(default_factory=dict)
    failures: dict[str, tuple[int, str]] = field(default_factory=dict)  # status -> (frames, first message)


def load_background(cam: CameraConfig) -> np.ndarray | None:
    """The gate's thumbnail of the empty station, if the camera has one configured."""
    gating = cam.sampling.gating
    if gating is None or gating.background is None:
        return None
    import cv2

    image = cv2.imread(str(gating.background), cv2.IMREAD_COLOR)
    if image is None:
        raise FileNotFoundError(f"camera {cam.id}: background image {gating.background} is missing or unreadable")
    return thumbnail(image, gating.size)


class Ingestor:
    """Follows every configured camera until stopped, the sources end, or `max_reports` reports arrived."""

    def __init__(
        self,
        settings: IngestSettings,
        sink: ReportSink | None,
        metrics: IngestMetrics,
        on_report: Callable[[ReportSummary], None] | None = None,
        on_decision: DecisionHook | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        for cam in settings.cameras:
            metrics.add_camera(cam.id)
        self._sink = sink  # None: dry run, sampled frames are only counted
        self._on_report = on_report
        self._on_decision = on_decision
        self._store = (
            FrameStore(settings.frames_dir, settings.retention.max_age_days, settings.retention.max_count)
            if settings.frames_dir is not None and sink is not None
            else None
        )
        self._limits = InFlightLimits(settings.max_in_flight, {c.id: c.max_in_flight for c in settings.cameras})
        self.readers: dict[str, CameraReader] = {}
        # Triggered cycles (OPC UA, HTTP ?wait=1) and this role's outputs; every report passes its hook.
        self.line = LineSide(settings, self.readers, sink, metrics, self._store, on_report)
        self._on_report = self.line.on_report
        self.trigger_port: int | None = None
        self._stop = asyncio.Event()
        self._not_before = 0.0  # monotonic: the gateway's last pushback holds every delivery until then

    def stop(self) -> None:
        """Ends run() from inside the event loop (e.g. a signal handler)."""
        self._stop.set()

    async def run(self, max_reports: int | None = None) -> IngestResult:
        loop = asyncio.get_running_loop()
        result = IngestResult()
        capacity = asyncio.Condition()
        wakes: dict[str, asyncio.Event] = {}
        slots: dict[str, LatestSlot[Frame]] = {}
        for cam in self.settings.cameras:
            wake = wakes[cam.id] = asyncio.Event()
            slots[cam.id] = LatestSlot(on_put=lambda w=wake: loop.call_soon_threadsafe(w.set))
            sampler = Sampler(cam.sampling, load_background(cam))
            self.readers[cam.id] = CameraReader(cam, sampler, slots[cam.id], self.metrics, self._on_decision)
        trigger = self._start_trigger()
        for reader in self.readers.values():
            reader.start()
        await self.line.start()
        deliveries: set[asyncio.Task] = set()
        dispatchers = [
            asyncio.create_task(
                self._dispatch(cam, slots[cam.id], wakes[cam.id], capacity, deliveries, result, max_reports)
            )
            for cam in self.settings.cameras
        ]
        try:
            while not self._stop.is_set():
                idle = not deliveries and not any(s.peek() for s in slots.values())
                if idle and all(r.state in TERMINAL for r in self.readers.values()):
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=0.1)
        finally:
            await self.line.stop()
            for reader in self.readers.values():
                reader.stop()
            for task in [*dispatchers, *deliveries]:
                task.cancel()
            await asyncio.gather(*dispatchers, *deliveries, return_exceptions=True)
            await asyncio.to_thread(self._join_readers)
            for cid, slot in slots.items():  # readers are joined: a frame still waiting here was never inspected
                if slot.take() is not None:
                    self.metrics.frames_dropped.labels(camera=cid, reason="stopped").inc()
            if trigger is not None:
                trigger.close()
        result.states = {cid: r.state for cid, r in self.readers.items()}
        return result

    def _join_readers(self) -> None:
        for reader in self.readers.values():
            reader.join(timeout=self.settings.cameras[0].stall_timeout_s + 5)

    def _start_trigger(self) -> TriggerServer | None:
        cfg = self.settings.trigger
        if cfg.port is None:
            return None

        def on_trigger(camera_id: str) -> bool:
            reader = self.readers.get(camera_id)
            if reader is None:
                return False
            reader.trigger()
            return True

        def on_wait(camera_id: str) -> tuple[int, dict]:
            return self.line.http_cycle_blocking(camera_id, self.settings.request_timeout_s + 5)

        server = TriggerServer(cfg.host, cfg.port, on_trigger, cfg.token, on_wait).start()
        self.trigger_port = server.port
        return server

    async def _dispatch(
        self,
        cam: CameraConfig,
        slot: LatestSlot[Frame],
        wake: asyncio.Event,
        capacity: asyncio.Condition,
        deliveries: set[asyncio.Task],
        result: IngestResult,
        max_reports: int | None,
    ) -> None:
        """Starts a delivery for the newest sampled frame whenever this camera and the whole role have room."""

        def room() -> bool:
            # Never more frames in flight than reports still wanted: `max_reports` N inspects N frames, not N plus
            # whichever started when a slot freed as the Nth report arrived (_deliver records a report first).
            wanted = max_reports is None or len(result.reports) + self._limits.running() < max_reports
            return wanted and self._limits.can_start(cam.id)

        while True:
            await wake.wait()
            wake.clear()
            while slot.peek():
                async with capacity:
                    await capacity.wait_for(room)
                    self._limits.start(cam.id)
                frame = slot.take()  # taken only now: while waiting for room, newer frames replaced it
                if frame is None:
                    await self._finished(cam.id, capacity)
                    break
                task = asyncio.create_task(self._deliver(cam, frame, capacity, result, max_reports))
                deliveries.add(task)
                task.add_done_callback(deliveries.discard)

    async def _finished(self, camera_id: str, capacity: asyncio.Condition) -> None:
        self._limits.finish(camera_id)
        self.metrics.in_flight.labels(camera=camera_id).set(self._limits.running(camera_id))
        async with capacity:
            capacity.notify_all()

    async def _send(self, cam: CameraConfig, job: InspectionJob) -> ReportSummary:
        """Inspect with retries of transient failures; a RESOURCE_EXHAUSTED pushback holds every delivery of the
        role that long (counted) and then tries again, at most retry_attempts times per frame: never at once."""
        s = self.settings
        sink = self._sink
        if sink is None:
            raise RuntimeError("ingest: _send called on a dry run (no sink to inspect with)")

        def count_retry(_attempt: int, exc: BaseException, _delay: float) -> None:
            self.metrics.delivery_errors.labels(camera=cam.id, code=status_for(exc).name).inc()

        pushbacks = 0
        while True:
            if (hold := self._not_before - time.monotonic()) > 0:
                await asyncio.sleep(hold)
            try:
                return await retry_async(
                    lambda: sink.inspect(job),
                    attempts=s.retry_attempts,
                    base_s=s.retry_base_s,
                    max_s=s.retry_max_s,
                    on_retry=count_retry,
                )
            except Exception as exc:
                wait = pushback_s(exc)
                if wait is None:
                    raise
                wait = max(wait, s.retry_base_s)  # a pushback of 0 must not become a hot loop
                self._not_before = max(self._not_before, time.monotonic() + wait)  # also for the next frame
                if pushbacks >= s.retry_attempts:
                    raise
                pushbacks += 1
                self.metrics.pushbacks.labels(camera=cam.id).inc()
                self.metrics.pushback_seconds.labels(camera=cam.id).inc(wait)
                logger.info("camera %s: gateway full, waiting %.3fs (%s)", cam.id, wait, failure_text(exc))

    async def _deliver(
        self,
        cam: CameraConfig,
        frame: Frame,
        capacity: asyncio.Condition,
        result: IngestResult,
        max_reports: int | None,
    ) -> None:
        self.metrics.in_flight.labels(camera=cam.id).set(self._limits.running(cam.id))
        try:
            if self._sink is None:
                return
            jpeg = await asyncio.to_thread(encode_jpeg, frame.image, cam.jpeg_quality)
            job = InspectionJob(
                camera_id=cam.id,
                station=cam.station,
                part=cam.part,
                image_jpeg=jpeg,
                capture_time=frame.wall_time,
                idempotency_key=idempotency_key(cam.id, frame.wall_time),
                prompt=cam.prompt,
                max_new_tokens=cam.max_new_tokens,
            )
            report = await self._send(cam, job)
            # Counted and recorded together with no await between them, and before the slot is freed below: a stop
            # landing later must not leave the counter and the report list disagreeing, and a dispatcher woken by
            # the freed slot sees this report (max_reports).
            self.metrics.frames_inspected.labels(camera=cam.id).inc()
            result.reports.append(report)
        except asyncio.CancelledError:  # the role stops: this frame was read and sampled, so it is counted
            self.metrics.frames_dropped.labels(camera=cam.id, reason="stopped").inc()
            raise
        except Exception as exc:  # one frame's failure must not end the camera: count it, forget it, go on
            code, text = status_for(exc).name, failure_text(exc)
            logger.warning("camera %s: frame %d not inspected (%s)", cam.id, frame.index, text)
            count, first = result.failures.get(code, (0, text))
            result.failures[code] = (count + 1, first)
            self.metrics.delivery_errors.labels(camera=cam.id, code=code).inc()
            self.metrics.frames_dropped.labels(camera=cam.id, reason="delivery_failed").inc()
            self.readers[cam.id].forget_last()
            return
        finally:
            await self._finished(cam.id, capacity)
        if self._store is not None:
            await asyncio.to_thread(self._store.save, report.report_id, jpeg, frame.wall_time)
        logger.info("camera %s: report %s %s", cam.id, report.report_id, report.verdict)
        if self._on_report is not None:
            self._on_report(report)
        if max_reports is not None and len(result.reports) >= max_reports:
            self._stop.set()
