"""The transactional outbox: one row per (output, result) in the report store's own database, written in the
transaction that stores the report (ReportStore.complete), so a result reaches the line iff its report is stored.

Each output's drainer takes its oldest row with a lease (`holder`, `lease_until_us`: one UPDATE that both engines
run), sends it, and deletes it: delivery is at least once (a crash between send and delete sends again; receivers
dedupe by report id). A row is only taken while no other drainer holds an unexpired lease on it, so gateways sharing
a PostgreSQL database keep one result in flight per output, oldest first, and a dead gateway's row is taken over
once its lease runs out. The ingest role hosts outputs without a report store: its rows live in a SQLite file of
their own (`open_local`), same table, same code.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter

from edgeinspect.services.outputs.config import OnFull, OutputsConfig
from edgeinspect.services.store.database import Database, SQLiteDatabase, Transaction
from edgeinspect.services.store.schema import OUTBOX_TABLE

logger = logging.getLogger(__name__)

DROPPED = Counter("edgeinspect_output_dropped", "results an output gave up on", ["output", "reason"])
LOCAL_FILE = "outbox.db"  # the ingest role's outbox database (the old per-output files were <output>.sqlite)


def _now_us() -> int:
    return time.time_ns() // 1000


class Queued(Protocol):
    """What a row carries: a LineResult, or a DriftAlert (queued for the MQTT output only)."""

    @property
    def station(self) -> str: ...

    @property
    def outbox_key(self) -> str: ...

    def to_json(self) -> bytes: ...


@dataclass(frozen=True)
class Entry:
    seq: int
    report_id: str
    payload: bytes


@dataclass(frozen=True)
class Backlog:
    """An output's queue for one station at or past its limit."""

    output: str
    station: str
    queued: int
    limit: int


@dataclass(frozen=True)
class OutboxWriter:
    """What a report's transaction adds: one row per output. Runs on the caller's connection, inside its
    transaction; `drop_oldest` trims the station's queue to `max_queued` there too (refuse mode never drops: the
    gateway stops admitting that station instead, services/gateway/backlog.py)."""

    outputs: tuple[str, ...]
    max_queued: int
    drop_oldest: bool

    @classmethod
    def of(cls, cfg: OutputsConfig, names: Sequence[str] | None = None) -> OutboxWriter:
        """For the configured outputs (or those `names`: outputs built by hand)."""
        names = cfg.names() if names is None else names
        return cls(tuple(names), cfg.max_queued, cfg.on_full is OnFull.drop_oldest)

    def add(self, db: Database, result: Queued) -> int:
        """Queues `result` for every output; returns how many older rows were dropped to make room."""
        payload, now = result.to_json(), _now_us()
        db.executemany(
            "INSERT INTO outbox (output, report_id, station, payload, created_us) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (output, report_id) DO NOTHING",
            [(name, result.outbox_key, result.station, payload, now) for name in self.outputs],
        )
        if not self.drop_oldest:
            return 0
        dropped = 0
        for name in self.outputs:
            # The station's rows older than its newest max_queued; a row being sent (leased) is left to its drainer.
            cur = db.execute(
                "DELETE FROM outbox WHERE output = ? AND station = ? AND lease_until_us = 0 AND seq <= (SELECT seq "
                "FROM outbox WHERE output = ? AND station = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (name, result.station, name, result.station, self.max_queued),
            )
            if cur.rowcount > 0:
                dropped += cur.rowcount
                DROPPED.labels(output=name, reason="outbox_full").inc(cur.rowcount)
                logger.warning(
                    "output %s: %d results queued for station %s (limit), dropped the %d oldest",
                    name, self.max_queued, result.station, cur.rowcount,
                )  # fmt: skip
        return dropped


class Outbox:
    """The drain side: its own connection (so delivery never waits on the report store's lock), safe across
    threads."""

    def __init__(self, db: Database, holder: str, lease_s: float) -> None:
        self.db = db
        self.holder = holder
        self.lease_us = int(lease_s * 1_000_000)
        self._lock = threading.Lock()

    def claim(self, output: str) -> Entry | None:
        """The output's oldest row, leased to this holder; None when empty or another holder's lease runs."""
        now = _now_us()
        with self._lock:
            row = self.db.execute(
                "UPDATE outbox SET holder = ?, lease_until_us = ?, tries = tries + 1 "
                "WHERE seq = (SELECT MIN(seq) FROM outbox WHERE output = ?) AND (holder = ? OR lease_until_us <= ?) "
                "RETURNING seq, report_id, payload",
                (self.holder, now + self.lease_us, output, self.holder, now),
            ).fetchone()
        return None if row is None else Entry(row[0], row[1], bytes(row[2]))

    def ack(self, entry: Entry) -> None:
        """Delivered (or given up on): the row goes."""
        with self._lock:
            self.db.execute("DELETE FROM outbox WHERE seq = ?", (entry.seq,))

    def release(self, entry: Entry) -> None:
        """Not delivered: the lease ends now, so any drainer may take the row (at shutdown)."""
        with self._lock:
            self.db.execute(
                "UPDATE outbox SET holder = '', lease_until_us = 0 WHERE seq = ? AND holder = ?",
                (entry.seq, self.holder),
            )

    def queued(self, output: str) -> int:
        with self._lock:
            return self.db.execute("SELECT COUNT(*) FROM outbox WHERE output = ?", (output,)).fetchone()[0]

    def queued_for(self, station: str) -> dict[str, int]:
        """Rows per output for one station (outbox_by_station)."""
        with self._lock:
            rows = self.db.execute(
                "SELECT output, COUNT(*) FROM outbox WHERE station = ? GROUP BY output", (station,)
            ).fetchall()
        return {name: n for name, n in rows}

    def backlogs(self, limit: int) -> list[Backlog]:
        """Every (output, station) queue holding `limit` rows or more."""
        with self._lock:
            rows = self.db.execute(
                "SELECT output, station, COUNT(*) FROM outbox GROUP BY output, station HAVING COUNT(*) >= ?",
                (limit,),
            ).fetchall()
        return [Backlog(o, s, n, limit) for o, s, n in rows]

    def put(self, writer: OutboxWriter, result: Queued) -> int:
        """Queues a result in a transaction of its own (the ingest role: no report transaction to join)."""
        with self._lock, Transaction(self.db):
            return writer.add(self.db, result)

    def import_legacy(self, folder: Path, outputs: Sequence[str]) -> int:
        """Once, at start: rows left in the old per-output SQLite outboxes (`<folder>/<output>.sqlite`) move into
        this table, oldest first, and the old files go (an upgrade loses nothing; a crash before the files go
        imports them again, which the table's (output, report_id) key absorbs)."""
        moved = 0
        for name in outputs:
            path = Path(folder) / f"{name}.sqlite"
            if not path.is_file():
                continue
            with sqlite3.connect(path) as old:
                rows = old.execute("SELECT key, payload FROM outbox ORDER BY seq").fetchall()
            now = _now_us()
            with self._lock, Transaction(self.db):
                self.db.executemany(
                    "INSERT INTO outbox (output, report_id, station, payload, created_us) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (output, report_id) DO NOTHING",
                    [(name, key, _station_of(payload), bytes(payload), now) for key, payload in rows],
                )
            for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                leftover.unlink(missing_ok=True)
            logger.info("output %s: %d queued results imported from %s", name, len(rows), path)
            moved += len(rows)
        return moved

    def close(self) -> None:
        with self._lock:
            self.db.close()


def _station_of(payload: bytes) -> str:
    try:
        return str(json.loads(payload).get("station") or "")
    except (ValueError, AttributeError):
        return ""


def open_local(folder: Path) -> SQLiteDatabase:
    """The ingest role's outbox database (synchronous=FULL, as the report store): `<folder>/outbox.db`."""
    db = SQLiteDatabase(Path(folder) / LOCAL_FILE)
    for statement in OUTBOX_TABLE:
        db.execute(statement)
    return db
