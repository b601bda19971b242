"""People's reviews of stored reports: each review is a row of its own beside the model's untouched report, and a
report read from the store carries its latest review. The SQL here runs inside ReportStore's lock (and, for writes,
its transaction), on SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
import time
import uuid

from edgeinspect.errors import InvalidInput
from edgeinspect.services.store.database import Database
from edgeinspect.services.store.queries import MAX_CLASS_CHARS
from edgeinspect.services.store.schema import report_classes
from edgeinspect.v1 import inspection_pb2
from edgeinspect.v1.inspection_pb2 import DefectReport, Review

MAX_REVIEW_CLASSES = 16
MAX_COMMENT_CHARS = 2000
_REVIEW_VERDICTS = (inspection_pb2.VERDICT_OK, inspection_pb2.VERDICT_DEFECT)


def review_classes(verdict: int, classes: list[str], comment: str) -> list[str]:
    """The reviewer's classes normalised (lower case, sorted, unique); InvalidInput for a review that cannot be."""
    if verdict not in _REVIEW_VERDICTS:
        raise InvalidInput("a review's verdict is VERDICT_OK or VERDICT_DEFECT")
    if len(classes) > MAX_REVIEW_CLASSES or any(len(c) > MAX_CLASS_CHARS for c in classes):
        raise InvalidInput(f"at most {MAX_REVIEW_CLASSES} defect classes of at most {MAX_CLASS_CHARS} characters")
    if len(comment) > MAX_COMMENT_CHARS:
        raise InvalidInput(f"comment is {len(comment)} characters; at most {MAX_COMMENT_CHARS}")
    wanted = sorted({c.strip().lower() for c in classes if c.strip()})
    if verdict == inspection_pb2.VERDICT_OK and wanted:
        raise InvalidInput("an OK review names no defect classes")
    return wanted


def new_review(
    model: DefectReport,
    verdict: inspection_pb2.Verdict,
    classes: list[str],
    comment: str,
    reviewer: str,
    reviewer_role: str,
) -> Review:
    """A review of the model's finished report, stamped now; a DEFECT review naming no class takes the model's."""
    wanted = review_classes(verdict, classes, comment)
    model_classes = report_classes(model)
    if verdict == inspection_pb2.VERDICT_DEFECT and not wanted:
        wanted = model_classes
    review = Review(
        review_id=uuid.uuid4().hex,
        report_id=model.report_id,
        verdict=verdict,
        defect_classes=wanted,
        comment=comment,
        reviewer=reviewer,
        reviewer_role=reviewer_role,
        model_verdict=model.verdict,
        model_defect_classes=model_classes,
        agrees=verdict == model.verdict and wanted == model_classes,
    )
    review.created_time.FromMicroseconds(time.time_ns() // 1000)
    return review


def insert(db: Database, review: Review) -> None:
    """Stores the review and marks its report reviewed (and whether the reviewer disagreed); in a transaction."""
    db.execute(
        "INSERT INTO reviews (review_id, report_id, verdict, classes, comment, reviewer, reviewer_role, "
        "created_us, agrees) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            review.review_id,
            review.report_id,
            review.verdict,
            json.dumps(list(review.defect_classes)),
            review.comment,
            review.reviewer,
            review.reviewer_role,
            review.created_time.ToMicroseconds(),
            int(review.agrees),
        ),
    )
    db.execute(
        "UPDATE reports SET reviewed = 1, disagreed = ? WHERE report_id = ?", (int(not review.agrees), review.report_id)
    )


def attach_latest(db: Database, reports: list[DefectReport]) -> None:
    """Sets each report's `review` to its latest one (reports nobody reviewed keep an empty one)."""
    if not reports:
        return
    by_id = {r.report_id: r for r in reports}
    marks = ",".join("?" * len(by_id))
    rows = db.execute(
        "SELECT review_id, report_id, verdict, classes, comment, reviewer, reviewer_role, created_us, agrees "
        f"FROM reviews WHERE report_id IN ({marks}) ORDER BY created_us, review_id",
        tuple(by_id),
    ).fetchall()
    for review_id, report_id, verdict, classes, comment, reviewer, role, created_us, agrees in rows:
        report = by_id[report_id]  # later rows overwrite: the latest review wins
        report.review.Clear()
        report.review.MergeFrom(
            Review(
                review_id=review_id,
                report_id=report_id,
                verdict=verdict,
                defect_classes=json.loads(classes),
                comment=comment,
                reviewer=reviewer,
                reviewer_role=role,
                model_verdict=report.verdict,
                model_defect_classes=report_classes(report),
                agrees=bool(agrees),
            )
        )
        report.review.created_time.FromMicroseconds(created_us)
