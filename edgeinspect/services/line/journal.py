"""Every line cycle in SQLite: what the line was told and when, and the report it belongs to, also one that
arrived after the deadline had already written NG (a late report is stored by the gateway and linked here)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS cycles (
  cycle_id TEXT PRIMARY KEY,     -- also the inspection's idempotency key: the gateway's report carries it
  station TEXT NOT NULL,
  cycle INTEGER NOT NULL,
  triggered_at REAL NOT NULL,    -- unix seconds
  recipe TEXT NOT NULL DEFAULT '',
  lot_id TEXT NOT NULL DEFAULT '',
  written_ms REAL,               -- trigger -> ResultReady
  line TEXT,                     -- OK / NG / RECHECK: what the line was told
  error INTEGER,                 -- ErrorCode written with it
  report_id TEXT,                -- the report, once it exists (also after the deadline)
  verdict TEXT,
  late INTEGER NOT NULL DEFAULT 0 -- the report arrived after the line had been told (NG/recheck, Error=timeout)
)
"""


class CycleJournal:
    def __init__(self, path: Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(SCHEMA)

    def started(self, cycle_id: str, station: str, cycle: int, recipe: str, lot_id: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO cycles (cycle_id, station, cycle, triggered_at, recipe, lot_id)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (cycle_id, station, cycle, time.time(), recipe, lot_id),
            )

    def written(self, cycle_id: str, line: str, error: int, elapsed_ms: float) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE cycles SET line = ?, error = ?, written_ms = ? WHERE cycle_id = ?",
                (line, error, elapsed_ms, cycle_id),
            )

    def resolved(self, cycle_id: str, report_id: str, verdict: str, late: bool) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE cycles SET report_id = ?, verdict = ?, late = ? WHERE cycle_id = ?",
                (report_id or None, verdict or None, int(late), cycle_id),
            )

    def get(self, cycle_id: str) -> dict | None:
        with self._lock:
            cur = self._db.execute("SELECT * FROM cycles WHERE cycle_id = ?", (cycle_id,))
            row = cur.fetchone()
            return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))

    def close(self) -> None:
        with self._lock:
            self._db.close()
