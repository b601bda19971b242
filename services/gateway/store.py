"""The gateway's durable report store: SQLite in WAL mode, one row per inspection, the report as a proto BLOB.

A row is `pending` from the moment an inspection is admitted (so a retry with the same idempotency key finds it)
until `complete()` stores the finished DefectReport (`done`) or `fail()` gives the key back (`failed`).
synchronous=FULL fsyncs the WAL on every commit: once a call here returns, a kill -9 loses nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import sqlite3
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from edgeinspect.errors import FailedPrecondition, InvalidInput, NotFound
from edgeinspect.v1 import inspection_pb2
from edgeinspect.v1.inspection_pb2 import DefectReport

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# A pending row this old belongs to a gateway that died mid-inspection: a retry may take its key over.
DEFAULT_PENDING_TTL_S = 3600.0

PENDING, DONE, FAILED = "pending", "done", "failed"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    report_id       TEXT PRIMARY KEY,
    idempotency_key TEXT UNIQUE,          -- NULL for requests without a key (NULLs never collide)
    request_id      TEXT NOT NULL DEFAULT '',
    station         TEXT NOT NULL DEFAULT '',
    part            TEXT NOT NULL DEFAULT '',
    verdict         INTEGER NOT NULL DEFAULT 0,
    created_us      INTEGER NOT NULL,     -- epoch microseconds, UTC; claim time until complete()
    status          TEXT NOT NULL,
    reason          TEXT NOT NULL DEFAULT '',
    report          BLOB
);
CREATE INDEX IF NOT EXISTS reports_by_time ON reports (status, created_us DESC, report_id DESC);
CREATE INDEX IF NOT EXISTS reports_by_station ON reports (station, created_us DESC);
CREATE INDEX IF NOT EXISTS reports_by_part ON reports (part, created_us DESC);
"""

_VALID_VERDICTS = frozenset(inspection_pb2.Verdict.values())


def _now_us() -> int:
    return time.time_ns() // 1000


def _datetime_us(value: datetime) -> int:
    """Naive datetimes are taken as UTC (the store keeps UTC only)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _encode_token(created_us: int, report_id: str) -> str:
    raw = json.dumps([created_us, report_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_token(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_us, report_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidInput(f"malformed page_token {token[:40]!r}: pass back a next_page_token unchanged") from exc
    if not isinstance(created_us, int) or isinstance(created_us, bool) or not isinstance(report_id, str):
        raise InvalidInput(f"malformed page_token {token[:40]!r}: pass back a next_page_token unchanged")
    return created_us, report_id


class ReportStore:
    """Durable DefectReport store; safe to call from many threads (one connection behind a lock)."""

    def __init__(self, path: Path, *, pending_ttl_s: float = DEFAULT_PENDING_TTL_S) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pending_ttl_us = int(pending_ttl_s * 1_000_000)
        self._lock = threading.Lock()
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a claim is one write transaction even
        # against another process on the same file; timeout makes that process wait for the lock instead of failing.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    # -- writes ---------------------------------------------------------------------------------------------

    def claim(self, idempotency_key: str, request_id: str) -> tuple[str, DefectReport | None]:
        """(report_id, report) for a finished key, (report_id, None) for one in progress or newly admitted."""
        with self._lock:
            for _ in range(2):
                try:
                    return self._claim_once(idempotency_key, request_id)
                except sqlite3.IntegrityError:
                    # Another process inserted the same key between our SELECT and INSERT: read its row.
                    log.info("idempotency key %r claimed concurrently; reading the winner", idempotency_key)
            return self._claim_once(idempotency_key, request_id)

    def _claim_once(self, key: str, request_id: str) -> tuple[str, DefectReport | None]:
        now = _now_us()
        with self._transaction():
            if key:
                row = self._db.execute(
                    "SELECT report_id, status, created_us, report FROM reports WHERE idempotency_key = ?", (key,)
                ).fetchone()
                if row is not None:
                    report_id, status, created_us, blob = row
                    if status == DONE:
                        return report_id, DefectReport.FromString(blob)
                    if now - created_us < self._pending_ttl_us:
                        return report_id, None
                    log.warning("pending report %s for key %r abandoned; admitting a new attempt", report_id, key)
                    self._db.execute(
                        "UPDATE reports SET status = ?, reason = ?, idempotency_key = NULL WHERE report_id = ?",
                        (FAILED, "abandoned: still pending after the pending TTL", report_id),
                    )
            report_id = uuid.uuid4().hex
            self._db.execute(
                "INSERT INTO reports (report_id, idempotency_key, request_id, created_us, status) "
                "VALUES (?, ?, ?, ?, ?)",
                (report_id, key or None, request_id, now, PENDING),
            )
            return report_id, None

    def complete(self, report: DefectReport) -> None:
        """Stores a finished report (status done); sets report.created_time to now when the caller left it unset."""
        if not report.report_id:
            raise InvalidInput("cannot store a report without report_id")
        if not report.HasField("created_time"):
            report.created_time.GetCurrentTime()
        created_us = report.created_time.seconds * 1_000_000 + report.created_time.nanos // 1000
        blob = report.SerializeToString()
        with self._lock:
            try:
                with self._transaction():
                    # An existing row keeps the key it was claimed with; a report stored without a claim brings
                    # its own key.
                    self._db.execute(
                        "INSERT INTO reports (report_id, idempotency_key, request_id, station, part, verdict, "
                        "created_us, status, report) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (report_id) DO UPDATE SET request_id = excluded.request_id, "
                        "station = excluded.station, part = excluded.part, verdict = excluded.verdict, "
                        "created_us = excluded.created_us, status = excluded.status, reason = '', "
                        "report = excluded.report",
                        (
                            report.report_id,
                            report.idempotency_key or None,
                            report.request_id,
                            report.station,
                            report.part,
                            int(report.verdict),
                            created_us,
                            DONE,
                            blob,
                        ),
                    )
            except sqlite3.IntegrityError as exc:
                raise FailedPrecondition(
                    f"idempotency key {report.idempotency_key!r} already belongs to another report; "
                    f"claim() the key before storing report {report.report_id}"
                ) from exc

    def fail(self, report_id: str, reason: str) -> None:
        """Marks a pending row failed and frees its idempotency key so a retry can run again."""
        with self._lock, self._transaction():
            cur = self._db.execute(
                "UPDATE reports SET status = ?, reason = ?, idempotency_key = NULL WHERE report_id = ? AND status = ?",
                (FAILED, reason[:2000], report_id, PENDING),
            )
        if cur.rowcount == 0:
            log.info("fail(%s) ignored: no pending report with that id", report_id)

    # -- reads ----------------------------------------------------------------------------------------------

    def is_pending(self, report_id: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT status FROM reports WHERE report_id = ?", (report_id,)).fetchone()
        return row is not None and row[0] == PENDING

    def get(self, report_id: str) -> DefectReport:
        """The finished report; NotFound when absent, still pending, or failed."""
        with self._lock:
            row = self._db.execute(
                "SELECT status, reason, report FROM reports WHERE report_id = ?", (report_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no report with id {report_id!r}")
        status, reason, blob = row
        if status == PENDING:
            raise NotFound(f"no report with id {report_id!r} yet: the inspection is still in progress")
        if status == FAILED:
            raise NotFound(f"no report with id {report_id!r}: the inspection failed ({reason})")
        return DefectReport.FromString(blob)

    def list(
        self,
        *,
        station: str = "",
        part: str = "",
        verdict: int = 0,
        since: datetime | None = None,
        until: datetime | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str = "",
    ) -> tuple[list[DefectReport], str]:
        """Finished reports newest first; since is inclusive, until exclusive; ("", ...) token at the end."""
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidInput(f"page_size must be between 0 and {MAX_PAGE_SIZE} (0 means {DEFAULT_PAGE_SIZE})")
        page_size = page_size or DEFAULT_PAGE_SIZE
        if verdict and verdict not in _VALID_VERDICTS:
            raise InvalidInput(f"unknown verdict {verdict}; expected one of {sorted(_VALID_VERDICTS)}")
        where, args = ["status = ?"], [DONE]
        for column, value in (("station", station), ("part", part), ("verdict", verdict)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("created_us >= ?")
            args.append(_datetime_us(since))
        if until is not None:
            where.append("created_us < ?")
            args.append(_datetime_us(until))
        if page_token:
            last_us, last_id = _decode_token(page_token)
            where.append("(created_us < ? OR (created_us = ? AND report_id < ?))")
            args += [last_us, last_us, last_id]
        sql = (
            f"SELECT created_us, report_id, report FROM reports WHERE {' AND '.join(where)} "
            "ORDER BY created_us DESC, report_id DESC LIMIT ?"
        )
        with self._lock:
            # One extra row tells whether another page exists, so the last page ends with an empty token.
            rows = self._db.execute(sql, (*args, page_size + 1)).fetchall()
        page = rows[:page_size]
        next_token = _encode_token(page[-1][0], page[-1][1]) if len(rows) > page_size else ""
        return [DefectReport.FromString(blob) for _, _, blob in page], next_token

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ReportStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): takes the write lock up front so check-then-insert is atomic."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")
