"""The drift watch: the anomaly scores of the parts the gate passed, per station and part, against the OK cut.

Overkill climbs when good parts' scores creep toward the threshold (a lens going soft, new lighting, a supplier's
material, a worn fixture) long before they cross it. The watch keeps each (station, part)'s recent passed scores
for the bank in force, and says `drifting` once their 90th percentile reaches WARN_RATIO of the threshold (cleared
under CLEAR_RATIO, so one noisy frame does not flap it). It says so in the log, in Prometheus
(`edgeinspect_anomaly_good_score_p90_ratio`, `edgeinspect_anomaly_drift`: alert on it) and in GetClusterStatus
(`edgeinspect status`). A new bank version starts the window afresh: its threshold is another scale.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import Gauge

log = logging.getLogger(__name__)

WINDOW = 100  # passed frames per (station, part) the percentile is taken over
MIN_FRAMES = 20  # fewer: no verdict on drift yet
WARN_RATIO = 0.8  # p90 of passed scores / threshold at which good parts are said to drift toward the cut
CLEAR_RATIO = 0.75

P90_RATIO = Gauge(
    "edgeinspect_anomaly_good_score_p90_ratio",
    "90th percentile of the anomaly scores of recently passed frames over the threshold (1: at the cut)",
    ["station", "part"],
)
DRIFTING = Gauge(
    "edgeinspect_anomaly_drift",
    "1 while good parts' scores drift toward the OK cut (see the p90 ratio)",
    ["station", "part"],
)


@dataclass
class _Series:
    bank_id: str
    threshold: float
    scores: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    drifting: bool = False


@dataclass(frozen=True)
class DriftState:
    station: str
    part: str
    bank_id: str
    frames: int
    p90_ratio: float  # 0 until MIN_FRAMES
    drifting: bool


class DriftWatch:
    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _Series] = {}

    def observe(self, station: str, part: str, bank_id: str, score: float, threshold: float) -> DriftState:
        """Records one passed frame's score; returns the (station, part)'s state after it."""
        key = (station, part)
        series = self._series.get(key)
        if series is None or series.bank_id != bank_id:
            series = self._series[key] = _Series(bank_id, threshold)
        series.scores.append(score)
        state = self._state(key, series)
        if state.frames >= MIN_FRAMES:
            was = series.drifting
            series.drifting = state.p90_ratio >= WARN_RATIO or (was and state.p90_ratio >= CLEAR_RATIO)
            if series.drifting != was:
                say = log.warning if series.drifting else log.info
                say("station %s part %s: good parts' anomaly scores %s (p90 %.0f%% of the threshold over %d frames, "
                    "bank %s)", station, part, "drift toward the OK cut" if series.drifting else "are back clear of "
                    "the OK cut", 100 * state.p90_ratio, state.frames, bank_id)  # fmt: skip
            P90_RATIO.labels(station=station, part=part).set(state.p90_ratio)
            DRIFTING.labels(station=station, part=part).set(int(series.drifting))
            state = self._state(key, series)
        return state

    def states(self) -> list[DriftState]:
        return [self._state(key, series) for key, series in sorted(self._series.items())]

    @staticmethod
    def _state(key: tuple[str, str], series: _Series) -> DriftState:
        n = len(series.scores)
        ratio = float(np.percentile(series.scores, 90)) / series.threshold if n >= MIN_FRAMES else 0.0
        return DriftState(key[0], key[1], series.bank_id, n, round(ratio, 4), series.drifting)
