"""The PLC handshake of one station as a pure state machine: inputs and clock in, node values and actions out.

    READY (TriggerReady)  --Trigger rising-->  BUSY (Busy)  --result or deadline-->  RESULT (ResultReady)
      ^                                                                                   |
      +------------- ResultAck rising: outputs cleared, TriggerReady --------------------+
      +------------- no ack within ack_timeout: Error=ack_timeout, TriggerReady ---------+

BUSY always ends: the result deadline writes NG (or recheck) with Error=timeout, so the line never waits on a
stuck Busy, and a result that arrives after it is reported as `late` (the driver links it to its cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import IntEnum, StrEnum

from edgeinspect.services.line.config import Meaning, StationLineConfig


class ErrorCode(IntEnum):
    """The Error output. 0 is no error; every other code comes with NG or recheck, never with OK."""

    none = 0
    timeout = 1  # no result within result_deadline_ms
    unavailable = 2  # the gateway could not be reached
    ack_timeout = 3  # the PLC did not set ResultAck within ack_timeout_ms
    capture_failed = 4  # no frame from the camera
    inspection_failed = 5  # the gateway refused or failed the inspection


class Phase(StrEnum):
    ready = "ready"
    busy = "busy"
    result = "result"


@dataclass(frozen=True)
class Signals:
    """The station's output nodes."""

    trigger_ready: bool = True
    busy: bool = False
    result_ready: bool = False
    result_ok: bool = False
    result_ng: bool = False
    result_recheck: bool = False
    defect_class: str = ""
    report_id: str = ""
    cycle_id: str = ""
    error: int = 0
    # The anomaly gate's finding, for a PLC or HMI that shows where the part failed (-1: no gate score).
    anomaly_score: float = -1.0
    anomaly_threshold: float = -1.0
    decided_by: str = ""  # GATE / VLM / "" (no gate on this station)
    region_count: int = 0
    regions: tuple[float, ...] = ()  # flattened [x, y, w, h] per region, fractions of the frame


FLAGS = ("trigger_ready", "busy", "result_ready")  # handshake flags; the rest is data


def write_order(old: Signals, new: Signals) -> list[tuple[str, object]]:
    """The changed nodes in the order to write them: flags that drop first, then the data, then flags that rise,
    so a PLC that sees ResultReady (or TriggerReady) also sees the data that goes with it."""
    changed = [(f.name, getattr(new, f.name)) for f in fields(Signals) if getattr(old, f.name) != getattr(new, f.name)]
    falling = [(n, v) for n, v in changed if n in FLAGS and not v]
    rising = [(n, v) for n, v in changed if n in FLAGS and v]
    return falling + [(n, v) for n, v in changed if n not in FLAGS] + rising


@dataclass(frozen=True)
class Outcome:
    """What one cycle's capture + inspection produced (error set: no usable verdict)."""

    cycle: int
    verdict: str = ""  # OK / DEFECT / UNCERTAIN
    defect_class: str = ""
    report_id: str = ""
    error: ErrorCode = ErrorCode.none
    anomaly: dict = field(default_factory=dict)  # outputs/result.py's anomaly_of view ({} without a gate)


def anomaly_signals(anomaly: dict) -> dict:
    """The gate's finding as the station's anomaly nodes (their defaults when the cycle had no gate score)."""
    regions = [float(v) for box in anomaly.get("regions", ()) for v in box]
    return {
        "anomaly_score": float(anomaly.get("score", -1.0)),
        # The node a PLC compares the score with is the OK cut (at or above it the part is not OK); results from
        # before the OK cut was recorded carry only the threshold.
        "anomaly_threshold": float(anomaly.get("ok_cut", anomaly.get("threshold", -1.0))),
        "decided_by": str(anomaly.get("decided_by", "")),
        "region_count": len(regions) // 4,
        "regions": tuple(regions),
    }


def line_signals(verdict: str, error: ErrorCode, cfg: StationLineConfig) -> tuple[bool, bool, bool]:
    """(ok, ng, recheck) for a result. Fail safe: only a clean OK verdict without an error is OK."""
    if error is ErrorCode.timeout:
        meaning = cfg.on_timeout
    elif error is not ErrorCode.none:
        meaning = Meaning.ng
    elif verdict == "OK":
        return True, False, False
    elif verdict == "UNCERTAIN":
        meaning = cfg.on_uncertain
    else:  # DEFECT, or anything unexpected
        meaning = Meaning.ng
    return False, meaning is Meaning.ng, meaning is Meaning.recheck


@dataclass(frozen=True)
class Start:
    """Action: capture and inspect for this cycle (the driver calls back with an Outcome)."""

    cycle: int
    cycle_id: str


@dataclass(frozen=True)
class Written:
    """Action: the cycle's result is on the line (the driver journals it)."""

    cycle: int
    outcome: Outcome
    signals: Signals
    elapsed_s: float


@dataclass(frozen=True)
class Late:
    """Action: a cycle's real outcome arrived after its deadline had already written NG/timeout."""

    outcome: Outcome


class Handshake:
    def __init__(self, station: str, cfg: StationLineConfig) -> None:
        self.station = station
        self.cfg = cfg
        self.phase = Phase.ready
        self.signals = Signals()
        self.cycle = 0
        self._cycle_id = ""
        self._started_at = 0.0
        self._deadline = 0.0
        self._ack_deadline = 0.0
        self._trigger = False
        self._ack = False
        self.ignored_triggers = 0  # rising edges while not TriggerReady (the PLC skipped the handshake)

    def inputs(self, trigger: bool, ack: bool, now: float, cycle_id: str = "") -> list[Start]:
        """The sampled Trigger and ResultAck; acts on rising edges. `cycle_id` names a cycle started now."""
        trigger_edge, ack_edge = trigger and not self._trigger, ack and not self._ack
        self._trigger, self._ack = trigger, ack
        actions: list[Start] = []
        if ack_edge and self.phase is Phase.result:
            self.phase = Phase.ready
            self.signals = Signals()
        if trigger_edge:
            if self.phase is Phase.ready:
                self.cycle += 1
                self._cycle_id = cycle_id or f"{self.station}:{self.cycle}"
                self.phase = Phase.busy
                self._started_at = now
                self._deadline = now + self.cfg.result_deadline_ms / 1000.0
                self.signals = Signals(trigger_ready=False, busy=True, cycle_id=self._cycle_id)
                actions.append(Start(self.cycle, self._cycle_id))
            else:
                self.ignored_triggers += 1
        return actions

    def outcome(self, outcome: Outcome, now: float) -> list[Written | Late]:
        """A cycle's capture + inspection finished (or failed)."""
        if self.phase is not Phase.busy or outcome.cycle != self.cycle:
            return [Late(outcome)]
        return [self._write(outcome, now)]

    def tick(self, now: float) -> list[Written]:
        """Deadlines: the result budget in BUSY, the ack budget in RESULT."""
        if self.phase is Phase.busy and now >= self._deadline:
            return [self._write(Outcome(self.cycle, error=ErrorCode.timeout), now)]
        if self.phase is Phase.result and now >= self._ack_deadline:
            self.phase = Phase.ready
            self.signals = Signals(error=int(ErrorCode.ack_timeout), cycle_id=self.signals.cycle_id)
        return []

    def _write(self, outcome: Outcome, now: float) -> Written:
        ok, ng, recheck = line_signals(outcome.verdict, outcome.error, self.cfg)
        self.signals = replace(
            self.signals,
            busy=False,
            result_ready=True,
            result_ok=ok,
            result_ng=ng,
            result_recheck=recheck,
            defect_class=outcome.defect_class,
            report_id=outcome.report_id,
            error=int(outcome.error),
            **anomaly_signals(outcome.anomaly),  # every cycle writes them: a stale score never stands
        )
        self.phase = Phase.result
        self._ack_deadline = now + self.cfg.ack_timeout_ms / 1000.0
        return Written(self.cycle, outcome, self.signals, now - self._started_at)
