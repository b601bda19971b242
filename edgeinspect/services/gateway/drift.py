"""The drift watch: the anomaly scores of the parts the gate passed, per station and part, against the OK cut.

Overkill climbs when good parts' scores creep toward the OK cut (a lens going soft, new lighting, a supplier's
material, a worn fixture) long before they cross it. The watch keeps each (station, part)'s recent passed scores
for the bank in force, and says `drifting` once their 90th percentile reaches WARN_RATIO of the OK cut (cleared
under CLEAR_RATIO, so one noisy frame does not flap it). It says so in the log, in Prometheus
(`edgeinspect_anomaly_good_score_p90_ratio`, `edgeinspect_anomaly_drift`: alert on it) and in GetClusterStatus
(`edgeinspect status`), and tells the line on MQTT once per flip, either way (`DriftState.changed`: the gateway
queues `alert(state)` for the MQTT output, services/outputs). A new bank version starts the window afresh: its
OK cut is another scale, and a station that was drifting is cleared (re-teaching is the usual remedy).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
from prometheus_client import Gauge

from edgeinspect.services.outputs.result import DriftAlert

log = logging.getLogger(__name__)

WINDOW = 100  # passed frames per (station, part) the percentile is taken over
MIN_FRAMES = 20  # fewer: no verdict on drift yet
WARN_RATIO = 0.8  # p90 of passed scores / the OK cut at which good parts are said to drift toward the cut
CLEAR_RATIO = 0.75

P90_RATIO = Gauge(
    "edgeinspect_anomaly_good_score_p90_ratio",
    "90th percentile of the anomaly scores of recently passed frames over the OK cut (1: at the cut)",
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
    ok_cut: float
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
    ok_cut: float
    p50: float  # median of the window's scores; 0 until MIN_FRAMES
    p90: float  # 0 until MIN_FRAMES
    changed: bool = False  # drifting flipped with this frame: the line is told (alert)


class DriftWatch:
    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _Series] = {}

    def observe(self, station: str, part: str, bank_id: str, score: float, ok_cut: float) -> DriftState:
        """Records one passed frame's score; returns the (station, part)'s state after it."""
        key = (station, part)
        series = self._series.get(key)
        was = series is not None and series.drifting
        if series is None or series.bank_id != bank_id:
            series = self._series[key] = _Series(bank_id, ok_cut)
            if was:
                log.info("station %s part %s: bank %s in force; its drift watch starts afresh", station, part, bank_id)
                P90_RATIO.labels(station=station, part=part).set(0.0)
                DRIFTING.labels(station=station, part=part).set(0)
        series.scores.append(score)
        state = self._state(key, series)
        if state.frames >= MIN_FRAMES:
            series.drifting = state.p90_ratio >= WARN_RATIO or (was and state.p90_ratio >= CLEAR_RATIO)
            if series.drifting != was:
                say = log.warning if series.drifting else log.info
                say("station %s part %s: good parts' anomaly scores %s (p90 %.0f%% of the OK cut over %d frames, "
                    "bank %s)", station, part, "drift toward the OK cut" if series.drifting else "are back clear of "
                    "the OK cut", 100 * state.p90_ratio, state.frames, bank_id)  # fmt: skip
            P90_RATIO.labels(station=station, part=part).set(state.p90_ratio)
            DRIFTING.labels(station=station, part=part).set(int(series.drifting))
        return replace(state, drifting=series.drifting, changed=series.drifting != was)

    def states(self) -> list[DriftState]:
        return [self._state(key, series) for key, series in sorted(self._series.items())]

    @staticmethod
    def _state(key: tuple[str, str], series: _Series) -> DriftState:
        n = len(series.scores)
        p50, p90 = np.percentile(series.scores, [50, 90]).tolist() if n >= MIN_FRAMES else (0.0, 0.0)
        return DriftState(
            station=key[0],
            part=key[1],
            bank_id=series.bank_id,
            frames=n,
            p90_ratio=round(p90 / series.ok_cut, 4) if n >= MIN_FRAMES else 0.0,
            drifting=series.drifting,
            ok_cut=series.ok_cut,
            p50=round(p50, 6),
            p90=round(p90, 6),
        )


def alert(state: DriftState) -> DriftAlert:
    """The line's message for a state whose drifting just flipped (`state.changed`)."""
    return DriftAlert(
        station=state.station,
        part=state.part,
        bank_id=state.bank_id,
        drifting=state.drifting,
        frames=state.frames,
        p50=state.p50,
        p90=state.p90,
        ok_cut=state.ok_cut,
        p90_ratio=state.p90_ratio,
        time=time.time(),
    )
