"""One reader thread per camera: open, read, sample, hand the newest sampled frame on; reopen on failure."""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from enum import StrEnum

from edgeinspect.errors import EdgeInspectError, InvalidInput
from edgeinspect.services.common.retry import backoff_delays
from edgeinspect.services.ingest.config import CameraConfig
from edgeinspect.services.ingest.flow import LatestSlot
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.ingest.sampling import Decision, Sampler
from edgeinspect.services.ingest.sources import (
    Frame,
    FrameSource,
    SourceKind,
    SourceSpec,
    classify,
    open_source,
    resolve_asset,
)

logger = logging.getLogger(__name__)


class CameraState(StrEnum):
    starting = "starting"
    streaming = "streaming"
    reconnecting = "reconnecting"
    finished = "finished"  # a file or folder ended and does not loop
    failed = "failed"  # the source can never work as configured (not a video, no such file)
    stopped = "stopped"


def source_spec(cfg: CameraConfig) -> SourceSpec:
    location = resolve_asset(cfg.source)
    return SourceSpec(
        kind=classify(location),
        location=location,
        rtsp_transport=cfg.rtsp_transport.value,
        realtime=cfg.realtime,
        loop=cfg.loop,
        folder_fps=cfg.folder_fps,
        open_timeout_s=cfg.open_timeout_s,
        read_timeout_s=cfg.stall_timeout_s,
    )


def reconnect_delays(base_s: float, max_s: float) -> Iterator[float]:
    """Exponential delays from base_s, doubling, jittered, never above max_s; endless (cameras come back)."""
    attempts = max(2, math.ceil(math.log2(max(max_s / base_s, 1.0))) + 2)
    return itertools.chain(backoff_delays(base_s, 2.0, max_s, attempts, jitter=0.2), itertools.repeat(max_s))


DecisionHook = Callable[[str, Frame, Decision], None]


class CameraReader:
    """Reads one camera in its own thread; sampled frames go to `slot` (latest wins, replaced ones counted)."""

    def __init__(
        self,
        cfg: CameraConfig,
        sampler: Sampler,
        slot: LatestSlot[Frame],
        metrics: IngestMetrics,
        on_decision: DecisionHook | None = None,
        opener: Callable[[SourceSpec], FrameSource] = open_source,
    ) -> None:
        self.cfg = cfg
        self.spec = source_spec(cfg)
        self.state = CameraState.starting
        self.opens = 0  # successful opens (1 + reconnections that worked)
        self._sampler = sampler
        self._sampler_lock = threading.Lock()  # the reader decides, the dispatcher and trigger endpoint poke
        self._slot = slot
        self._metrics = metrics
        self._on_decision = on_decision
        self._opener = opener
        self._stop = threading.Event()
        self._index = 0
        self._grabs: list[tuple[float, Future[Frame]]] = []  # (wall time, future): frames asked for directly
        self._grabs_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"camera-{cfg.id}", daemon=True)

    def start(self) -> CameraReader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def trigger(self, at: float | None = None) -> None:
        with self._sampler_lock:
            self._sampler.trigger(time.time() if at is None else at)

    def grab(self, at: float | None = None) -> Future[Frame]:
        """The first frame captured at or after `at` (default: now), whatever the sampling says: what a PLC
        trigger inspects. The future fails when the reader stops first."""
        future: Future[Frame] = Future()
        with self._grabs_lock:
            self._grabs.append((time.time() if at is None else at, future))
        if self._stop.is_set():
            self._fail_grabs()
        return future

    def _serve_grabs(self, frame: Frame) -> None:
        with self._grabs_lock:
            due = [f for t, f in self._grabs if t <= frame.wall_time]
            self._grabs = [(t, f) for t, f in self._grabs if t > frame.wall_time]
        for future in due:
            if not future.done():
                future.set_result(frame)

    def _fail_grabs(self) -> None:
        with self._grabs_lock:
            pending, self._grabs = self._grabs, []
        for _, future in pending:
            if not future.done():
                future.set_exception(EdgeInspectError(f"camera {self.cfg.id} stopped before it captured a frame"))

    def forget_last(self) -> None:
        """Delivery of the last sampled frame failed: let the gate choose the current scene again."""
        with self._sampler_lock:
            self._sampler.forget()

    def _run(self) -> None:
        cam = self.cfg.id
        delays = reconnect_delays(self.cfg.reconnect_base_s, self.cfg.reconnect_max_s)
        labels = {"camera": cam}
        while not self._stop.is_set():
            try:
                source = self._opener(self.spec)
            except InvalidInput as exc:
                logger.error("camera %s: source %s is unusable, giving up: %s", cam, self.spec.location, exc)
                self._metrics.source_errors.labels(camera=cam, kind="invalid").inc()
                self.state = CameraState.failed
                return
            except EdgeInspectError as exc:
                delay = next(delays)
                logger.warning("camera %s: open failed (%s); retrying in %.2fs", cam, exc, delay)
                self._metrics.source_errors.labels(camera=cam, kind="open_failed").inc()
                self._reconnect_after(delay)
                continue
            self.opens += 1
            self.state = CameraState.streaming
            self._metrics.connected.labels(**labels).set(1)
            logger.info("camera %s: opened %s (%s)", cam, self.spec.location, self.spec.kind.value)
            opened_at = time.monotonic()
            frames, last_frame_at = self._read_until_failure(source)
            source.close()
            self._metrics.connected.labels(**labels).set(0)
            if self._stop.is_set():
                break
            if frames:
                delays = reconnect_delays(self.cfg.reconnect_base_s, self.cfg.reconnect_max_s)
            if self.spec.kind in (SourceKind.file, SourceKind.folder) and frames:
                if self.spec.loop:
                    continue
                logger.info("camera %s: end of %s after %d frames", cam, self.spec.location, self._index)
                self.state = CameraState.finished
                return
            silent_s = time.monotonic() - (last_frame_at or opened_at)
            if silent_s >= 0.9 * self.cfg.stall_timeout_s:
                kind = "stalled"
                logger.warning("camera %s: watchdog: no frame for %.1fs, reopening the stream", cam, silent_s)
            else:
                kind = "ended"
                logger.warning("camera %s: stream ended or broke after %d frames, reopening", cam, frames)
            self._metrics.source_errors.labels(camera=cam, kind=kind).inc()
            self._reconnect_after(next(delays))
        self.state = CameraState.stopped
        self._fail_grabs()

    def _reconnect_after(self, delay: float) -> None:
        self.state = CameraState.reconnecting
        self._metrics.reconnects.labels(camera=self.cfg.id).inc()
        self._stop.wait(delay)

    def _read_until_failure(self, source: FrameSource) -> tuple[int, float | None]:
        """Reads until the source fails, ends, or stop(); returns (frames read, monotonic time of the last)."""
        cam = self.cfg.id
        frames, last = 0, None
        while not self._stop.is_set():
            # The watchdog: FFmpeg aborts a read that gets no data for stall_timeout_s (read timeout set at open).
            image = source.read()
            if image is None:
                break
            frames += 1
            last = time.monotonic()
            frame = Frame(image=image, index=self._index, wall_time=time.time(), pts_s=source.position_s())
            self._index += 1
            self._metrics.frames_read.labels(camera=cam).inc()
            self._metrics.frame_age.touch(cam, last)
            if self._grabs:
                self._serve_grabs(frame)
            with self._sampler_lock:
                decision = self._sampler.decide(frame.index, frame.wall_time, frame.image)
            if self._on_decision is not None:
                self._on_decision(cam, frame, decision)
            if decision.inspect:
                self._metrics.frames_sampled.labels(camera=cam).inc()
                if self._slot.put(frame) is not None:
                    self._metrics.frames_dropped.labels(camera=cam, reason="superseded").inc()
        return frames, last
