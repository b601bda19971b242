"""Pure helpers between protobuf answers and what the templates show: labels, shifts, boxes, filters, CSV rows."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from edgeinspect.services.common.findings import ok_cut
from edgeinspect.v1 import inspection_pb2

VERDICTS = {"": 0, "ok": inspection_pb2.VERDICT_OK, "defect": inspection_pb2.VERDICT_DEFECT,
            "uncertain": inspection_pb2.VERDICT_UNCERTAIN}  # fmt: skip
REVIEW_FILTERS = {"": 0, "reviewed": inspection_pb2.REVIEW_FILTER_REVIEWED,
                  "unreviewed": inspection_pb2.REVIEW_FILTER_UNREVIEWED,
                  "disagreed": inspection_pb2.REVIEW_FILTER_DISAGREED}  # fmt: skip
CSV_COLUMNS = [
    "report_id", "created_time", "station", "part", "camera_id", "verdict", "defect_classes", "description",
    "reviewed_verdict", "reviewed_classes", "reviewer", "review_agrees", "image_sha256",
]  # fmt: skip
FILTER_FIELDS = ("station", "part", "camera_id", "verdict", "defect_class", "review", "since", "until")


def verdict_label(verdict: int) -> str:
    return inspection_pb2.Verdict.Name(verdict).removeprefix("VERDICT_") if verdict else "-"


def shift_start(now: datetime, start_hour: int, hours: int) -> datetime:
    """The start of the shift `now` falls in: shifts of `hours` begin at start_hour and every `hours` after it."""
    anchor = now.replace(hour=start_hour, minute=0, second=0, microsecond=0)
    if anchor > now:
        anchor -= timedelta(days=1)
    return anchor + timedelta(hours=hours * ((now - anchor) // timedelta(hours=hours)))


def local_time(ts: Timestamp) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return ts.ToDatetime().replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S") + " UTC"


@dataclass(frozen=True)
class Box:
    label: str
    style: str  # CSS position in percent of the frame


def defect_boxes(report: inspection_pb2.DefectReport) -> list[Box]:
    """Defects that carry coordinates, as CSS boxes over the frame (clamped to it)."""
    boxes = []
    for d in report.defects:
        if not d.HasField("box") or d.box.width <= 0 or d.box.height <= 0:
            continue
        x, y = min(max(d.box.x, 0.0), 1.0), min(max(d.box.y, 0.0), 1.0)
        w, h = min(d.box.width, 1.0 - x), min(d.box.height, 1.0 - y)
        style = f"left:{x * 100:.2f}%;top:{y * 100:.2f}%;width:{w * 100:.2f}%;height:{h * 100:.2f}%"
        boxes.append(Box(f"{d.defect_class} ({d.severity})" if d.severity else d.defect_class, style))
    return boxes


def gate_facts(report: inspection_pb2.DefectReport) -> dict | None:
    """The anomaly gate's finding as the report page shows it (None: the station's policy was off)."""
    if not report.HasField("anomaly"):
        return None
    a = report.anomaly
    decided = inspection_pb2.DecidedBy.Name(a.decided_by).removeprefix("DECIDED_BY_")
    return {
        "decided_by": {"GATE": "the anomaly gate", "GATE_AND_VLM": "the gate and the VLM", "VLM": "the VLM"}.get(
            decided, "-"
        ),
        "policy": a.policy or "-",
        "score": f"{a.score:.4g}" if a.bank_id else "-",
        # The OK cut, not the threshold inside the band: a score at or past it is not OK.
        "ok_cut": f"{ok_cut(a):.4g}" if a.bank_id else "-",
        "over": a.bank_id != "" and a.score >= ok_cut(a),
        "bank": a.bank_id or "-",
        "heatmap": a.heatmap_stored,
        "note": a.note,
        "part": report.part,
    }


def staged_version(value: str) -> dict | None:
    """A redirect's `staged=PART:VERSION` as the report page's promote form needs it (None: nothing staged)."""
    part, _, version = value.rpartition(":")
    if not part or not version.isdigit() or len(part) > 64:
        return None
    return {"part": part, "version": int(version)}


def parse_time(value: str) -> Timestamp | None:
    """A filter's datetime-local / ISO value as a Timestamp (naive = UTC); ValueError when it is not one."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value)
    ts = Timestamp()
    ts.FromDatetime(parsed)  # naive: taken as UTC
    return ts


def list_request(
    params: dict[str, str], page_size: int = 50, page_token: str = ""
) -> inspection_pb2.ListReportsRequest:
    """The list page's query parameters as a ListReportsRequest; ValueError names a bad one."""
    verdict, review = params.get("verdict", ""), params.get("review", "")
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(v for v in VERDICTS if v)}")
    if review not in REVIEW_FILTERS:
        raise ValueError(f"review must be one of {', '.join(v for v in REVIEW_FILTERS if v)}")
    request = inspection_pb2.ListReportsRequest(
        station=params.get("station", ""),
        part=params.get("part", ""),
        camera_id=params.get("camera_id", ""),
        defect_class=params.get("defect_class", ""),
        verdict=VERDICTS[verdict],
        review=REVIEW_FILTERS[review],
        page_size=page_size,
        page_token=page_token,
    )
    for name in ("since", "until"):
        try:
            ts = parse_time(params.get(name, ""))
        except ValueError as exc:
            raise ValueError(f"{name} must be a date and time such as 2026-12-01T06:00") from exc
        if ts is not None:
            getattr(request, name).CopyFrom(ts)
    return request


def classes_of(report: inspection_pb2.DefectReport) -> list[str]:
    return sorted({d.defect_class for d in report.defects if d.defect_class})


def csv_row(report: inspection_pb2.DefectReport) -> list[str]:
    review = report.review if report.HasField("review") else None
    return [
        report.report_id,
        report.created_time.ToJsonString() if report.HasField("created_time") else "",
        report.station,
        report.part,
        report.camera_id,
        verdict_label(report.verdict),
        ";".join(classes_of(report)),
        report.description,
        verdict_label(review.verdict) if review else "",
        ";".join(review.defect_classes) if review else "",
        review.reviewer if review else "",
        ("yes" if review.agrees else "no") if review else "",
        report.image_sha256,
    ]


def to_csv(reports: Iterable[inspection_pb2.DefectReport]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_COLUMNS)
    for report in reports:
        writer.writerow(csv_row(report))
    return buf.getvalue()


def shift_counts(counts: inspection_pb2.AggregateReportsResponse) -> dict[str, dict[str, int]]:
    """station -> {"ok", "ng", "uncertain", "total"} from a one-bucket aggregate."""
    out: dict[str, dict[str, int]] = {}
    for c in counts.counts:
        cell = out.setdefault(c.station, {"ok": 0, "ng": 0, "uncertain": 0, "total": 0})
        cell["ok"] += c.by_verdict.get("VERDICT_OK", 0)
        cell["ng"] += c.by_verdict.get("VERDICT_DEFECT", 0)
        cell["uncertain"] += c.by_verdict.get("VERDICT_UNCERTAIN", 0)
        cell["total"] += c.total
    return out
