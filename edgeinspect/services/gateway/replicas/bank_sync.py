"""Anomaly banks reach every vision replica, whatever banks folder it has: a version taught or promoted through this
gateway is exported from the replica that made it and published in the store (services/store/banks.py), and every
replica behind the store's newest versions is given them by ImportBank. VisionClient runs a pass after each Teach and
Promote and one per follow-loop tick, so a replica that was down, or started later with an empty folder, catches up
by itself; until it holds a part's newest bank it is not used for that part's Score (clients.py). A version taught
on a box directly (`edgeinspect anomaly teach`) stays on that box's folder, as before.

Why the store: it is already the durable source of truth every gateway shares (SQLite for one gateway, PostgreSQL
for a pair), so a bank survives any vision box being recreated; a version is addressed by part, number and sha256
like the KB index by its fingerprint; and vision boxes need no access to each other.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from prometheus_client import Counter

from edgeinspect.errors import EdgeInspectError, FailedPrecondition
from edgeinspect.services.gateway.replicas.replica_set import Replica, ReplicaSet
from edgeinspect.services.store.banks import BankVersions, PublishedBank
from edgeinspect.v1 import vision_pb2, vision_pb2_grpc

log = logging.getLogger(__name__)

# What a replica answers an ImportBank it will refuse again (another bank under the number, a bank it cannot read).
REFUSALS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)

MOVE_TIMEOUT_S = 60.0  # one ExportBank or ImportBank: a bank's files, a few MB to tens of MB
REFUSED_RETRY_S = 60.0  # a replica that refused a version (it holds other content under its number) is asked again
PUSHES = Counter(
    "edgeinspect_bank_pushes", "anomaly bank versions given to vision replicas, by result (pushed | failed)", ["result"]
)


class BankSync:
    """Moves bank versions between the vision replicas and the store's `banks` table; one pass at a time."""

    def __init__(self, replicas: ReplicaSet[vision_pb2_grpc.VisionServiceStub], versions: BankVersions) -> None:
        self.replicas = replicas
        self.versions = versions
        self.staged: dict[str, dict[str, str]] = {}  # replica address -> part -> its staged bank_id (last Info)
        self._pass = asyncio.Lock()
        self._told: set[tuple[str, str]] = set()  # (where, what) failures logged once until they clear
        self._unpublished: set[tuple[str, str, int]] = set()  # (replica address, part, version) to export
        self._refused: dict[tuple[str, str], float] = {}  # (replica address, bank_id) -> when it refused it

    def observe(self, rep: Replica, info: vision_pb2.VisionInfo) -> None:
        """A replica's staged versions from its Info (its current ones are rep.banks)."""
        self.staged[rep.address] = {b.part: b.bank_id for b in info.staged_banks}

    async def publish(self, rep: Replica, part: str, version: int) -> None:
        """Exports a version `rep` just taught or promoted and records it; a failure is retried by every pass."""
        async with self._pass:
            self._unpublished.add((rep.address, part, version))  # until recorded, whatever goes wrong on the way
            if await self._publish(rep, part, version):
                self._unpublished.discard((rep.address, part, version))

    async def sync(self) -> None:
        """One pass: versions not recorded yet are exported again, then every replica is given the store's newest
        versions it lacks. Failures are logged and left to the next pass."""
        async with self._pass:
            by_address = {r.address: r for r in self._reachable()}
            for address, part, version in sorted(self._unpublished):
                if address in by_address and await self._publish(by_address[address], part, version):
                    self._unpublished.discard((address, part, version))
            try:
                rows = await asyncio.to_thread(self.versions.newest)
            except EdgeInspectError as exc:  # the report database is restarting: the next pass tries again
                self._failed("store", "read", f"published anomaly banks not readable: {exc}")
                return
            self._cleared("store", "read")
            for rep in by_address.values():
                for row in [r for r in rows if not self._holds(rep, r)]:
                    await self._push(rep, row)

    def _reachable(self) -> list[Replica]:
        return [r for r in self.replicas.replicas if r.serving and r.verified and not r.mismatch]

    def _holds(self, rep: Replica, row: PublishedBank) -> bool:
        live = bank_version(rep.banks.get(row.part, ""))
        if row.staged:
            return live >= row.version or self.staged.get(rep.address, {}).get(row.part) == row.bank_id
        return live >= row.version

    async def _publish(self, rep: Replica, part: str, version: int) -> bool:
        """Whether the version is recorded now (False: export or store failed, logged)."""
        request = vision_pb2.ExportBankRequest(part=part, version=version)
        try:
            reply = await rep.stub.ExportBank(request, timeout=MOVE_TIMEOUT_S)
            bank = PublishedBank(reply.part, reply.version, reply.bank_id, reply.sha256, reply.staged, rep.address,
                                 reply.archive)  # fmt: skip
            changed = await asyncio.to_thread(self.versions.publish, bank)
        except grpc.aio.AioRpcError as exc:
            self._failed(rep.address, f"{part}@v{version}", f"exporting part {part} v{version}: {exc.details()}")
            return exc.code() == grpc.StatusCode.NOT_FOUND  # gone from its folder: nothing to retry
        except FailedPrecondition as exc:  # the store holds other content under that number: retrying changes nothing
            self._failed(rep.address, f"{part}@v{version}", f"publishing part {part} v{version}: {exc}")
            return True
        except EdgeInspectError as exc:
            self._failed(rep.address, f"{part}@v{version}", f"publishing part {part} v{version}: {exc}")
            return False
        self._cleared(rep.address, f"{part}@v{version}")
        if changed:
            log.info("part %s v%d published in the store from vision %s (%s%s)", part, version, rep.address,
                     bank.bank_id, ", staged" if bank.staged else "")  # fmt: skip
        return True

    async def _push(self, rep: Replica, row: PublishedBank) -> None:
        key = (rep.address, row.bank_id)
        if time.monotonic() < self._refused.get(key, 0.0) + REFUSED_RETRY_S:
            return
        try:
            bank = await asyncio.to_thread(self.versions.get, row.part, row.version)
            archive = vision_pb2.BankArchive(part=bank.part, version=bank.version, bank_id=bank.bank_id,
                                             sha256=bank.sha256, archive=bank.archive, staged=bank.staged)  # fmt: skip
            held = await rep.stub.ImportBank(archive, timeout=MOVE_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            PUSHES.labels("failed").inc()
            if exc.code() in REFUSALS:
                self._refused[key] = time.monotonic()
            self._failed(rep.address, row.bank_id, f"part {row.part} v{row.version} not pushed: {exc.details()}")
            return
        except EdgeInspectError as exc:
            PUSHES.labels("failed").inc()
            self._failed(rep.address, row.bank_id, f"part {row.part} v{row.version} not pushed: {exc}")
            return
        PUSHES.labels("pushed").inc()
        self._refused.pop(key, None)
        self._cleared(rep.address, row.bank_id)
        log.info("part %s v%d pushed to vision %s (%s%s)", row.part, row.version, rep.address, held.bank_id,
                 ", staged" if held.staged else "")  # fmt: skip

    def _failed(self, where: str, what: str, why: str) -> None:
        if (where, what) not in self._told:  # once per failure, not once per pass
            self._told.add((where, what))
            log.warning("bank sync (%s): %s; retried every pass", where, why)

    def _cleared(self, where: str, what: str) -> None:
        self._told.discard((where, what))


def bank_version(bank_id: str) -> int:
    """The version number in a bank id 'PART@vN:hash8' (-1 when it has none)."""
    _, _, rest = bank_id.rpartition("@v")
    number = rest.split(":", 1)[0]
    return int(number) if number.isdigit() else -1
