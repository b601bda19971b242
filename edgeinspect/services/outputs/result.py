"""The one result contract every output sends: a compact JSON view of a stored DefectReport; and the drift alert
the MQTT output sends beside it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from edgeinspect.services.common.findings import ok_cut

DECIDED, EXPLAINED = "decided", "explained"  # LineResult.event
DRIFT = "drift"  # DriftAlert.event
SEVERITY_ORDER = ("critical", "major", "minor")  # worst first; unknown severities rank below these


@dataclass(frozen=True)
class LineResult:
    report_id: str
    station: str
    camera: str
    part: str
    verdict: str  # OK / DEFECT / UNCERTAIN
    classes: tuple[str, ...]  # defect classes, worst first
    severity: str  # the worst defect's severity ("" for none)
    capture_time: float | None  # unix seconds; None when the caller sent none
    created_time: float  # unix seconds the gateway stored the report
    latency_ms: float | None  # capture -> stored
    line: dict = field(default_factory=dict)  # ingest-hosted: cycle id, lot, what the line was told
    # The anomaly gate's finding (score, ok_cut, threshold, bank, decided_by, regions as [x, y, w, h] fractions);
    # empty when the station's policy is off.
    anomaly: dict = field(default_factory=dict)
    # Decide at takt, explain after: "decided" (the verdict, its explanation to follow), "explained" (the same
    # report completed: the VLM's classes, `explanation` with its state), "" (decided and explained at once).
    # Receivers dedupe by report_id + event.
    event: str = ""
    explanation: dict = field(default_factory=dict)

    @property
    def outbox_key(self) -> str:
        """The outbox row's key: one row per output for a report's result and one for its explanation."""
        return f"{self.report_id}:{EXPLAINED}" if self.event == EXPLAINED else self.report_id

    def to_json(self) -> bytes:
        body = asdict(self)
        body["classes"] = list(self.classes)
        body["capture_time"] = _iso(self.capture_time)
        body["created_time"] = _iso(self.created_time)
        for optional in (
            "line",
            "anomaly",
            "event",
            "explanation",
        ):  # absent rather than empty: older consumers see the same shape
            if not body[optional]:
                del body[optional]
        return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class DriftAlert:
    """A station's good parts' anomaly scores began or ceased to drift toward the OK cut (services/gateway/drift.py):
    sent once per flip, on MQTT only (webhooks take results)."""

    station: str
    part: str
    bank_id: str  # the bank whose OK cut the scores are held against
    drifting: bool  # True: began to drift; False: back clear of the cut (or a new bank started the watch afresh)
    frames: int  # passed frames in the window
    p50: float  # median of their scores (0 under the watch's minimum of frames)
    p90: float  # 90th percentile of their scores (idem)
    ok_cut: float  # below it the gate calls a part OK
    p90_ratio: float  # p90 / ok_cut (1: at the cut)
    time: float  # unix seconds
    event: str = DRIFT

    @property
    def outbox_key(self) -> str:
        """Unique per flip; receivers dedupe a redelivery (at least once) by it (`alert_id`)."""
        return f"{DRIFT}:{self.station}:{self.part}:{self.bank_id}:{int(self.drifting)}:{self.time:.6f}"

    def to_json(self) -> bytes:
        body = asdict(self)
        body["time"] = _iso(self.time)
        body["alert_id"] = self.outbox_key
        return json.dumps(body, separators=(",", ":")).encode()


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def severity_rank(severity: str) -> int:
    s = severity.strip().lower()
    return SEVERITY_ORDER.index(s) if s in SEVERITY_ORDER else len(SEVERITY_ORDER)


def rank_defects(defects: list[tuple[str, str]]) -> tuple[tuple[str, ...], str]:
    """(class, severity) pairs -> (distinct classes worst first, worst severity)."""
    ordered = sorted(defects, key=lambda d: severity_rank(d[1]))
    classes = tuple(dict.fromkeys(c for c, _ in ordered if c))
    return classes, ordered[0][1] if ordered else ""


def is_shadow(report) -> bool:
    """A shadow model's report is stored for comparison only and never reaches the line. The one place that says
    so: every output and the line server ask this."""
    return report.HasField("model") and report.model.shadow


def from_report(report, event: str = "") -> LineResult:
    """DefectReport (protobuf) -> LineResult; event: DECIDED or EXPLAINED for the two moments of a report decided
    at takt."""
    from edgeinspect.v1 import inspection_pb2

    classes, severity = rank_defects([(d.defect_class, d.severity) for d in report.defects])
    capture = report.capture_time.ToNanoseconds() / 1e9 if report.HasField("capture_time") else None
    created = report.created_time.ToNanoseconds() / 1e9
    return LineResult(
        report_id=report.report_id,
        station=report.station,
        camera=report.camera_id,
        part=report.part,
        verdict=inspection_pb2.Verdict.Name(report.verdict).removeprefix("VERDICT_"),
        classes=classes,
        severity=severity,
        capture_time=capture,
        created_time=created,
        latency_ms=None if capture is None else round((created - capture) * 1e3, 1),
        anomaly=anomaly_of(report),
        event=event,
        explanation=explanation_of(report) if event == EXPLAINED else {},
    )


def explanation_of(report) -> dict:
    """The explanation's state as the line sees it: done with the VLM's own verdict, or failed with why."""
    from edgeinspect.v1 import inspection_pb2

    state = inspection_pb2.Explanation.Name(report.explanation).removeprefix("EXPLANATION_").lower()
    out: dict = {"state": state}
    if report.vlm_verdict:
        out["vlm_verdict"] = inspection_pb2.Verdict.Name(report.vlm_verdict).removeprefix("VERDICT_")
    if report.explanation_error:
        out["error"] = report.explanation_error
    return out


def anomaly_of(report) -> dict:
    """The report's AnomalyFinding as the line sees it ({} when there is none)."""
    from edgeinspect.v1 import inspection_pb2

    if not report.HasField("anomaly"):
        return {}
    a = report.anomaly
    out = {"decided_by": inspection_pb2.DecidedBy.Name(a.decided_by).removeprefix("DECIDED_BY_"), "policy": a.policy}
    if a.bank_id:
        regions = [[round(r.x, 4), round(r.y, 4), round(r.width, 4), round(r.height, 4)] for r in a.regions]
        out.update(score=round(a.score, 6), ok_cut=round(ok_cut(a), 6), threshold=round(a.threshold, 6),
                   bank_id=a.bank_id, regions=regions)  # fmt: skip
    if a.note:
        out["note"] = a.note
    return out
