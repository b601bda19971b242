"""Flow control: a latest-only slot between a camera's reader and its dispatcher, and in-flight limits.

Nothing here queues more than one frame per camera: when inspections are slower than the camera, the newest
sampled frame wins and the one it replaces is counted as dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LatestSlot(Generic[T]):
    """Holds at most one item; `put` replaces (and returns) an item nobody took yet. Thread-safe."""

    def __init__(self, on_put: Callable[[], object] | None = None) -> None:
        self._lock = threading.Lock()
        self._item: T | None = None
        self._on_put = on_put  # wakes the consumer (e.g. loop.call_soon_threadsafe(event.set))

    def put(self, item: T) -> T | None:
        with self._lock:
            superseded, self._item = self._item, item
        if self._on_put is not None:
            self._on_put()
        return superseded

    def take(self) -> T | None:
        with self._lock:
            item, self._item = self._item, None
        return item

    def peek(self) -> bool:
        with self._lock:
            return self._item is not None


class InFlightLimits:
    """Counts running inspections per camera and overall; pure bookkeeping, the caller does the waiting."""

    def __init__(self, total: int, per_camera: dict[str, int]) -> None:
        if total < 1 or any(n < 1 for n in per_camera.values()):
            raise ValueError(f"in-flight limits must be >= 1, got total={total}, per camera={per_camera}")
        self.total = total
        self.per_camera = dict(per_camera)
        self._running: dict[str, int] = dict.fromkeys(per_camera, 0)

    def can_start(self, camera: str) -> bool:
        return self._running[camera] < self.per_camera[camera] and self.running() < self.total

    def start(self, camera: str) -> None:
        if not self.can_start(camera):
            raise RuntimeError(f"in-flight limit reached for {camera}: start() without can_start()")
        self._running[camera] += 1

    def finish(self, camera: str) -> None:
        if self._running[camera] == 0:
            raise RuntimeError(f"finish() for {camera} with nothing running")
        self._running[camera] -= 1

    def running(self, camera: str | None = None) -> int:
        return sum(self._running.values()) if camera is None else self._running[camera]
