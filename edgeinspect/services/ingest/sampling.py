"""Which frames get inspected: pure policy over (frame index, capture time, thumbnail), no I/O, no threads.

Rules in order: a pending external trigger inspects the next frame; then every-N, max rate and change gating.
Change gating compares a small grayscale thumbnail with the last *inspected* frame. On a conveyor identical parts
stop at the same spot, so "differs from the last inspected frame" alone would miss the second of two identical
parts; the gate therefore remembers whether the scene changed at all since the last inspection (the part left),
and waits until the scene is still again (the next part has stopped) before inspecting it. Frames that match a
picture of the empty station are never inspected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeinspect.services.ingest.config import GatingConfig, SamplingConfig


@dataclass(frozen=True)
class Decision:
    inspect: bool
    reason: str  # shown by --dry-run and in debug logs


def thumbnail(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[H, W, 3] uint8 BGR -> [h, w] float32 grayscale, area-averaged so sensor noise mostly cancels."""
    import cv2

    gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
    return cv2.resize(gray, size, interpolation=cv2.INTER_AREA).astype(np.float32)


def change_score(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two thumbnails (0..255)."""
    return float(np.mean(np.abs(a - b)))


@dataclass
class GateState:
    reference: np.ndarray | None = None  # thumbnail of the last inspected frame
    previous: np.ndarray | None = None  # thumbnail of the previous considered frame
    changed: bool = True  # the scene differed from `reference` at some point since it was inspected


def gate(cfg: GatingConfig, state: GateState, thumb: np.ndarray, background: np.ndarray | None) -> Decision:
    """Change gating for one considered frame; updates `state.previous` and `state.changed`, not the reference."""
    motion = None if state.previous is None else change_score(thumb, state.previous)
    state.previous = thumb
    if state.reference is not None:
        diff = change_score(thumb, state.reference)
        if diff >= cfg.threshold:
            state.changed = True
    if cfg.settle_threshold is not None and (motion is None or motion >= cfg.settle_threshold):
        return Decision(False, "moving" if motion is not None else "waiting for a second frame")
    if background is not None:
        bg = change_score(thumb, background)
        if bg < cfg.threshold:
            return Decision(False, f"empty station ({bg:.1f} < {cfg.threshold:g} vs background)")
    if state.reference is None:
        return Decision(True, "first frame")
    if not state.changed:
        return Decision(False, f"unchanged since last inspection ({diff:.1f} < {cfg.threshold:g})")
    return Decision(True, f"changed ({diff:.1f} >= {cfg.threshold:g})" if diff >= cfg.threshold else "new scene")


class Sampler:
    """Applies a camera's SamplingConfig frame by frame. Not thread-safe: one reader thread owns it."""

    def __init__(self, cfg: SamplingConfig, background: np.ndarray | None = None) -> None:
        self.cfg = cfg
        self._background = background  # [h, w] float32 thumbnail of the empty station
        self._gate = GateState()
        self._last_index: int | None = None
        self._last_time: float | None = None
        self._trigger_at: float | None = None  # wall time of the pending trigger

    def trigger(self, at: float) -> None:
        """An external trigger: the first frame captured at or after `at` is inspected."""
        if self._trigger_at is None:
            self._trigger_at = at

    def decide(self, index: int, wall_time: float, image: np.ndarray) -> Decision:
        """Whether to inspect this frame, and why; marks it inspected when the answer is yes."""
        decision = self._decide(index, wall_time, image)
        if decision.inspect:
            self._last_index, self._last_time = index, wall_time
        return decision

    def forget(self) -> None:
        """The last selected frame was never inspected (delivery failed): the current scene is due again."""
        self._gate.changed = True

    def _decide(self, index: int, wall_time: float, image: np.ndarray) -> Decision:
        cfg = self.cfg
        if self._trigger_at is not None and wall_time >= self._trigger_at:
            self._trigger_at = None
            self._mark(image)
            return Decision(True, "external trigger")
        if cfg.trigger_only:
            return Decision(False, "waiting for a trigger")
        if index % cfg.every_n:
            return Decision(False, f"not every {cfg.every_n}th frame")
        if cfg.max_rate_hz is not None and self._last_time is not None:
            since = wall_time - self._last_time
            if since < 1.0 / cfg.max_rate_hz:
                self._observe(image)
                return Decision(False, f"rate limit ({since:.2f}s < {1.0 / cfg.max_rate_hz:.2f}s)")
        if cfg.gating is None:
            return Decision(True, "every frame" if cfg.every_n == 1 else f"every {cfg.every_n}th frame")
        decision = gate(cfg.gating, self._gate, thumbnail(image, cfg.gating.size), self._background)
        if decision.inspect:
            self._gate.reference, self._gate.changed = self._gate.previous, False
        return decision

    def _observe(self, image: np.ndarray) -> None:
        """Keeps the gate's motion history current on frames skipped by the rate limit."""
        if self.cfg.gating is not None:
            gate(self.cfg.gating, self._gate, thumbnail(image, self.cfg.gating.size), self._background)

    def _mark(self, image: np.ndarray) -> None:
        if self.cfg.gating is not None:
            thumb = thumbnail(image, self.cfg.gating.size)
            self._gate.reference, self._gate.previous, self._gate.changed = thumb, thumb, False
