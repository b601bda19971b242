"""Published anomaly bank versions (schema version 7's `banks` table): what a vision node with its own banks folder
is given, by the gateway that taught the bank or by any gateway that finds the node behind.

Why here: the report database is already the durable source of truth every gateway shares (SQLite for one gateway,
PostgreSQL for a pair), so a bank survives any vision box being recreated; a version is addressed by part, number
and sha256 like the KB index by its fingerprint; and vision boxes need no access to each other, only the gateway
talks to them. A (part, version) is written once: the same archive again only updates its staged flag (a promote),
another archive under that number is refused.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from edgeinspect.errors import FailedPrecondition, NotFound
from edgeinspect.services.store.claims import now_us
from edgeinspect.services.store.database import Database, Transaction


@dataclass(frozen=True)
class PublishedBank:
    """One row: a bank version as the store holds it (`archive` empty where only listed)."""

    part: str
    version: int
    bank_id: str
    sha256: str
    staged: bool
    origin: str = ""  # the vision node it was exported from
    archive: bytes = b""


class BankVersions:
    """The banks table over one connection of the report database; safe to call from many threads."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = threading.Lock()

    def publish(self, bank: PublishedBank) -> bool:
        """Records a version (staged flag updated where it is already recorded); returns whether anything changed.
        FailedPrecondition where the store holds another archive under that part and version."""
        if hashlib.sha256(bank.archive).hexdigest() != bank.sha256:
            raise FailedPrecondition(f"bank {bank.bank_id}: its archive does not match its sha256; not published")
        with self._lock, Transaction(self._db):
            row = self._db.execute(
                "SELECT sha256, staged FROM banks WHERE part = ? AND version = ?", (bank.part, bank.version)
            ).fetchone()
            if row is None:  # another gateway of a pair inserting it at once: one insert wins, the other rolls back
                self._db.execute(
                    "INSERT INTO banks (part, version, bank_id, sha256, archive, nbytes, staged, created_us, origin) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (bank.part, bank.version, bank.bank_id, bank.sha256, bank.archive, len(bank.archive),
                     int(bank.staged), now_us(), bank.origin),
                )  # fmt: skip
                return True
            if row[0] != bank.sha256:
                raise FailedPrecondition(
                    f"part {bank.part!r}: the store holds another v{bank.version} (sha256 {row[0][:12]}) than "
                    f"{bank.bank_id} (sha256 {bank.sha256[:12]}); a version number names one bank"
                )
            if bool(row[1]) == bank.staged:
                return False
            self._db.execute(
                "UPDATE banks SET staged = ? WHERE part = ? AND version = ?",
                (int(bank.staged), bank.part, bank.version),
            )
            return True

    def newest(self) -> list[PublishedBank]:
        """Per part, what every vision node should hold: the newest live version, and the newest staged one where
        it is newer than that; by part, then version."""
        with self._lock:
            rows = self._db.execute(
                "SELECT b.part, b.version, b.bank_id, b.sha256, b.staged, b.origin FROM banks b JOIN ("
                "SELECT part, staged, MAX(version) AS version FROM banks GROUP BY part, staged) n "
                "ON b.part = n.part AND b.version = n.version ORDER BY b.part, b.version"
            ).fetchall()
        live = {part: version for part, version, _, _, staged, _ in rows if not staged}
        return [
            PublishedBank(part, version, bank_id, sha, bool(staged), origin)
            for part, version, bank_id, sha, staged, origin in rows
            if not staged or version > live.get(part, 0)
        ]

    def get(self, part: str, version: int) -> PublishedBank:
        """A version with its archive, checked against its recorded sha256; NotFound where it is not recorded."""
        with self._lock:
            row = self._db.execute(
                "SELECT bank_id, sha256, staged, origin, archive FROM banks WHERE part = ? AND version = ?",
                (part, version),
            ).fetchone()
        if row is None:
            raise NotFound(f"part {part!r} v{version} is not among the published anomaly banks")
        bank_id, sha, staged, origin, archive = row
        archive = bytes(archive)
        if hashlib.sha256(archive).hexdigest() != sha:
            raise FailedPrecondition(f"published bank {bank_id}: its stored archive does not match its sha256")
        return PublishedBank(part, version, bank_id, sha, bool(staged), origin, archive)

    def close(self) -> None:
        with self._lock:
            self._db.close()
