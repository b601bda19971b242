"""The gateway's clients of the vision and retrieval replicas (their health, bans and choice: replica_set.py); each
holds its role's version policy: vision's anomaly banks (given to every replica through the store: bank_sync.py),
retrieval's KB index."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from edgeinspect import codec
from edgeinspect.errors import Unavailable
from edgeinspect.services.common.errors import error_code_of, upstream_peer
from edgeinspect.services.common.tasks import BackgroundTasks
from edgeinspect.services.common.tracing import client_span
from edgeinspect.services.gateway.replicas.bank_sync import BankSync, bank_version
from edgeinspect.services.gateway.replicas.health import HANDSHAKE_TIMEOUT_S
from edgeinspect.services.gateway.replicas.replica_set import IndexVersion, Replica, ReplicaSet
from edgeinspect.services.store.banks import BankVersions
from edgeinspect.v1 import retrieval_pb2, retrieval_pb2_grpc, vision_pb2, vision_pb2_grpc

log = logging.getLogger(__name__)
VISION_PUSHBACK_MS = 2000
BANK_VERSION_CODE = "anomaly_bank_version"  # vision's BankVersionMismatch.code
BANK_POLL_S = 1.0  # how often a replica behind on a bank is asked again
INDEX_POLL_S = 1.0  # how often a retrieval replica's KB index is asked again


class VisionClient:
    """The gateway's vision replicas: Encode, Score and Teach on a usable one. A replica is handshaken on our
    checkpoint fingerprint and its anomaly banks; Score of a part goes only to replicas holding the newest bank of
    that part seen on any replica (a replica behind is used again once it has it: it reloads a shared banks folder,
    or is given the version from the store by `banks`)."""

    def __init__(
        self,
        addresses: list[str],
        max_message_mb: int,
        tls=None,
        checkpoint_fingerprint: str = "",
        banks: BankVersions | None = None,
    ):
        self.fingerprint = checkpoint_fingerprint  # "": not checked (tools that only teach)
        self.replicas: ReplicaSet[vision_pb2_grpc.VisionServiceStub] = ReplicaSet(
            "vision", addresses, vision_pb2_grpc.VisionServiceStub, max_message_mb, tls, handshake=self._handshake
        )
        # The store's published banks, given to replicas that lack them (None: no store, e.g. tools that only teach)
        self.bank_sync = BankSync(self.replicas, banks) if banks is not None else None
        self.newest: dict[str, str] = {}  # part -> the newest bank_id seen on any replica (what Score expects)
        self._versions: dict[str, int] = {}  # part -> that bank's version number
        self._following = BackgroundTasks("vision replicas")  # the bank-version poll

    @property
    def address(self) -> str:
        return ",".join(self.replicas.addresses)

    @property
    def serving(self) -> bool:
        return self.replicas.serving

    def start(self) -> None:
        self.replicas.start()
        self._following.spawn(self._follow_banks(), name="follow banks")

    async def close(self) -> None:
        await self._following.close()
        await self.replicas.close()

    # -- handshake and banks --------------------------------------------------------------------------------------

    async def _handshake(self, rep: Replica) -> None:
        """Our checkpoint, else refused; then its banks (a restarted replica's banks compare by version)."""
        info = await rep.stub.Info(vision_pb2.InfoRequest(), timeout=HANDSHAKE_TIMEOUT_S)
        theirs = info.identity.checkpoint_fingerprint
        if self.fingerprint and theirs and theirs != self.fingerprint:
            rep.mismatch = f"vision node {rep.address} runs checkpoint {theirs}, this gateway {self.fingerprint}"
            return
        rep.banks = {}
        self._observe(rep, info)

    def _observe(self, rep: Replica, info: vision_pb2.VisionInfo) -> None:
        """A replica's banks from its Info. A bank that changed on a replica that stayed up (a teach, a reload, a
        rollback, an import) is the newest of its part; a replica seen afresh only moves a part forward by version."""
        banks = info.banks
        if self.bank_sync is not None:
            self.bank_sync.observe(rep, info)
        for bank in banks:
            held = rep.banks.get(bank.part)
            changed = held is not None and held != bank.bank_id
            if changed or bank.part not in self.newest or bank.version > self._versions.get(bank.part, -1):
                if self.newest.get(bank.part) != bank.bank_id:
                    log.info("part %s: newest anomaly bank %s (vision %s)", bank.part, bank.bank_id, rep.address)
                self.learned(bank.part, bank.bank_id, bank.version)
        rep.banks = {b.part: b.bank_id for b in banks}

    def learned(self, part: str, bank_id: str, version: int = -1) -> None:
        """`bank_id` is the part's newest bank (seen in an Info, or published by a Teach through this gateway)."""
        self.newest[part] = bank_id
        self._versions[part] = version if version >= 0 else bank_version(bank_id)

    async def refresh(self, rep: Replica) -> None:
        """Reads the replica's banks again (it reloads new versions from its disk within its reload_interval_s)."""
        info = await rep.stub.Info(vision_pb2.InfoRequest(), timeout=HANDSHAKE_TIMEOUT_S)
        self._observe(rep, info)

    async def _follow_banks(self) -> None:
        """Every BANK_POLL_S each usable replica's banks are read again: a new version one of them loaded becomes
        the newest, and a replica behind is back in use for that part once it has it (given by the bank sync)."""
        while True:
            await asyncio.sleep(BANK_POLL_S)
            await self._refresh_all()
            await self._sync_banks()

    async def _sync_banks(self) -> None:
        """One bank-sync pass (bank_sync.py), after a teach or promote here and on every poll; a failed pass is
        logged and the next one tries again (the loop outlives a report database that is restarting)."""
        if self.bank_sync is None:
            return
        try:
            await self.bank_sync.sync()
        except Exception as exc:
            log.warning("anomaly bank sync pass failed: %s", exc)

    # -- calls ----------------------------------------------------------------------------------------------------

    async def encode(
        self, image: bytes, wire_codec: codec.Codec, zstd: bool, timeout_s: float
    ) -> vision_pb2.EncodeResponse:
        """Visual tokens of one image from a usable replica (another tried when one fails, within timeout_s);
        no replica answering is Unavailable with pushback."""
        request = vision_pb2.EncodeRequest(image=image, codec=codec.codec_to_proto(wire_codec), zstd=zstd)

        async def one(rep: Replica, timeout: float) -> vision_pb2.EncodeResponse:
            attrs = {"edgeinspect.image_bytes": len(image), "edgeinspect.codec": str(wire_codec),
                     "edgeinspect.endpoint": rep.address}  # fmt: skip
            with client_span("vision encode", attrs) as span:
                reply = await rep.stub.Encode(request, timeout=timeout)
                if span is not None:
                    span.set_attribute("edgeinspect.codec_bytes", codec.wire_nbytes(reply.visual_tokens))
                    span.set_attribute("edgeinspect.visual_tokens", (reply.visual_tokens.shape or [0])[0])
                    span.set_attribute("edgeinspect.encode_ms", reply.encode_ms)
                return reply

        try:
            return await self.replicas.call(one, timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                log.warning("vision %s: %s", upstream_peer(exc), exc.details())
                raise Unavailable(
                    "no vision node is available; retry shortly", retry_after_ms=VISION_PUSHBACK_MS
                ) from None
            raise

    async def info(self) -> vision_pb2.VisionInfo:
        """The Info of a usable replica (else of any serving one, so a caller can see why it was refused)."""
        reps = self.replicas.usable() or [r for r in self.replicas.replicas if r.serving] or self.replicas.replicas
        return await reps[0].stub.Info(vision_pb2.InfoRequest(), timeout=10)

    async def score(self, request: vision_pb2.ScoreRequest, timeout_s: float) -> vision_pb2.AnomalyScore:
        """The anomaly gate's score of one frame on a replica holding the part's newest bank (expect_bank_id says
        which); errors about the frame propagate (services/gateway/gate.py decides on them)."""
        deadline = time.monotonic() + timeout_s
        part = request.part
        try:
            return await self._score_on_current(request, deadline)
        except grpc.aio.AioRpcError as exc:
            if error_code_of(exc) != BANK_VERSION_CODE:
                raise
            # The replica holds another version than its last Info said: read the banks again and choose again.
            log.info("part %s: %s; refreshing the vision replicas' banks", part, exc.details())
        await self._refresh_all()
        return await self._score_on_current(request, deadline)

    async def _score_on_current(self, request: vision_pb2.ScoreRequest, deadline: float) -> vision_pb2.AnomalyScore:
        part = request.part

        def current(rep: Replica) -> bool:
            return rep.banks.get(part, "") == self.newest.get(part, "")

        if self.replicas.serving and not self.replicas.usable(current):
            await self._refresh_all()  # one may have reloaded since the last poll
            if not self.replicas.usable(current):
                raise Unavailable(
                    f"no vision replica holds part {part}'s newest anomaly bank {self.newest.get(part)} yet (each "
                    "reloads its banks folder within its reload_interval_s); retry shortly",
                    retry_after_ms=VISION_PUSHBACK_MS,
                )

        async def one(rep: Replica, timeout: float) -> vision_pb2.AnomalyScore:
            call = vision_pb2.ScoreRequest()
            call.CopyFrom(request)
            call.expect_bank_id = self.newest.get(part, "")
            with client_span("vision score", {"edgeinspect.part": part, "edgeinspect.endpoint": rep.address}) as span:
                reply = await rep.stub.Score(call, timeout=timeout)
                if reply.bank_id and not call.expect_bank_id:  # the first Score of a part no Info listed yet
                    rep.banks[part] = reply.bank_id
                    self.learned(part, reply.bank_id)
                if span is not None:
                    span.set_attribute("edgeinspect.anomaly_score", reply.score)
                    span.set_attribute("edgeinspect.score_ms", reply.score_ms)
                return reply

        return await self.replicas.call(one, max(0.001, deadline - time.monotonic()), accept=current)

    async def _refresh_all(self) -> None:
        for rep in self.replicas.usable():
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.refresh(rep)

    async def teach(self, request: vision_pb2.TeachRequest, timeout_s: float) -> vision_pb2.TeachResponse:
        """Publishes a part's next bank version on one replica (slow: features for every frame). Not retried on
        another: a Teach that timed out may have published. Replicas sharing its banks folder reload it."""
        rep = self.replicas.pick([])
        with client_span("vision teach", {"edgeinspect.part": request.part, "edgeinspect.frames": len(request.frames),
                                          "edgeinspect.endpoint": rep.address}):  # fmt: skip
            reply = await rep.stub.Teach(request, timeout=timeout_s)
        if not reply.bank.staged:  # a staged version is nobody's newest until promoted
            rep.banks[reply.bank.part] = reply.bank.bank_id
            self.learned(reply.bank.part, reply.bank.bank_id, reply.bank.version)
        await self._published_on(rep, reply.bank)
        return reply

    async def promote(self, request: vision_pb2.PromoteRequest, timeout_s: float) -> vision_pb2.AnomalyBank:
        """Makes a part's staged bank version current on one replica; replicas sharing its banks folder reload it."""
        rep = self.replicas.pick([])
        with client_span("vision promote", {"edgeinspect.part": request.part, "edgeinspect.endpoint": rep.address}):
            bank = await rep.stub.Promote(request, timeout=timeout_s)
        rep.banks[bank.part] = bank.bank_id
        self.learned(bank.part, bank.bank_id, bank.version)
        await self._published_on(rep, bank)
        return bank

    async def _published_on(self, rep: Replica, bank: vision_pb2.AnomalyBank) -> None:
        """After a teach or promote on `rep`: the version goes to the store and the other replicas now, not at the
        next poll. The call succeeded whatever happens here: a version not moved yet is moved by a later pass."""
        if self.bank_sync is None:
            return
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.refresh(rep)  # its staged versions too: it is not given its own version back
        try:
            await self.bank_sync.publish(rep, bank.part, bank.version)
        except Exception as exc:
            log.warning("part %s v%d not published for the other vision replicas yet: %s", bank.part, bank.version, exc)
        await self._sync_banks()


class RetrievalClient:
    """The gateway's retrieval replicas: Search on a usable one, another tried when one fails. A replica is
    handshaken on its KB index (IndexStats): only replicas serving the index in use are searched, so every answer
    (references and prompt) comes from one index whichever replica gives it. The index in use is `pinned` when
    configured, else the newest any replica serves; a replica behind is used again once it has reloaded it."""

    def __init__(self, addresses: list[str], max_message_mb: int, tls=None, index: str = ""):
        self.pinned = index  # a version name or fingerprint every replica must serve ("": the newest seen)
        self.replicas: ReplicaSet[retrieval_pb2_grpc.RetrievalServiceStub] = ReplicaSet(
            "retrieval", addresses, retrieval_pb2_grpc.RetrievalServiceStub, max_message_mb, tls,
            handshake=self._handshake,
        )  # fmt: skip
        self.current: IndexVersion | None = None  # the newest index seen on any replica (unpinned: the one in use)
        self._following = BackgroundTasks("retrieval replicas")  # the index-version poll

    @property
    def address(self) -> str:
        return ",".join(self.replicas.addresses)

    @property
    def serving(self) -> bool:
        return self.replicas.serving

    @property
    def in_use(self) -> str:
        """The index searched, in words (status)."""
        if self.pinned:
            return f"{self.pinned} (configured)"
        return str(self.current) if self.current else ""

    def start(self) -> None:
        self.replicas.start()
        self._following.spawn(self._follow_index(), name="follow index")

    async def close(self) -> None:
        await self._following.close()
        await self.replicas.close()

    # -- handshake and index versions -------------------------------------------------------------------------------

    async def _handshake(self, rep: Replica) -> None:
        """Its index, seen afresh (a restarted replica's index moves the one in use only forward)."""
        await self.refresh(rep, fresh=True)

    async def refresh(self, rep: Replica, fresh: bool = False) -> None:
        """Reads the replica's index again (it reloads a new version from its KB folder within reload_interval_s)."""
        stats = await rep.stub.Stats(retrieval_pb2.IndexStatsRequest(), timeout=HANDSHAKE_TIMEOUT_S)
        self._observe(rep, IndexVersion(stats.index_version, stats.fingerprint or stats.index_version,
                                        stats.created_at), fresh)  # fmt: skip

    def _observe(self, rep: Replica, index: IndexVersion, fresh: bool) -> None:
        """An index that changed on a replica that stayed up (a re-index, a rollback) is the newest; a replica seen
        afresh moves it only forward (by build time). Then every replica not on the index in use is held back."""
        changed = not fresh and rep.index is not None and rep.index.fingerprint != index.fingerprint
        rep.index = index
        if changed or newer(index, self.current):
            if self.current is None or self.current.fingerprint != index.fingerprint:
                log.info("newest KB index %s (retrieval %s)", index, rep.address)
            self.current = index
        for other in self.replicas.replicas:
            if other.index is not None:
                self.replicas.hold(other, self._behind(other.index))

    def _behind(self, index: IndexVersion) -> str:
        """Why a replica on `index` is not searched ("": it is on the index in use)."""
        if self.pinned:
            on = self.pinned in (index.version, index.fingerprint)
            return "" if on else f"serves index {index}, this gateway is configured for {self.pinned}"
        if self.current is None or index.fingerprint == self.current.fingerprint:
            return ""
        return f"serves index {index}, older than {self.current}: searched once it has it"

    async def _follow_index(self) -> None:
        """Every INDEX_POLL_S each replica's index is read again: a new version one of them loaded becomes the one in
        use, and a replica behind is searched again once it has it."""
        while True:
            await asyncio.sleep(INDEX_POLL_S)
            for rep in self.replicas.replicas:
                if rep.serving and rep.verified and not rep.mismatch:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await self.refresh(rep)

    # -- calls ----------------------------------------------------------------------------------------------------

    async def search(
        self, query: str, k: int, filters: dict[str, str], timeout_s: float
    ) -> retrieval_pb2.SearchResponse:
        request = retrieval_pb2.SearchRequest(query=query, k=k, filters=filters)

        async def one(rep: Replica, timeout: float) -> retrieval_pb2.SearchResponse:
            attrs = {"edgeinspect.k": k, "edgeinspect.filtered": bool(filters), "edgeinspect.endpoint": rep.address}
            with client_span("retrieval search", attrs) as span:
                reply = await rep.stub.Search(request, timeout=timeout)
                if span is not None:
                    span.set_attribute("edgeinspect.chunks", len(reply.chunks))
                    span.set_attribute("edgeinspect.search_ms", reply.search_ms)
            if rep.index is not None and reply.index_fingerprint not in ("", rep.index.fingerprint):
                # It swapped its index since the last poll: read it again; an answer off the index in use is refused.
                await self.refresh(rep)
                if rep.behind:
                    raise Unavailable(f"retrieval {rep.address} {rep.behind}", retry_after_ms=1000)
            return reply

        return await self.replicas.call(one, timeout_s)


def newer(index: IndexVersion, than: IndexVersion | None) -> bool:
    """`index` was built after `than` (the version name orders two built in the same second in one folder)."""
    return than is None or (index.created_at, index.version) > (than.created_at, than.version)
