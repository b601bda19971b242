"""A durable, bounded FIFO per output (SQLite): results wait here while the output's peer is down.

Keyed by report id, so a result published twice while still queued is queued once; delivered rows are deleted, so
delivery is at least once (a crash between send and delete sends again; receivers dedupe by report id).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

logger = logging.getLogger(__name__)


class Outbox:
    def __init__(self, path: Path, max_items: int) -> None:
        if max_items < 1:
            raise ValueError(f"an outbox must hold at least one item, got max_items={max_items}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_items = max_items
        self._lock = threading.Lock()
        # WAL + synchronous=NORMAL: survives a process crash (the common fault) at ~no fsync cost per result.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT UNIQUE NOT NULL,"
            " payload BLOB NOT NULL)"
        )

    def put(self, key: str, payload: bytes) -> int:
        """Queues one item (a key already queued is kept as it is); returns how many oldest items were dropped."""
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO outbox (key, payload) VALUES (?, ?)", (key, payload))
            excess = self._count() - self.max_items
            if excess <= 0:
                return 0
            self._db.execute("DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?)", (excess,))
            return excess

    def head(self) -> tuple[int, str, bytes] | None:
        """The oldest item (seq, key, payload), or None when empty."""
        with self._lock:
            return self._db.execute("SELECT seq, key, payload FROM outbox ORDER BY seq LIMIT 1").fetchone()

    def ack(self, seq: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))

    def __len__(self) -> int:
        with self._lock:
            return self._count()

    def _count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
