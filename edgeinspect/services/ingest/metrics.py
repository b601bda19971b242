"""Per-camera Prometheus metrics of the ingest role, on a registry the caller owns (tests use their own)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class _FrameAge(Collector):
    """edgeinspect_ingest_last_frame_age_seconds, computed at scrape time from the last frame's arrival."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # camera -> monotonic time of its last frame

    def touch(self, camera: str, now: float | None = None) -> None:
        with self._lock:
            self._last[camera] = time.monotonic() if now is None else now

    def age(self, camera: str) -> float | None:
        with self._lock:
            last = self._last.get(camera)
        return None if last is None else time.monotonic() - last

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "edgeinspect_ingest_last_frame_age_seconds", "seconds since the camera's last frame", labels=["camera"]
        )
        now = time.monotonic()
        with self._lock:
            for camera, last in sorted(self._last.items()):
                family.add_metric([camera], now - last)
        yield family


class IngestMetrics:
    """Counters and gauges labelled by camera; `value()` reads one back (tests, dry-run summary)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        r = self.registry
        self.frames_read = Counter("edgeinspect_ingest_frames_read", "frames decoded", ["camera"], registry=r)
        self.frames_sampled = Counter(
            "edgeinspect_ingest_frames_sampled", "frames the sampling policy chose to inspect", ["camera"], registry=r
        )
        self.frames_dropped = Counter(
            "edgeinspect_ingest_frames_dropped",
            "sampled frames never inspected: superseded by a newer one while busy, delivery failed, or stopped "
            "(waiting or in flight when the role stopped)",
            ["camera", "reason"],
            registry=r,
        )
        self.frames_inspected = Counter(
            "edgeinspect_ingest_frames_inspected", "frames answered with a report", ["camera"], registry=r
        )
        self.reconnects = Counter("edgeinspect_ingest_reconnects", "stream reopen attempts", ["camera"], registry=r)
        self.source_errors = Counter(
            "edgeinspect_ingest_source_errors",
            "source failures by kind: open_failed, invalid, stalled, ended",
            ["camera", "kind"],
            registry=r,
        )
        self.delivery_errors = Counter(
            "edgeinspect_ingest_delivery_errors", "failed Inspect calls by status", ["camera", "code"], registry=r
        )
        self.pushbacks = Counter(
            "edgeinspect_ingest_pushbacks",
            "RESOURCE_EXHAUSTED answers with a retry pushback the role waited out",
            ["camera"],
            registry=r,
        )
        self.pushback_seconds = Counter(
            "edgeinspect_ingest_pushback_seconds", "seconds of pushback waited", ["camera"], registry=r
        )
        self.in_flight = Gauge("edgeinspect_ingest_in_flight", "inspections running", ["camera"], registry=r)
        self.connected = Gauge("edgeinspect_ingest_connected", "1 while the source is open", ["camera"], registry=r)
        self.frame_age = _FrameAge()
        r.register(self.frame_age)

    def add_camera(self, camera: str) -> None:
        """Every per-camera series at 0 from the start: a rate or increase over a camera that never reconnected
        (or never dropped a frame) is 0, not missing."""
        for family in (
            self.frames_read, self.frames_sampled, self.frames_inspected, self.reconnects, self.pushbacks,
            self.pushback_seconds, self.in_flight, self.connected,
        ):  # fmt: skip
            family.labels(camera=camera)

    def value(self, name: str, **labels: str) -> float:
        """The current value of one of this object's series (0 when never touched)."""
        got = self.registry.get_sample_value(name, labels)
        return 0.0 if got is None else got

    def close(self) -> None:
        """Unregisters everything, so another IngestMetrics can use the same registry."""
        for collector in (
            self.frames_read, self.frames_sampled, self.frames_dropped, self.frames_inspected, self.reconnects,
            self.source_errors, self.delivery_errors, self.pushbacks, self.pushback_seconds, self.in_flight,
            self.connected, self.frame_age,
        ):  # fmt: skip
            self.registry.unregister(collector)
