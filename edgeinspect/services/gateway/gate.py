"""The anomaly gate's step in an inspection: per-station policy, Score on the vision node, and how its outcome meets
the VLM's report. The gate decides where and whether; the VLM explains what and why; good parts never wait for it.

Policies (GatewayAnomalySettings, per station):
- gate: Score first. OK -> an OK report at once, no decoder step. DEFECT / UNCERTAIN -> the VLM path with the
  flagged regions named in its prompt; the final verdict is never OK unless the station lets the VLM clear it.
- vlm: today's path; Score runs alongside Encode and its finding is recorded (decided_by VLM).
- off: no Score.
A part with no bank (or a bank the vision node refused) runs the VLM path whatever the policy, and the report's
AnomalyFinding.note says why. A Score that fails under `gate` answers UNAVAILABLE unless the station says
vlm_when_gate_fails (then the VLM decides and the note says so).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from edgeinspect.errors import DeadlineExceeded, InvalidInput, Unavailable
from edgeinspect.services.common.errors import error_code_of, status_for
from edgeinspect.services.gateway.replicas.clients import BANK_VERSION_CODE, VisionClient
from edgeinspect.services.gateway.settings import AnomalyPolicy, GatewayAnomalySettings, StationGate
from edgeinspect.v1 import inspection_pb2, stage_pb2, vision_pb2

log = logging.getLogger(__name__)

GATE_PUSHBACK_MS = 2000
GATE_OK, UNCERTAIN = vision_pb2.ANOMALY_VERDICT_OK, vision_pb2.ANOMALY_VERDICT_UNCERTAIN
OK, DEFECT, UNSURE = inspection_pb2.VERDICT_OK, inspection_pb2.VERDICT_DEFECT, inspection_pb2.VERDICT_UNCERTAIN


@dataclass(frozen=True)
class GateOutcome:
    """What the gate said about one frame: a score, or a note saying why there is none."""

    station: StationGate
    score: vision_pb2.AnomalyScore | None = None
    note: str = ""
    unknown_part: bool = False  # under `gate`, a part no vision node holds a bank for: never OK without a person

    @property
    def policy(self) -> AnomalyPolicy:
        return self.station.policy

    @property
    def decides_ok(self) -> bool:
        """A good part under `gate`: answered without the VLM."""
        return self.policy is AnomalyPolicy.gate and self.score is not None and self.score.verdict == GATE_OK

    def required_score(self) -> vision_pb2.AnomalyScore:
        """The score of a frame the gate scored (one it passed or flagged: the caller has checked which)."""
        if self.score is None:
            raise ValueError(f"the anomaly gate has no score for this frame ({self.note or 'no note'})")
        return self.score

    @property
    def flagged(self) -> bool:
        """Under `gate`, a frame the gate did not pass: the VLM explains it and may not simply clear it."""
        return self.policy is AnomalyPolicy.gate and self.score is not None and self.score.verdict != GATE_OK

    @property
    def decides_at_takt(self) -> bool:
        """A flagged frame whose verdict the VLM cannot change (the station does not let it clear one): the gate's
        decision goes to the line at once and the VLM's explanation completes the report after (explain.py)."""
        return self.flagged and not self.station.vlm_may_clear


class GateStep:
    """The gateway's side of the gate: Score on a vision replica holding the part's newest bank (clients.py checks
    the bank version across replicas like a checkpoint fingerprint)."""

    def __init__(self, cfg: GatewayAnomalySettings, vision: VisionClient) -> None:
        self.cfg, self.vision = cfg, vision

    def learned(self, part: str, bank_id: str) -> None:
        """A Teach through this gateway published `bank_id`: expect it from now on."""
        self.vision.learned(part, bank_id)

    async def score(self, req: inspection_pb2.InspectRequest, timeout_s: float) -> GateOutcome:
        """The gate's outcome for one frame under its station's policy (raises only what should fail the
        inspection: a bad image, or the gate unavailable under `gate` without the VLM fallback)."""
        station = self.cfg.for_station(req.station)
        if station.policy is AnomalyPolicy.off or req.verification:
            return GateOutcome(station)
        if not req.part:
            return GateOutcome(station, note="no part named: the anomaly gate scores per part; the VLM decided")
        call = vision_pb2.ScoreRequest(image=req.image, part=req.part, heatmap=self.cfg.heatmaps)
        try:
            return GateOutcome(station, await self.vision.score(call, timeout_s))
        except grpc.aio.AioRpcError as exc:
            return self._without_score(station, req, exc.code(), exc.details() or "", error_code_of(exc))
        except (Unavailable, DeadlineExceeded) as exc:  # no replica usable for this part's bank
            return self._without_score(station, req, status_for(exc), str(exc), "")

    def _without_score(
        self,
        station: StationGate,
        req: inspection_pb2.InspectRequest,
        code: grpc.StatusCode,
        details: str,
        error_code: str,
    ) -> GateOutcome:
        part = req.part
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            raise InvalidInput(f"the vision node cannot read the image: {details}") from None
        named = req.station in self.cfg.stations
        if code is grpc.StatusCode.NOT_FOUND and station.policy is AnomalyPolicy.gate and named:
            # At a station configured by name to gate (not the plant-wide default, under which nothing changes
            # until a part is taught), a misspelled or untaught part is described by the VLM but never passed.
            known = ", ".join(sorted(self.vision.newest)) or "none yet"
            note = (f"no anomaly bank for part {part!r} (parts with a bank: {known}): the VLM described it and a "
                    "person decides; teach the part or fix its name")  # fmt: skip
            return GateOutcome(station, note=note, unknown_part=True)
        if code is grpc.StatusCode.NOT_FOUND:
            return GateOutcome(station, note=f"no anomaly bank for part {part} yet: the VLM decided")
        if code is grpc.StatusCode.UNIMPLEMENTED:
            return GateOutcome(station, note="the vision node serves no anomaly gate: the VLM decided")
        if code is grpc.StatusCode.FAILED_PRECONDITION and error_code != BANK_VERSION_CODE:
            # A bank the node refused (taught with other features) or the gate switched off on the node.
            return GateOutcome(station, note=f"anomaly gate not usable for part {part}: {details}; the VLM decided")
        why = f"{code.name}: {details}" if details else code.name
        if station.policy is AnomalyPolicy.gate and not station.vlm_when_gate_fails:
            log.warning("anomaly gate failed for part %s: %s", part, why)
            raise Unavailable(
                f"the anomaly gate could not score this frame ({why}); retry shortly", retry_after_ms=GATE_PUSHBACK_MS
            ) from None
        return GateOutcome(station, note=f"anomaly gate failed ({why}): the VLM decided")


# -- how the gate's outcome meets the report (pure) -----------------------------------------------------------------


def where_in_words(region: vision_pb2.AnomalyRegion | inspection_pb2.BoundingBox) -> str:
    """'upper left (x 10-25%, y 5-20% of the frame)': a region as the VLM's prompt and the operator read it."""
    cx, cy = region.x + region.width / 2, region.y + region.height / 2
    row = "upper" if cy < 1 / 3 else "lower" if cy > 2 / 3 else "middle"
    col = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "center"
    place = "center" if (row, col) == ("middle", "center") else f"{row} {col}"
    x0, x1 = round(100 * region.x), round(100 * (region.x + region.width))
    y0, y1 = round(100 * region.y), round(100 * (region.y + region.height))
    return f"{place} (x {x0}-{x1}%, y {y0}-{y1}% of the frame)"


def gate_instruction(score: vision_pb2.AnomalyScore) -> str:
    """The sentence a flagged frame's prompt gains: where the gate saw something, so the VLM looks there."""
    places = "; ".join(where_in_words(r) for r in score.regions) or "no single region (the whole frame is unusual)"
    return (
        f"An anomaly detector taught from good parts flagged this frame (score {score.score:.3g}, OK cut "
        f"{score.band_low:.3g}) at: {places}. Look there: classify and describe the defect against the specifications."
    )


def combine(gate: int, vlm: int, may_clear: bool) -> tuple[inspection_pb2.Verdict, str]:
    """The final verdict of a frame the gate flagged (gate: AnomalyVerdict, vlm: Verdict) and why, when the VLM's
    own verdict was not kept. Above the band the gate is sure: DEFECT unless the station lets the VLM clear it;
    inside the band the VLM's DEFECT stands and anything else stays UNCERTAIN for a person."""
    if vlm == DEFECT:
        return DEFECT, ""
    if vlm == OK and may_clear:
        return OK, "the anomaly gate flagged this frame; the VLM found no defect and this station lets it clear one"
    if gate == UNCERTAIN:
        said = "no defect" if vlm == OK else "no clear defect"
        return UNSURE, f"the anomaly gate scored this frame inside its uncertainty band; the VLM saw {said}"
    said = "no defect" if vlm == OK else "no clear defect"
    return DEFECT, (
        f"the anomaly gate flagged this frame above its band; the VLM saw {said} and this station does not let "
        "the VLM clear a flagged frame"
    )


def boxes(score: vision_pb2.AnomalyScore) -> list[inspection_pb2.BoundingBox]:
    return [inspection_pb2.BoundingBox(x=r.x, y=r.y, width=r.width, height=r.height) for r in score.regions]


def finding(
    outcome: GateOutcome, decided_by: inspection_pb2.DecidedBy, heatmap_stored: bool
) -> inspection_pb2.AnomalyFinding:
    out = inspection_pb2.AnomalyFinding(
        decided_by=decided_by, policy=outcome.policy.value, note=outcome.note, heatmap_stored=heatmap_stored
    )
    if outcome.score is not None:
        s = outcome.score
        out.score, out.threshold, out.bank_id, out.extractor_fingerprint = (
            s.score,
            s.threshold,
            s.bank_id,
            s.extractor_fingerprint,
        )
        out.ok_cut, out.defect_cut = s.band_low, s.band_high
        out.regions.extend(boxes(s))
    return out


def settle(report: inspection_pb2.DefectReport, outcome: GateOutcome, heatmap_stored: bool) -> None:
    """Applies the gate's outcome to a VLM report: the finding, the verdict rule for flagged frames, and the gate's
    regions as defect boxes where the VLM gave none."""
    if outcome.policy is AnomalyPolicy.off:
        return
    if outcome.unknown_part and report.verdict != DEFECT:
        report.verdict = UNSURE
        report.verdict_reason = "; ".join(x for x in (outcome.note, report.verdict_reason) if x)
    flagged = outcome.flagged
    decided_by = inspection_pb2.DECIDED_BY_GATE_AND_VLM if flagged else inspection_pb2.DECIDED_BY_VLM
    report.anomaly.CopyFrom(finding(outcome, decided_by, heatmap_stored))
    if not flagged:
        return
    score = outcome.required_score()
    verdict, reason = combine(score.verdict, report.verdict, outcome.station.vlm_may_clear)
    if verdict != report.verdict or reason:
        report.verdict = verdict
        report.verdict_reason = "; ".join(x for x in (reason, report.verdict_reason) if x)
    if verdict == OK or any(d.HasField("box") for d in report.defects):
        return
    for i, defect in enumerate(anomaly_defects(score)):
        if i < len(report.defects):
            report.defects[i].box.CopyFrom(defect.box)
        else:
            report.defects.append(defect)


def anomaly_defects(score: vision_pb2.AnomalyScore) -> list[inspection_pb2.Defect]:
    """The gate's regions as defects of class `anomaly` (boxes, where in words, the score as evidence)."""
    evidence = f"anomaly gate score {score.score:.3g}, OK cut {score.band_low:.3g}"
    return [
        inspection_pb2.Defect(defect_class="anomaly", location=where_in_words(region), evidence=evidence, box=box)
        for region, box in zip(score.regions, boxes(score), strict=True)
    ]


def _gate_report(
    req: inspection_pb2.InspectRequest, report_id: str, outcome: GateOutcome, **fields
) -> inspection_pb2.DefectReport:
    """A report the gate decided alone (fields: verdict, description, ids, model, timings): the request's ids, the
    finding, the times."""
    report = inspection_pb2.DefectReport(
        report_id=report_id,
        idempotency_key=req.idempotency_key,
        station=req.station,
        part=req.part,
        camera_id=req.camera_id,
        anomaly=finding(outcome, inspection_pb2.DECIDED_BY_GATE, False),  # the store sets heatmap_stored
        **fields,
    )
    report.created_time.GetCurrentTime()
    if req.HasField("capture_time"):
        report.capture_time.CopyFrom(req.capture_time)
    return report


def ok_report(
    req: inspection_pb2.InspectRequest, report_id: str, outcome: GateOutcome, **fields
) -> inspection_pb2.DefectReport:
    """The report of a good part the gate passed: OK, its finding, and no VLM text (fields: ids, model, timings)."""
    score = outcome.required_score()
    description = (
        f"The anomaly gate found this frame within the part's good set (score {score.score:.3g} below the OK cut "
        f"{score.band_low:.3g}, bank {score.bank_id}): a good part, no VLM report was made."
    )
    return _gate_report(req, report_id, outcome, verdict=OK, description=description, **fields)


def decided_verdict(gate_verdict: int) -> tuple[inspection_pb2.Verdict, str]:
    """A flagged frame's verdict before the VLM has spoken: DEFECT above the band, UNCERTAIN inside it (for a
    person); what combine() gives for a VLM that sees no defect, so the explanation never contradicts the line."""
    if gate_verdict == UNCERTAIN:
        return UNSURE, "the anomaly gate scored this frame inside its uncertainty band (decided at takt)"
    return DEFECT, "the anomaly gate flagged this frame above its band (decided at takt)"


def decision_report(
    req: inspection_pb2.InspectRequest, report_id: str, outcome: GateOutcome, **fields
) -> inspection_pb2.DefectReport:
    """The report of a flagged frame decided at takt: the gate's verdict, its regions as anomaly defects, and the
    explanation PENDING (fields: ids, model, timings). The VLM's explanation completes it (explain.py)."""
    score = outcome.required_score()
    verdict, reason = decided_verdict(score.verdict)
    places = "; ".join(where_in_words(r) for r in score.regions) or "the whole frame"
    description = (
        f"The anomaly gate flagged this frame (score {score.score:.3g}, OK cut {score.band_low:.3g}, "
        f"bank {score.bank_id}) at: {places}. The verdict went to the line at once; the VLM's explanation "
        "completes this report."
    )
    return _gate_report(
        req, report_id, outcome, verdict=verdict, verdict_reason=reason, description=description,
        defects=anomaly_defects(score), explanation=inspection_pb2.EXPLANATION_PENDING, **fields,
    )  # fmt: skip


def timing(outcome: GateOutcome, t0: float) -> list[stage_pb2.StageTiming]:
    """The gate's line in the report's timings: Score's compute, and the rest of the wait (wire, queue)."""
    if outcome.score is None:
        return []
    ms = outcome.score.score_ms
    wait = max(0.0, (time.perf_counter() - t0) * 1e3 - ms)
    return [stage_pb2.StageTiming(stage="anomaly_gate", compute_ms=ms, wire_ms=wait)]
