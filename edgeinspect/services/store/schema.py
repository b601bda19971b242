"""The report database's schema and its migrations (0 = the first release; the version lives where the database
keeps it: SQLite's PRAGMA user_version, PostgreSQL's report_schema table; database.py).

Version 1 keeps the report BLOB and adds what SQL can query: the report's fields as JSON (`fields`, JSON1), a
row per defect class (`report_classes`), camera and review state as columns, reviews as their own records, and
the frame store's rows. It also lets a failed row keep its idempotency key: the key is unique among live rows
(pending or done) only, so a failure can be found by its key and a retry runs as a new, linked row.

Version 2 records which gateway claimed a row (`owner`): gateways sharing one database fail only their own pending
rows when they restart.

Version 3 adds the line's outbox (OUTBOX_TABLE; services/outputs/outbox.py writes and drains it): a row per output
for each stored result, written in the report's own transaction and deleted once delivered. The statements are
written once for both engines; Database.ddl() maps the types.

Version 4 adds `gateways`: each gateway of a pair writes its heartbeat there, so another can tell a gateway that
died mid-inspection (its keys are taken over) from one that is still running them (reports/store.py, claim).

Version 5 adds the gateway's advertised `address` to its heartbeat row: a gateway asked for a frame that another
gateway of the pair holds on its own disk reads it from that one's public API (reports/images.py).

Version 6 adds `explanation` to reports ('' none, or pending / done / failed): a report decided at takt whose
explanation is still pending when its gateway restarts is found and marked failed (its decision stands).

Version 7 adds `banks`: every anomaly bank version taught through a gateway, as the archive a vision node exports
(services/store/banks.py), so a vision box with its own banks folder, new or back from a failure, is given it.
"""

from __future__ import annotations

import json
import logging

from google.protobuf.json_format import MessageToDict

from edgeinspect.services.store.database import Database
from edgeinspect.v1.inspection_pb2 import DefectReport

log = logging.getLogger(__name__)

SCHEMA_VERSION = 7

# One statement per entry: executescript() would commit the migration's transaction half way.
_V1 = [
    """CREATE TABLE reports (
        report_id           TEXT PRIMARY KEY,
        idempotency_key     TEXT,                 -- NULL without a key; unique among live (not failed) rows
        request_id          TEXT NOT NULL DEFAULT '',
        station             TEXT NOT NULL DEFAULT '',
        part                TEXT NOT NULL DEFAULT '',
        camera_id           TEXT NOT NULL DEFAULT '',
        verdict             INTEGER NOT NULL DEFAULT 0,
        created_us          INTEGER NOT NULL,     -- epoch microseconds, UTC; claim time until complete()
        status              TEXT NOT NULL,
        reason              TEXT NOT NULL DEFAULT '',
        previous_attempt_id TEXT NOT NULL DEFAULT '',
        frame_sha256        TEXT NOT NULL DEFAULT '',  -- '' = no frame kept (expired ones keep the hash)
        reviewed            INTEGER NOT NULL DEFAULT 0,
        disagreed           INTEGER NOT NULL DEFAULT 0,  -- the latest review differs from the model
        fields              TEXT,                 -- the report as JSON, for json_extract()
        report              BLOB
    )""",
    "CREATE UNIQUE INDEX reports_live_key ON reports (idempotency_key) WHERE status != 'failed'",
    "CREATE INDEX reports_by_key ON reports (idempotency_key, created_us DESC)",
    "CREATE INDEX reports_by_time ON reports (status, created_us DESC, report_id DESC)",
    "CREATE INDEX reports_by_station ON reports (station, created_us DESC)",
    "CREATE INDEX reports_by_part ON reports (part, created_us DESC)",
    "CREATE INDEX reports_by_camera ON reports (camera_id, created_us DESC)",
    "CREATE INDEX reports_by_verdict ON reports (verdict, created_us DESC)",
    "CREATE INDEX reports_by_frame ON reports (frame_sha256)",
    """CREATE TABLE report_classes (
        report_id    TEXT NOT NULL,
        defect_class TEXT NOT NULL,               -- lower case
        created_us   INTEGER NOT NULL,
        PRIMARY KEY (report_id, defect_class)
    )""",
    "CREATE INDEX report_classes_by_class ON report_classes (defect_class, created_us DESC)",
    """CREATE TABLE reviews (
        review_id     TEXT PRIMARY KEY,
        report_id     TEXT NOT NULL,
        verdict       INTEGER NOT NULL,
        classes       TEXT NOT NULL,              -- JSON array
        comment       TEXT NOT NULL DEFAULT '',
        reviewer      TEXT NOT NULL DEFAULT '',
        reviewer_role TEXT NOT NULL DEFAULT '',
        created_us    INTEGER NOT NULL,
        agrees        INTEGER NOT NULL
    )""",
    "CREATE INDEX reviews_by_report ON reviews (report_id, created_us DESC)",
    """CREATE TABLE frames (
        sha256     TEXT PRIMARY KEY,
        nbytes     INTEGER NOT NULL,
        media_type TEXT NOT NULL,
        width      INTEGER NOT NULL DEFAULT 0,
        height     INTEGER NOT NULL DEFAULT 0,
        stored_us  INTEGER NOT NULL
    )""",
    "CREATE INDEX frames_by_time ON frames (stored_us)",
]

_V2 = [
    # '' = the only gateway of its database (SQLite, and every row written before version 2)
    "ALTER TABLE reports ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
]

# Version 3: the line's outbox (services/outputs/outbox.py writes and drains it). IF NOT EXISTS: the ingest's own file
# (outbox.open_local) creates it at every start. SQLite's AUTOINCREMENT never reuses a seq; PostgreSQL's ddl() makes
# it BIGSERIAL.
OUTBOX_TABLE = [
    """CREATE TABLE IF NOT EXISTS outbox (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        output         TEXT NOT NULL,              -- the output's name (mqtt, webhook0, ...)
        report_id      TEXT NOT NULL,
        station        TEXT NOT NULL DEFAULT '',
        payload        BLOB NOT NULL,              -- LineResult JSON, exactly what the peer receives
        created_us     INTEGER NOT NULL,
        holder         TEXT NOT NULL DEFAULT '',   -- the drainer sending it now ('' with no lease)
        lease_until_us INTEGER NOT NULL DEFAULT 0,
        tries          INTEGER NOT NULL DEFAULT 0,
        UNIQUE (output, report_id)
    )""",
    "CREATE INDEX IF NOT EXISTS outbox_by_output ON outbox (output, seq)",
    "CREATE INDEX IF NOT EXISTS outbox_by_station ON outbox (station, output)",
]

_V4 = [
    "CREATE TABLE gateways (owner TEXT PRIMARY KEY, seen_us INTEGER NOT NULL)",
]

_V5 = [
    # host:port of the gateway's public API ('': not serving yet, or bound to every interface without
    # store.advertise)
    "ALTER TABLE gateways ADD COLUMN address TEXT NOT NULL DEFAULT ''",
]

_V6 = [
    "ALTER TABLE reports ADD COLUMN explanation TEXT NOT NULL DEFAULT ''",
]

_V7 = [
    """CREATE TABLE banks (
        part       TEXT NOT NULL,
        version    INTEGER NOT NULL,              -- the number every vision node holds it under
        bank_id    TEXT NOT NULL,                 -- PART@vN:hash8, as vision Info lists it
        sha256     TEXT NOT NULL,                 -- of archive
        archive    BLOB NOT NULL,                 -- the version's tar, as vision ExportBank gives it
        nbytes     INTEGER NOT NULL,
        staged     INTEGER NOT NULL DEFAULT 0,    -- held back until promoted (1), or live (0)
        created_us INTEGER NOT NULL,
        origin     TEXT NOT NULL DEFAULT '',      -- host:port of the vision node it was exported from
        PRIMARY KEY (part, version)
    )""",
]


# Each version's statements after the first, in order: a database at version v runs every step above v.
_STEPS = [(2, _V2), (3, OUTBOX_TABLE), (4, _V4), (5, _V5), (6, _V6), (7, _V7)]


def report_fields(report: DefectReport) -> str:
    """The report as JSON for SQL (token id lists left out: they are large and only the BLOB needs them)."""
    doc = MessageToDict(report, preserving_proto_field_name=True)
    for key in ("generated_token_ids", "prompt_token_ids", "review"):
        doc.pop(key, None)
    return json.dumps(doc, separators=(",", ":"))


def report_classes(report: DefectReport) -> list[str]:
    return sorted({d.defect_class.strip().lower() for d in report.defects if d.defect_class.strip()})


def index_report(db: Database, report: DefectReport, created_us: int) -> None:
    """The queryable side of one stored report: its class rows."""
    db.execute("DELETE FROM report_classes WHERE report_id = ?", (report.report_id,))
    db.executemany(
        "INSERT INTO report_classes (report_id, defect_class, created_us) VALUES (?, ?, ?)",
        [(report.report_id, c, created_us) for c in report_classes(report)],
    )


def migrate(db: Database) -> None:
    """Brings the database to SCHEMA_VERSION in one transaction (a second process waits, then finds it done)."""
    db.begin_migration()
    try:
        version = db.schema_version()
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"report database schema {version} is newer than this release ({SCHEMA_VERSION})")
        if version == 0 and db.has_table("reports"):
            _from_v0(db)  # the first release was SQLite only
        elif version == 0:
            for statement in _V1:
                db.execute(db.ddl(statement))
        for target, statements in _STEPS:
            if version < target:
                for statement in statements:
                    db.execute(db.ddl(statement))
        if version != SCHEMA_VERSION:
            db.set_schema_version(SCHEMA_VERSION)
        db.commit()
    except BaseException:
        db.rollback()
        raise


def _from_v0(db: Database) -> None:
    """The first release's table (key UNIQUE on every row, no query columns) rebuilt as version 1."""
    count = db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
    log.info("migrating the report database to schema %d (%d rows)", SCHEMA_VERSION, count)
    db.execute("ALTER TABLE reports RENAME TO reports_v0")
    for index in ("reports_by_time", "reports_by_station", "reports_by_part"):
        db.execute(f"DROP INDEX IF EXISTS {index}")
    for statement in _V1:
        db.execute(statement)
    db.execute(
        "INSERT INTO reports (report_id, idempotency_key, request_id, station, part, verdict, created_us, status, "
        "reason, report) SELECT report_id, idempotency_key, request_id, station, part, verdict, created_us, status, "
        "reason, report FROM reports_v0"
    )
    rows = db.execute("SELECT report_id, created_us, report FROM reports WHERE report IS NOT NULL").fetchall()
    for report_id, created_us, blob in rows:
        report = DefectReport.FromString(blob)
        db.execute(
            "UPDATE reports SET camera_id = ?, fields = ? WHERE report_id = ?",
            (report.camera_id, report_fields(report), report_id),
        )
        index_report(db, report, created_us)
    db.execute("DROP TABLE reports_v0")
