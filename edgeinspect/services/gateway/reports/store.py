"""The gateway's durable report store: one row per inspection attempt, the report as a proto BLOB beside its
queryable fields (services/store/schema.py), the frame it was made from (frames.py), people's reviews (reviews.py),
and who runs which key (services/store/claims.py). SQLite in WAL mode (one gateway, the embedded default) or
PostgreSQL (a gateway pair); the queries run on both, services/store/database.py holds what differs. This file is the
write path; the reads it inherits are reader.py's.

A row is `pending` from the moment an inspection is admitted (so a retry with the same idempotency key finds it)
until `complete()` stores the finished DefectReport (`done`) or `fail()` records why it failed (`failed`); a retry
of a failed key runs as a new row naming the failed one (previous_attempt_id). Every commit is durable (SQLite
synchronous=FULL, PostgreSQL's defaults): once a call here returns, a kill -9 or a power cut loses nothing. A
report for the line gets its outbox rows (services/outputs/outbox.py) in the transaction that stores it.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from edgeinspect.errors import FailedPrecondition, InvalidInput, Unavailable
from edgeinspect.faults import fault_point
from edgeinspect.services.gateway.reports import frames as frame_policy
from edgeinspect.services.gateway.reports import reviews
from edgeinspect.services.gateway.reports.frames import FrameFiles, FrameRow
from edgeinspect.services.gateway.reports.reader import ReportReader
from edgeinspect.services.gateway.settings import FrameSettings, GatewaySettings
from edgeinspect.services.outputs.outbox import OutboxWriter
from edgeinspect.services.outputs.result import DECIDED, EXPLAINED, from_report, is_shadow
from edgeinspect.services.store.claims import (
    FAILED,
    OWNER_LEASE_S,
    PENDING,
    RESTARTED,
    TAKEN_OVER,
    Claims,
    now_us,
)
from edgeinspect.services.store.database import Database, SQLiteDatabase, Transaction, open_database
from edgeinspect.services.store.queries import (
    DONE,
)
from edgeinspect.services.store.schema import index_report, migrate, report_fields
from edgeinspect.v1.inspection_pb2 import (
    EXPLANATION_FAILED,
    EXPLANATION_PENDING,
    DefectReport,
    Explanation,
    Review,
    Verdict,
)

log = logging.getLogger(__name__)

# A pending row this old belongs to a gateway that died mid-inspection: a retry may take its key over.
DEFAULT_PENDING_TTL_S = 3600.0
# The gateway's own TTL: its deadline plus this, for the report's commit after the last hop.
PENDING_GRACE_S = 60.0


class ReportStore(ReportReader):
    """Durable DefectReport store: claims, completes and fails rows, on top of ReportReader's queries; safe to call
    from many threads (one connection behind a lock)."""

    def __init__(
        self,
        db: Path | Database,
        *,
        pending_ttl_s: float = DEFAULT_PENDING_TTL_S,
        owner_lease_s: float = OWNER_LEASE_S,
        frames: FrameSettings | None = None,
        owner: str = "",
        outbox: OutboxWriter | None = None,
    ) -> None:
        """db: a SQLite file's path or an open Database (services/store); owner: this gateway's name among those
        sharing the database ('' where it has one gateway); outbox: the outputs a result for the line is queued for
        (None: none). A PostgreSQL store needs frames.dir set."""
        super().__init__(SQLiteDatabase(db) if isinstance(db, Path | str) else db, owner, owner_lease_s)
        # The SQLite file (frames default beside it); None for a database server.
        self.path = self._db.path if isinstance(self._db, SQLiteDatabase) else None
        self.outbox = outbox if outbox is not None and outbox.outputs else None
        self.claims = Claims(self._db, owner, pending_ttl_s, owner_lease_s)
        migrate(self._db)
        # frames=None: reports only (the frame store is the gateway's choice, from its settings).
        self.frame_settings = frames if frames is not None and frames.keep else None
        if self.frame_settings is not None:
            root = self.frame_settings.dir or (self.path.parent / "frames" if self.path else None)
            if root is None:
                raise InvalidInput("frames.dir must be set for a report store on a database server")
            self.frames = FrameFiles(root, self.frame_settings.thumbnail_px)

    # -- writes ---------------------------------------------------------------------------------------------

    def recover_interrupted(self) -> int:
        """At gateway start, before it admits inspections: the rows this gateway (owner) left pending when it
        crashed are failed ("gateway restarted during inspection"); other gateways' rows are theirs."""
        return self.fail_pending(RESTARTED)

    def fail_pending(self, reason: str) -> int:
        """Fails every row this gateway has pending, with `reason` (at start and at stop): services/store/claims.py."""
        with self._lock:
            return self.claims.fail_pending(reason)

    def claim(self, idempotency_key: str, request_id: str) -> tuple[str, DefectReport | None]:
        """(report_id, report) for a finished key, (report_id, None) for one in progress here or newly admitted;
        Unavailable while another gateway sharing the database runs the key."""
        with self._lock:
            # Gateways sharing a database can both find no live row for a key and both insert: the unique index
            # admits one, the other inserts nothing (ON CONFLICT DO NOTHING) and reads the winner's row next pass.
            for _ in range(3):
                claimed = self.claims.claim_once(idempotency_key, request_id)
                if claimed is not None:
                    return claimed
                log.info("idempotency key %r claimed concurrently; reading the winner", idempotency_key)
        raise Unavailable(f"idempotency key {idempotency_key!r} is contended; retry", retry_after_ms=200)

    def heartbeat(self) -> None:
        """This gateway is alive (every HEARTBEAT_S, from the gateway's runtime): services/store/claims.py."""
        with self._lock:
            self.claims.heartbeat()

    def advertise(self, address: str) -> None:
        """Once this gateway serves: the host:port the others of its pair reach its public API at."""
        with self._lock:
            self.claims.address = address
            self.claims.heartbeat()

    def complete(
        self,
        report: DefectReport,
        *,
        image: bytes | None = None,
        heatmap: bytes | None = None,
        to_line: bool = False,
    ) -> None:
        """Stores a finished report (status done) and, with image, its frame (and the anomaly gate's heatmap PNG
        beside it, setting report.anomaly.heatmap_stored); sets report.created_time to now when the caller left it
        unset, and report.previous_attempt_id when the claim followed a failed attempt. to_line: its result is
        queued for every output in the same transaction (never for a shadow report)."""
        if not report.report_id:
            raise InvalidInput("cannot store a report without report_id")
        if not report.HasField("created_time"):
            report.created_time.GetCurrentTime()
        created_us = report.created_time.seconds * 1_000_000 + report.created_time.nanos // 1000
        # The file is written before its row commits: a crash in between leaves an unreferenced file, never a row
        # pointing at nothing.
        frame = self.frames.write(image) if image and self.frames is not None else None
        if frame is not None and self.frames is not None and heatmap and report.anomaly.bank_id:
            extra = self.frames.write_heatmap(frame.sha256, report.anomaly.bank_id, heatmap)
            frame = dataclasses.replace(frame, nbytes=frame.nbytes + extra)  # retention counts it with the frame
            report.anomaly.heatmap_stored = True
        with self._lock:
            try:
                with self._transaction():
                    row = self._db.execute(
                        "SELECT previous_attempt_id, status, reason FROM reports WHERE report_id = ?",
                        (report.report_id,),
                    ).fetchone()
                    if row and row[1] == FAILED and (row[2] or "").startswith(TAKEN_OVER):
                        # This gateway stalled past its lease and another ran the key: its late answer is not stored.
                        raise Unavailable(f"the inspection with key {report.idempotency_key!r} was {row[2]}")
                    if row and row[0] and not report.previous_attempt_id:
                        report.previous_attempt_id = row[0]
                    self._upsert(report, created_us, frame.sha256 if frame else "")
                    index_report(self._db, report, created_us)
                    if frame is not None:
                        self._db.execute(
                            "INSERT INTO frames (sha256, nbytes, media_type, width, height, stored_us) "
                            "VALUES (?, ?, ?, ?, ?, ?) "
                            "ON CONFLICT (sha256) DO UPDATE SET stored_us = excluded.stored_us, "
                            # a later heatmap adds bytes (CASE: SQLite's two-argument MAX is PostgreSQL's GREATEST)
                            "nbytes = CASE WHEN excluded.nbytes > frames.nbytes THEN excluded.nbytes "
                            "ELSE frames.nbytes END",
                            (frame.sha256, frame.nbytes, frame.media_type, frame.width, frame.height, now_us()),
                        )
                    if to_line and self.outbox is not None and not is_shadow(report):
                        event = DECIDED if report.explanation == EXPLANATION_PENDING else ""
                        self.outbox.add(self._db, from_report(report, event=event))
                    fault_point("report_in_transaction")
                fault_point("report_committed")
            except self._db.IntegrityError as exc:
                raise FailedPrecondition(
                    f"idempotency key {report.idempotency_key!r} already belongs to another report; "
                    f"claim() the key before storing report {report.report_id}"
                ) from exc
        if frame is not None:
            self.prune_frames()

    def explain(self, explained: DefectReport, to_line: bool = False) -> DefectReport:
        """Completes a report decided at takt with its explanation (explanation DONE or FAILED): the stored row
        keeps its verdict, frame and creation time whatever `explained` says; to_line: the explanation's result is
        queued for every output, in the same transaction, beside the decision's. Returns the report as stored."""
        with self._lock, self._transaction():
            row = self._db.execute(
                "SELECT status, report, created_us FROM reports WHERE report_id = ?", (explained.report_id,)
            ).fetchone()
            if row is None or row[0] != DONE:
                raise FailedPrecondition(f"no decided report {explained.report_id} to explain")
            decided = DefectReport.FromString(row[1])
            if decided.explanation != EXPLANATION_PENDING:
                log.info("report %s was already explained or marked failed: kept", explained.report_id)
                return decided
            stored = DefectReport()
            stored.CopyFrom(explained)
            # What went to the line stays as sent: the verdict, its reason, when, and the gate's finding.
            stored.verdict, stored.verdict_reason = decided.verdict, decided.verdict_reason
            stored.created_time.CopyFrom(decided.created_time)
            stored.anomaly.CopyFrom(decided.anomaly)
            if not stored.HasField("explained_time"):
                stored.explained_time.GetCurrentTime()
            self._db.execute(
                "UPDATE reports SET explanation = ?, fields = ?, report = ? WHERE report_id = ?",
                (explanation_word(stored), report_fields(stored), stored.SerializeToString(), stored.report_id),
            )
            index_report(self._db, stored, row[2])
            if to_line and self.outbox is not None and not is_shadow(stored):
                self.outbox.add(self._db, from_report(stored, event=EXPLAINED))
            fault_point("explanation_in_transaction")
        return stored

    def explanation_failed(self, report_id: str, reason: str, to_line: bool = False) -> DefectReport | None:
        """The explanation of a decided report could not be made: the decision stands, the report says why."""
        with self._lock:
            row = self._db.execute("SELECT report FROM reports WHERE report_id = ?", (report_id,)).fetchone()
        if row is None:
            return None
        failed = DefectReport.FromString(row[0])
        failed.explanation, failed.explanation_error = EXPLANATION_FAILED, reason[:2000]
        return self.explain(failed, to_line)

    def fail_unexplained(self, reason: str, to_line: bool = True) -> int:
        """At gateway start: this gateway's reports whose explanation was pending when it stopped are marked failed
        (their decisions reached the line; the explanation's event says it will not come)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT report_id FROM reports WHERE explanation = ? AND owner = ?", ("pending", self.owner)
            ).fetchall()
        for (report_id,) in rows:
            self.explanation_failed(report_id, reason, to_line)
        if rows:
            log.warning("%d explanations were pending when this gateway stopped: marked failed", len(rows))
        return len(rows)

    def _upsert(self, report: DefectReport, created_us: int, frame_sha: str) -> None:
        # An existing row keeps the key it was claimed with; a report stored without a claim brings its own key.
        self._db.execute(
            "INSERT INTO reports (report_id, idempotency_key, request_id, station, part, camera_id, verdict, "
            "created_us, status, frame_sha256, fields, report, owner, explanation) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (report_id) DO UPDATE SET request_id = excluded.request_id, station = excluded.station, "
            "part = excluded.part, camera_id = excluded.camera_id, verdict = excluded.verdict, "
            "created_us = excluded.created_us, status = excluded.status, reason = '', "
            "frame_sha256 = excluded.frame_sha256, fields = excluded.fields, report = excluded.report, "
            "explanation = excluded.explanation",
            (
                report.report_id,
                report.idempotency_key or None,
                report.request_id,
                report.station,
                report.part,
                report.camera_id,
                int(report.verdict),
                created_us,
                DONE,
                frame_sha,
                report_fields(report),
                report.SerializeToString(),
                self.owner,  # whose disk its frame is on (a row claimed first keeps its claimer)
                explanation_word(report),
            ),
        )

    def fail(self, report_id: str, reason: str) -> None:
        """Marks a pending row failed with the caller's reason (which hop, which status); the row keeps its key."""
        with self._lock, self._transaction():
            cur = self._db.execute(
                "UPDATE reports SET status = ?, reason = ? WHERE report_id = ? AND status = ?",
                (FAILED, reason[:2000], report_id, PENDING),
            )
        if cur.rowcount == 0:
            log.info("fail(%s) ignored: no pending report with that id", report_id)

    def prune_frames(self, free_bytes: int = 0) -> list[str]:
        """Applies the retention settings, and with free_bytes also deletes the oldest frames until that many bytes
        are gone (a disk below its floor: services/gateway/disk.py); the reports stay and say their frame expired."""
        if self.frame_settings is None or self.frames is None:
            return []
        cfg = self.frame_settings
        doomed: list[str] = []
        with self._lock:
            # One of a pair prunes the frames of its own reports (its disk; reports_by_frame finds them).
            mine = " WHERE EXISTS (SELECT 1 FROM reports r WHERE r.frame_sha256 = frames.sha256 AND r.owner = ?)"
            mine, args = (mine, (self.owner,)) if self.owner else ("", ())
            total = self._db.execute(f"SELECT COALESCE(SUM(nbytes), 0) FROM frames{mine}", args).fetchone()[0]
            max_bytes = min(cfg.max_bytes, max(0, total - free_bytes)) if free_bytes else cfg.max_bytes
            # The oldest frames in batches (frames_by_time): a pass reads only what it may delete.
            while True:
                oldest = [
                    FrameRow(*r)
                    for r in self._db.execute(
                        f"SELECT sha256, nbytes, stored_us FROM frames{mine} ORDER BY stored_us, sha256 "
                        "LIMIT 256 OFFSET ?",
                        (*args, len(doomed)),
                    )
                ]
                batch = frame_policy.to_prune(oldest, total, now_us(), max_bytes, int(cfg.max_age_s * 1e6))
                doomed += batch
                total -= sum(r.nbytes for r in oldest[: len(batch)])
                if len(batch) < len(oldest) or not oldest:
                    break
            if doomed:
                with self._transaction():
                    self._db.executemany("DELETE FROM frames WHERE sha256 = ?", [(s,) for s in doomed])
        for sha in doomed:
            self.frames.delete(sha)
        if doomed:
            log.info("frame retention: pruned %d frames", len(doomed))
        return doomed

    def review(
        self, report_id: str, verdict: Verdict, classes: list[str], comment: str, reviewer: str, reviewer_role: str
    ) -> Review:
        """Stores a review as its own record (the model's report is untouched) and returns it."""
        review = reviews.new_review(self._get_done(report_id), verdict, classes, comment, reviewer, reviewer_role)
        with self._lock, self._transaction():
            reviews.insert(self._db, review)
        return review

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ReportStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------------------------------------

    def _transaction(self) -> Transaction:
        return Transaction(self._db)


def explanation_word(report: DefectReport) -> str:
    """The reports.explanation column: '' (none), pending, done or failed."""
    if report.explanation == 0:
        return ""
    return Explanation.Name(report.explanation).removeprefix("EXPLANATION_").lower()


def open_gateway_store(cfg: GatewaySettings) -> ReportStore:
    """The gateway's store from its settings: SQLite at db_path, or the PostgreSQL database of a gateway pair (frames
    stay on this box, in frames.dir or beside db_path)."""
    frames = cfg.frames if cfg.frames.dir else cfg.frames.model_copy(update={"dir": cfg.db_path.parent / "frames"})
    # A row is claimed inside the inspection's deadline (capped by upstream_timeout_s) and finished by it: one pending
    # for longer belongs to a gateway that died, and a retry on the other gateway may take its key over.
    ttl_s = cfg.upstream_timeout_s + PENDING_GRACE_S
    return ReportStore(
        open_database(cfg.store, cfg.db_path),
        pending_ttl_s=ttl_s,
        owner_lease_s=cfg.store.owner_lease_s,
        frames=frames,
        owner=cfg.store.owner(),
        outbox=OutboxWriter.of(cfg.outputs),
    )
