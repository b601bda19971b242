"""Replicas of a stateless role (vision, retrieval): the one owner of their health, handshakes, bans and choice.

Every endpoint is watched over grpc.health.v1 Watch and handshaken each time it comes up (the role's client says
what a handshake checks: the vision node's checkpoint fingerprint and anomaly banks, the retrieval node's KB index;
a replica behind on the version in use is held back until it has it). A request goes to the least
loaded usable replica (round robin among equals); a failure that says nothing about the request (UNAVAILABLE,
DEADLINE_EXCEEDED, CANCELLED: a dead, reset or stalled box) bans that replica with backoff and the request is sent
to another within its budget, through the project's one retry helper. The pieces (Watch loop, bans, readmission
probe) are the ones the decoder stages' router uses too (health.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2_grpc

from edgeinspect.errors import Unavailable
from edgeinspect.services.common import metrics
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.retry import retry_async
from edgeinspect.services.common.tasks import BackgroundTasks
from edgeinspect.services.gateway.replicas.health import ban, follow_health, probe_until_serving

log = logging.getLogger(__name__)

S = TypeVar("S")
T = TypeVar("T")
# Codes that say the replica, not the request, failed: the same request may go to another replica.
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
RETRY_BASE_S, RETRY_MAX_S = 0.05, 0.5  # between tries: the next replica is usually ready at once


@dataclass
class Replica(Generic[S]):
    """One process of a replicated role as this gateway knows it."""

    address: str
    stub: S
    health: health_pb2_grpc.HealthStub
    channel: grpc.aio.Channel
    serving: bool = False  # its health watch says SERVING
    verified: bool = False  # handshaken since it last came up
    mismatch: str = ""  # why its handshake refused it (not used until it comes up again)
    behind: str = ""  # why it is held back for now: an older version than the one in use (used once it has it)
    banned_until: float = 0.0
    ban_reason: str = ""
    failures: int = 0
    probing: bool = False
    inflight: int = 0  # this gateway's calls on it now
    served: int = 0  # calls it answered (round robin among equally loaded replicas)
    last_ms: float = 0.0  # its latest answered call, wall time
    banks: dict[str, str] = field(default_factory=dict)  # vision: part -> bank_id of its last Info
    index: IndexVersion | None = None  # retrieval: the KB index of its last Stats

    def usable(self, now: float) -> bool:
        return self.serving and self.verified and not self.mismatch and not self.behind and now >= self.banned_until

    def state(self, now: float) -> str:
        """healthy | connecting | down | banned | behind | mismatch, as the status view shows it."""
        if self.mismatch:
            return "mismatch"
        if not self.serving:
            return "down"
        if now < self.banned_until:
            return "banned"
        if not self.verified:
            return "connecting"
        return "behind" if self.behind else "healthy"

    def why(self, now: float) -> str:
        """What keeps it out of use, in words ("" while it is usable)."""
        state = self.state(now)
        why = {"mismatch": self.mismatch, "banned": self.ban_reason, "behind": self.behind, "down": self.ban_reason}
        return why.get(state, "")


@dataclass(frozen=True)
class IndexVersion:
    """A KB index a retrieval replica serves: its name in that node's folder, what it holds, when it was built."""

    version: str  # "v000007": counts per KB folder
    fingerprint: str  # what it holds (rag/store.py content_fingerprint): replicas agree on this
    created_at: str = ""  # RFC 3339, from the indexer: orders versions across folders

    def __str__(self) -> str:
        return f"{self.version} ({self.fingerprint})"


class ReplicaSet(Generic[S]):
    """The endpoints of one role: watched, handshaken, banned on failure, chosen per request."""

    def __init__(
        self,
        role: str,
        addresses: Iterable[str],
        stub: Callable[[grpc.aio.Channel], S],
        max_message_mb: int,
        tls=None,
        handshake: Callable[[Replica[S]], Awaitable[None]] | None = None,
    ):
        self.role = role
        self.handshake = handshake  # raises AioRpcError (retried later), sets replica.mismatch or calls hold()
        self.replicas: list[Replica[S]] = []
        for address in dict.fromkeys(addresses):  # a listed twice address is one endpoint
            channel = make_channel(address, max_message_mb, tls)
            self.replicas.append(Replica(address, stub(channel), health_pb2_grpc.HealthStub(channel), channel))
        if not self.replicas:
            raise ValueError(f"no {role} endpoint configured")
        self.last: Replica[S] | None = None  # the replica that answered the latest call
        self._tasks = BackgroundTasks(f"{role} replicas")

    @property
    def addresses(self) -> list[str]:
        return [r.address for r in self.replicas]

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        for rep in self.replicas:
            self._tasks.spawn(self._watch(rep), name=f"watch {rep.address}")

    async def close(self) -> None:
        await self._tasks.close()
        for rep in self.replicas:
            await rep.channel.close()

    # -- health and handshakes ----------------------------------------------------------------------------------

    async def _watch(self, rep: Replica[S]) -> None:
        async def on_status(serving: bool) -> None:
            if serving and not rep.verified:
                await self._handshake(rep)
            self._set_serving(rep, serving, "NOT_SERVING")

        def on_lost(why: str) -> None:
            self._set_serving(rep, False, why)
            rep.verified, rep.mismatch = False, ""  # whatever comes back on this address is handshaken again

        await follow_health(rep.health, on_status, on_lost)

    async def _handshake(self, rep: Replica[S]) -> None:
        if self.handshake is None:
            rep.verified = True
            return
        try:
            await self.handshake(rep)
        except grpc.aio.AioRpcError as exc:
            # Serving but not answering Info yet: look again shortly (the Watch sends nothing until a change).
            log.warning("%s %s: handshake failed (%s); retrying", self.role, rep.address, exc.code().name)
            self._tasks.spawn(self._handshake_later(rep), name=f"handshake {rep.address}")
            return
        if rep.mismatch:
            log.error("%s %s refused: %s; not used until it restarts", self.role, rep.address, rep.mismatch)
            return
        rep.verified = True
        self._publish(rep)

    async def _handshake_later(self, rep: Replica[S], delay_s: float = 1.0) -> None:
        await asyncio.sleep(delay_s)
        if rep.serving and not rep.verified and not rep.mismatch:
            await self._handshake(rep)

    def _set_serving(self, rep: Replica[S], serving: bool, why: str) -> None:
        if rep.serving != serving:
            rep.serving = serving
            if serving:
                log.info("%s %s is up", self.role, rep.address)
            else:
                log.warning("%s %s is down (%s)", self.role, rep.address, why)
        self._publish(rep)

    def hold(self, rep: Replica[S], why: str) -> None:
        """Keeps `rep` out of use for `why` (behind on the version in use); "" lets it back in."""
        if rep.behind == why:
            return
        if why:
            log.warning("%s %s held back: %s", self.role, rep.address, why)
        else:
            log.info("%s %s caught up: back in use", self.role, rep.address)
        rep.behind = why
        self._publish(rep)

    def _publish(self, rep: Replica[S]) -> None:
        usable = 1 if rep.usable(time.monotonic()) else 0
        metrics.REPLICA_USABLE.labels(role=self.role, endpoint=rep.address).set(usable)

    # -- the view readiness and status read ----------------------------------------------------------------------

    def usable(self, accept: Callable[[Replica[S]], bool] | None = None) -> list[Replica[S]]:
        now = time.monotonic()
        return [r for r in self.replicas if r.usable(now) and (accept is None or accept(r))]

    @property
    def serving(self) -> bool:
        """At least one replica can take a request."""
        return bool(self.usable())

    @property
    def state(self) -> str:
        """SERVING while one replica is usable; else the best state any replica is in (what is wrong, in a word)."""
        if self.serving:
            return "SERVING"
        now = time.monotonic()
        states = {r.state(now) for r in self.replicas}
        shown_as = (("banned", "BANNED"), ("connecting", "CONNECTING"), ("behind", "BEHIND"), ("mismatch", "MISMATCH"))
        for word, shown in shown_as:
            if word in states:
                return shown
        return "UNREACHABLE"

    def why_not(self) -> str:
        """Why no replica is usable, naming each."""
        now = time.monotonic()
        parts = [f"{r.address} {r.state(now)}" + (f" ({r.why(now)})" if r.why(now) else "") for r in self.replicas]
        return f"no usable {self.role} node: " + ", ".join(parts)

    # -- calls ----------------------------------------------------------------------------------------------------

    def pick(self, tried: list[Replica[S]], accept: Callable[[Replica[S]], bool] | None = None) -> Replica[S]:
        """The least loaded usable replica not tried yet by this request (the least used among equals)."""
        options = [r for r in self.usable(accept) if all(r is not t for t in tried)]
        if not options:
            raise Unavailable(f"{self.why_not()}; retry shortly", retry_after_ms=2000)
        return min(options, key=lambda r: (r.inflight, r.served))

    def report_failure(self, rep: Replica[S], reason: str) -> None:
        """A call on `rep` failed for a reason of the box: ban it with backoff; a probe readmits it. Calls that were
        in flight on it when it died count as one failure."""
        if time.monotonic() < rep.banned_until:
            return
        delay = ban(rep)
        rep.ban_reason = reason
        log.warning("%s %s banned for %.1fs after failure %d: %s", self.role, rep.address, delay, rep.failures, reason)
        self._publish(rep)
        if not rep.probing:
            rep.probing = True  # before the task runs: a second failure now must not start another probe
            self._tasks.spawn(self._readmit(rep), name=f"readmit {rep.address}")

    async def _readmit(self, rep: Replica[S]) -> None:
        try:
            await probe_until_serving(rep.health, rep)
            log.info("%s %s readmitted", self.role, rep.address)
            self._publish(rep)
        finally:
            rep.probing = False

    async def call(
        self,
        fn: Callable[[Replica[S], float], Awaitable[T]],
        budget_s: float,
        accept: Callable[[Replica[S]], bool] | None = None,
    ) -> T:
        """fn(replica, timeout_s) on a usable replica; a replica failure retried on another while budget_s lasts.
        Errors about the request itself propagate at once; the last failure propagates when none is left."""
        deadline = time.monotonic() + budget_s
        tried: list[Replica[S]] = []
        failed: list[grpc.aio.AioRpcError] = []

        async def attempt() -> T:
            try:
                rep = self.pick(tried, accept)
            except Unavailable:
                if failed:  # what the last replica said is the better answer than "none left"
                    raise failed[-1] from None
                raise
            tried.append(rep)
            rep.inflight += 1
            t0 = time.perf_counter()
            try:
                out = await fn(rep, max(0.001, deadline - time.monotonic()))
            except grpc.aio.AioRpcError as exc:
                if exc.code() in RETRY_CODES:
                    failed.append(exc)
                    metrics.REPLICA_CALLS.labels(role=self.role, endpoint=rep.address, outcome="retried").inc()
                    self.report_failure(rep, f"{exc.code().name}: {exc.details() or ''}"[:200])
                else:
                    metrics.REPLICA_CALLS.labels(role=self.role, endpoint=rep.address, outcome="failed").inc()
                raise
            finally:
                rep.inflight -= 1
            rep.failures, rep.served, rep.last_ms = 0, rep.served + 1, (time.perf_counter() - t0) * 1e3
            self.last = rep
            metrics.REPLICA_CALLS.labels(role=self.role, endpoint=rep.address, outcome="ok").inc()
            return out

        def give_up_past_deadline(_attempt: int, exc: BaseException, delay: float) -> None:
            if time.monotonic() + delay >= deadline:
                raise exc  # the budget is spent: the last failure is the answer

        return await retry_async(
            attempt,
            attempts=len(self.replicas) + 1,  # each replica once, and one more for one that came back meanwhile
            base_s=RETRY_BASE_S,
            max_s=RETRY_MAX_S,
            retry_codes=RETRY_CODES,
            on_retry=give_up_past_deadline,
        )
