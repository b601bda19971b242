"""Operator reviews as a labelled set: every reviewed report (its latest review is the label) whose frame the
gateway still keeps becomes a Sample, its frame downloaded into the output folder. `edgeinspect eval reviews:`
(or `reviews:STATION`). Shadow reports are never labels: they were never what the line saw."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.errors import InvalidInput
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.evaluation.datasets import DEFECT, GOOD, Sample, normalise_class
from edgeinspect.v1 import inspection_pb2

PREFIX = "reviews:"
FRAMES_DIR = "reviewed-frames"
_SUFFIX = {"image/jpeg": ".jpg", "image/png": ".png", "image/bmp": ".bmp", "image/webp": ".webp"}


def is_reviews(dataset: str) -> bool:
    return str(dataset).startswith(PREFIX)


def load_reviews(
    client: InspectionClient, dataset: str, out: Path, part: str = "", class_map: dict | None = None
) -> tuple[list[Sample], int]:
    """(samples, reviewed reports skipped because their frame expired or was never kept)."""
    station = str(dataset)[len(PREFIX) :]
    frames = out / FRAMES_DIR
    frames.mkdir(parents=True, exist_ok=True)
    samples, skipped, token = [], 0, ""
    while True:
        resp = client.call(
            "ListReports",
            inspection_pb2.ListReportsRequest(
                station=station,
                part=part,
                review=inspection_pb2.REVIEW_FILTER_REVIEWED,
                page_size=500,
                page_token=token,
            ),
            timeout_s=60,
        )
        for report in resp.reports:
            if report.model.shadow or report.review.verdict not in (
                inspection_pb2.VERDICT_OK,
                inspection_pb2.VERDICT_DEFECT,
            ):
                continue
            path = _frame(client, report, frames)
            if path is None:
                skipped += 1
                continue
            good = report.review.verdict == inspection_pb2.VERDICT_OK
            classes = (
                () if good else tuple(sorted({normalise_class(c, class_map) for c in report.review.defect_classes}))
            )
            rel = f"{FRAMES_DIR}/{path.name}"
            samples.append(Sample(path, rel, GOOD if good else DEFECT, classes, report.part))
        token = resp.next_page_token
        if not token:
            break
    if not samples:
        where = f" at station {station!r}" if station else ""
        raise InvalidInput(f"no reviewed reports with a kept frame{where}" + (f" for part {part!r}" if part else ""))
    return sorted(samples, key=lambda s: s.rel), skipped


def _frame(client: InspectionClient, report: inspection_pb2.DefectReport, folder: Path) -> Path | None:
    """The report's frame as a file named by the report id (downloaded once); None when the gateway has none."""
    for existing in folder.glob(f"{report.report_id}.*"):
        if existing.suffix != ".part":
            return existing
    image = client.call(
        "GetReportImage", inspection_pb2.GetReportImageRequest(report_id=report.report_id), timeout_s=60
    )
    if image.state != inspection_pb2.IMAGE_STATE_STORED or not image.data:
        return None
    path = folder / f"{report.report_id}{_SUFFIX.get(image.media_type, '.img')}"
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_bytes(image.data)
    tmp.replace(path)  # a killed download never leaves a half frame under the final name
    return path
