"""The report store's queries (the servicer's GetReport, ListReports, AggregateReports and GetReportImage, the
teaching tools' reads): finished reports with their latest review, filters and pages (services/store/queries.py),
per-station counts, and a report's frame, thumbnail or heatmap. ReportStore (store.py) is the write path on top of
these reads and owns the connection; both run under its one lock.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from datetime import datetime

from edgeinspect.errors import InvalidInput, NotFound
from edgeinspect.services.gateway.reports import reviews
from edgeinspect.services.gateway.reports.frames import FrameFiles, StoredFrame
from edgeinspect.services.store.claims import FAILED, PENDING, now_us
from edgeinspect.services.store.database import Database
from edgeinspect.services.store.queries import (
    DONE,
    as_us,
    check_id,
    decode_token,
    encode_token,
    filters,
    merge_counts,
    short_id,
)
from edgeinspect.v1 import inspection_pb2
from edgeinspect.v1.inspection_pb2 import DefectReport

DEFAULT_PAGE_SIZE = 50
FULL_ID_CHARS = 32  # uuid4 hex: a shorter id is a prefix
MAX_PAGE_SIZE = 500


@dataclass(frozen=True)
class Attempt:
    report_id: str
    status: str
    reason: str
    previous_attempt_id: str


@dataclass(frozen=True)
class Holder:
    """Another gateway of the pair whose report this is: its frame files are on that gateway's disk."""

    owner: str
    address: str  # its public API's host:port from its heartbeat ('' where it advertises none)
    silent_s: float  # since its last heartbeat
    live: bool  # heard from within the owner lease


@dataclass(frozen=True)
class FrameAnswer:
    state: inspection_pb2.ImageState
    frame: StoredFrame | None = None
    data: bytes = b""
    holder: Holder | None = None  # EXPIRED here, but another gateway's report: that gateway may still hold it


class ReportReader:
    """Reads of finished reports; safe to call from many threads (one connection behind a lock)."""

    def __init__(self, db: Database, owner: str, owner_lease_s: float) -> None:
        """owner: this gateway's name among those sharing the database ('' where it has one gateway); a holder of
        a frame silent for owner_lease_s is no longer live."""
        self._db = db
        self._lock = threading.Lock()
        self.owner = owner
        self.owner_lease_us = int(owner_lease_s * 1_000_000)
        self.frames: FrameFiles | None = None  # this box's frame files (ReportStore sets them from its settings)

    def is_pending(self, report_id: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT status FROM reports WHERE report_id = ?", (report_id,)).fetchone()
        return row is not None and row[0] == PENDING

    def attempts(self, idempotency_key: str) -> list[Attempt]:
        """Every attempt made with a key, oldest first (failed ones say why)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT report_id, status, reason, previous_attempt_id FROM reports WHERE idempotency_key = ? "
                "ORDER BY created_us, report_id",
                (idempotency_key,),
            ).fetchall()
        return [Attempt(*r) for r in rows]

    def resolve(self, given: str) -> str:
        """A report id from the whole id or a unique prefix of it (`reports list` and the console show the first
        12 characters); NotFound when no id starts so, InvalidInput naming the candidates when several do."""
        check_id(given)
        if len(given) >= FULL_ID_CHARS or not given:
            return given
        upper = given[:-1] + chr(ord(given[-1]) + 1)  # the ids that start with `given`, on the primary key's index
        with self._lock:
            rows = self._db.execute(
                "SELECT report_id FROM reports WHERE report_id >= ? AND report_id < ? ORDER BY report_id LIMIT 6",
                (given, upper),
            ).fetchall()
        if not rows:
            raise NotFound(f"no report with id {short_id(given)}")
        if len(rows) > 1:
            shown = ", ".join(r[0][:16] for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
            raise InvalidInput(f"report id {given!r} is ambiguous: it starts {shown}; give more characters")
        return rows[0][0]

    def _get_done(self, report_id: str) -> DefectReport:
        report_id = self.resolve(report_id)
        with self._lock:
            row = self._db.execute(
                "SELECT status, reason, report FROM reports WHERE report_id = ?", (report_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no report with id {short_id(report_id)}")
        status, reason, blob = row
        if status == PENDING:
            raise NotFound(f"no report with id {short_id(report_id)} yet: the inspection is still in progress")
        if status == FAILED:
            raise NotFound(f"no report with id {short_id(report_id)}: the inspection failed ({reason})")
        return DefectReport.FromString(blob)

    def get(self, report_id: str) -> DefectReport:
        """The finished report with its latest review; NotFound when absent, still pending, or failed."""
        report = self._get_done(report_id)
        self._attach_reviews([report])
        return report

    def _attach_reviews(self, reports: list[DefectReport]) -> None:
        with self._lock:
            reviews.attach_latest(self._db, reports)

    def list(
        self,
        *,
        station: str = "",
        part: str = "",
        verdict: int = 0,
        since: datetime | int | None = None,
        until: datetime | int | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str = "",
        camera_id: str = "",
        defect_class: str = "",
        review: int = 0,
    ) -> tuple[list[DefectReport], str]:
        """Finished reports newest first; since is inclusive, until exclusive (datetimes or epoch µs); ("", ...)
        token at the end."""
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidInput(f"page_size must be between 0 and {MAX_PAGE_SIZE} (0 means {DEFAULT_PAGE_SIZE})")
        page_size = page_size or DEFAULT_PAGE_SIZE
        where, args = filters(
            station=station, part=part, camera_id=camera_id, verdict=verdict, defect_class=defect_class,
            review=review, since=since, until=until,
        )  # fmt: skip
        if page_token:
            last_us, last_id = decode_token(page_token)
            where.append("(r.created_us < ? OR (r.created_us = ? AND r.report_id < ?))")
            args += [last_us, last_us, last_id]
        sql = (
            f"SELECT r.created_us, r.report_id, r.report FROM reports r WHERE {' AND '.join(where)} "
            "ORDER BY r.created_us DESC, r.report_id DESC LIMIT ?"
        )
        with self._lock:
            # One extra row tells whether another page exists, so the last page ends with an empty token.
            rows = self._db.execute(sql, (*args, page_size + 1)).fetchall()
        page = rows[:page_size]
        next_token = encode_token(page[-1][0], page[-1][1]) if len(rows) > page_size else ""
        reports = [DefectReport.FromString(blob) for _, _, blob in page]
        self._attach_reviews(reports)
        return reports, next_token

    def aggregate(
        self,
        *,
        station: str = "",
        part: str = "",
        camera_id: str = "",
        since: datetime | int | None = None,
        until: datetime | int | None = None,
        bucket_s: int = 0,
    ) -> list[dict]:
        """Per (station, bucket): total, by verdict name, by class (reports with >= 1 defect of it), reviewed,
        disagreed. Buckets are aligned to multiples of bucket_s since the epoch (UTC); bucket_s=0 is one bucket
        starting at `since` (or the epoch)."""
        if not 0 <= bucket_s <= 100 * 365 * 86400:
            raise InvalidInput("bucket_seconds must lie in [0, 100 years] (0: one bucket)")
        where, args = filters(station=station, part=part, camera_id=camera_id, since=since, until=until)
        if bucket_s:
            b = bucket_s * 1_000_000
            # SQLite's % keeps the dividend's sign: ((x % b) + b) % b is the floor remainder.
            bucket = f"(r.created_us - ((r.created_us % {b}) + {b}) % {b})"
        else:
            bucket = str(as_us(since) if since is not None else 0)
        cond = " AND ".join(where)
        with self._lock:
            verdicts = self._db.execute(
                f"SELECT r.station, {bucket} AS b, r.verdict, COUNT(*), SUM(r.reviewed), SUM(r.disagreed) "
                f"FROM reports r WHERE {cond} GROUP BY r.station, b, r.verdict",
                args,
            ).fetchall()
            classes = self._db.execute(
                f"SELECT r.station, {bucket} AS b, c.defect_class, COUNT(*) FROM reports r "
                f"JOIN report_classes c ON c.report_id = r.report_id WHERE {cond} "
                "GROUP BY r.station, b, c.defect_class",
                args,
            ).fetchall()
        return merge_counts(verdicts, classes)

    def image(self, report_id: str, thumbnail: bool = False, heatmap: bool = False) -> FrameAnswer:
        """The report's frame (or thumbnail, or the anomaly gate's heatmap over it): STORED with bytes, EXPIRED
        after retention, NOT_STORED when none was kept. EXPIRED with a holder: the files are not on this box and the
        report is another gateway's of the pair (frames.dir is per box unless the pair shares one)."""
        check_id(report_id)
        with self._lock:
            row = self._db.execute(
                "SELECT r.status, r.frame_sha256, f.nbytes, f.media_type, f.width, f.height, r.report, r.owner, "
                "g.address, g.seen_us FROM reports r LEFT JOIN frames f ON f.sha256 = r.frame_sha256 "
                "LEFT JOIN gateways g ON g.owner = r.owner WHERE r.report_id = ?",
                (report_id,),
            ).fetchone()
        if row is None or row[0] != DONE:
            raise NotFound(f"no report with id {short_id(report_id)}")
        _, sha, nbytes, kind, width, height, blob, owner, address, seen_us = row
        if not sha:
            return FrameAnswer(inspection_pb2.IMAGE_STATE_NOT_STORED)
        frame = StoredFrame(sha, nbytes or 0, kind or "", width or 0, height or 0)
        if heatmap:
            answer = self._heatmap(DefectReport.FromString(blob).anomaly, frame)
        else:
            answer = self._frame(frame, thumbnail) if nbytes is not None else None
        if answer is not None:
            return answer
        if nbytes is not None and owner and owner != self.owner:  # its row says it is kept: on its gateway's disk
            silent_us = now_us() - (seen_us or 0)
            holder = Holder(owner, address or "", silent_us / 1e6, silent_us < self.owner_lease_us)
            return FrameAnswer(inspection_pb2.IMAGE_STATE_EXPIRED, frame, holder=holder)
        return FrameAnswer(inspection_pb2.IMAGE_STATE_EXPIRED, frame)

    def _frame(self, frame: StoredFrame, thumbnail: bool) -> FrameAnswer | None:
        if self.frames is None:
            return None
        data = self.frames.read(frame.sha256, thumbnail) if thumbnail else None
        if data is not None:
            return FrameAnswer(
                inspection_pb2.IMAGE_STATE_STORED, StoredFrame(frame.sha256, len(data), "image/jpeg", 0, 0), data
            )
        data = self.frames.read(frame.sha256)
        return None if data is None else FrameAnswer(inspection_pb2.IMAGE_STATE_STORED, frame, data)

    def _heatmap(self, finding: inspection_pb2.AnomalyFinding, frame: StoredFrame) -> FrameAnswer | None:
        if not finding.heatmap_stored:
            return FrameAnswer(inspection_pb2.IMAGE_STATE_NOT_STORED)
        data = self.frames.read_heatmap(frame.sha256, finding.bank_id) if self.frames is not None else None
        if data is None:  # pruned with its frame, or on another gateway's disk
            return None
        return FrameAnswer(inspection_pb2.IMAGE_STATE_STORED, dataclasses.replace(frame, media_type="image/png"), data)
