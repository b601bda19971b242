"""Which gateway runs which inspection, when gateways share one report database (a pair): each row is claimed under
its gateway's `owner` name, each gateway writes a heartbeat (and its address) to the `gateways` table, and a key
whose gateway has been silent for `owner_lease_s` is taken over by the gateway a client retried it on. A gateway
that was only frozen finds its row taken over when it tries to store its report, and is refused (store.complete):
every key has one report. With one gateway (owner ''), nobody takes over from anybody.

ReportStore owns the lock and calls in here inside its own critical sections.
"""

from __future__ import annotations

import logging
import time
import uuid

from edgeinspect.errors import Unavailable
from edgeinspect.services.store.database import Database, Transaction
from edgeinspect.services.store.queries import DONE
from edgeinspect.v1.inspection_pb2 import DefectReport

log = logging.getLogger(__name__)

RESTARTED = "gateway restarted during inspection"
STOPPED = "gateway stopped during inspection"  # SIGTERM: cut short by the grace and not failed in time
TAKEN_OVER = "taken over: its gateway stopped answering"  # the reason's start; the rest names both gateways
# A gateway of a pair that has not written its heartbeat for this long is gone: another may take over its running
# keys. Several heartbeats (HEARTBEAT_S) fit in it, so a busy database or a GC pause does not look like a death.
OWNER_LEASE_S = 10.0
HEARTBEAT_S = 2.0

PENDING, FAILED = "pending", "failed"


def now_us() -> int:
    return time.time_ns() // 1000


class Claims:
    def __init__(self, db: Database, owner: str, pending_ttl_s: float, owner_lease_s: float) -> None:
        self.db = db
        self.owner = owner
        self.address = ""  # this gateway's public API for the others of its pair (set once it serves)
        self.pending_ttl_us = int(pending_ttl_s * 1_000_000)
        self.owner_lease_us = int(owner_lease_s * 1_000_000)

    def heartbeat(self) -> None:
        """This gateway is alive (every HEARTBEAT_S, from the gateway's runtime): its running keys stay its own, and
        the others of the pair read the frames it holds at its address."""
        if not self.owner:
            return  # the only gateway of its database: nobody to take over from it
        with Transaction(self.db):
            self.db.execute(
                "INSERT INTO gateways (owner, seen_us, address) VALUES (?, ?, ?) "
                "ON CONFLICT (owner) DO UPDATE SET seen_us = excluded.seen_us, address = excluded.address",
                (self.owner, now_us(), self.address),
            )

    def advertise(self, address: str) -> None:
        """Once this gateway serves: the host:port the others of its pair reach its public API at (heartbeat)."""
        self.address = address
        self.heartbeat()

    def silent_us(self, owner: str, created_us: int, now: int) -> int:
        """How long the gateway `owner` has not been heard from (since its row was claimed, if it never beat)."""
        seen = self.db.execute("SELECT seen_us FROM gateways WHERE owner = ?", (owner,)).fetchone()
        return now - max(created_us, seen[0] if seen else 0)

    def fail_pending(self, reason: str) -> int:
        """Fails every row this gateway (owner) has pending, with `reason`: at start (a crash left them) and at
        stop (after in-flight inspections had their grace). Other gateways' rows are theirs."""
        with Transaction(self.db):
            cur = self.db.execute(
                "UPDATE reports SET status = ?, reason = ? WHERE status = ? AND owner = ?",
                (FAILED, reason, PENDING, self.owner),
            )
        if cur.rowcount:
            log.warning("%d pending inspections marked failed: %s", cur.rowcount, reason)
        return cur.rowcount

    def claim_once(self, key: str, request_id: str) -> tuple[str, DefectReport | None] | None:
        now = now_us()
        previous = ""
        with Transaction(self.db):
            if key:
                row = self.db.execute(
                    "SELECT report_id, status, created_us, report, owner FROM reports "
                    "WHERE idempotency_key = ? AND status != ?",
                    (key, FAILED),
                ).fetchone()
                if row is not None:
                    report_id, status, created_us, blob, owner = row
                    if status == DONE:
                        return report_id, DefectReport.FromString(blob)
                    if now - created_us < self.pending_ttl_us:
                        if owner == self.owner:
                            return report_id, None
                        silent_us = self.silent_us(owner, created_us, now)
                        if silent_us < self.owner_lease_us:
                            raise Unavailable(
                                f"an inspection with idempotency key {key!r} is running on gateway {owner!r}; retry",
                                retry_after_ms=max(200, min(1000, (self.owner_lease_us - silent_us) // 1000)),
                            )
                        log.warning(
                            "gateway %r silent for %.0f s: its run of key %r (report %s) is taken over by %r",
                            owner, silent_us / 1e6, key, report_id, self.owner,
                        )  # fmt: skip
                        self.db.execute(
                            "UPDATE reports SET status = ?, reason = ? WHERE report_id = ?",
                            (FAILED, f"{TAKEN_OVER} ({owner!r}; taken over by {self.owner!r})", report_id),
                        )
                    else:
                        log.warning("pending report %s for key %r abandoned; admitting a new attempt", report_id, key)
                        self.db.execute(
                            "UPDATE reports SET status = ?, reason = ? WHERE report_id = ?",
                            (FAILED, "abandoned: still pending after the pending TTL", report_id),
                        )
                last_failed = self.db.execute(
                    "SELECT report_id FROM reports WHERE idempotency_key = ? AND status = ? "
                    "ORDER BY created_us DESC LIMIT 1",
                    (key, FAILED),
                ).fetchone()
                previous = last_failed[0] if last_failed else ""
            report_id = uuid.uuid4().hex
            inserted = self.db.execute(
                "INSERT INTO reports (report_id, idempotency_key, request_id, created_us, status, previous_attempt_id, "
                "owner) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (idempotency_key) WHERE status != 'failed' DO NOTHING RETURNING report_id",
                (report_id, key or None, request_id, now, PENDING, previous, self.owner),
            ).fetchone()
            return (report_id, None) if inserted else None
