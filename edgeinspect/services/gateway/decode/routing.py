"""The gateway's live view of its decoder stages: the one owner of stage health, bans and route choice.

Every configured endpoint is watched over a grpc.health.v1 Watch stream (the heartbeat: a dead process breaks the
stream at once). Each time an endpoint comes up it is handshaken afresh (protocol, checkpoint and tokenizer
fingerprints, layer range, codec), so a box restarted with another checkpoint is banned with the reason and never
used. Sessions report failures here; a failed endpoint is banned with exponential backoff and readmitted only after
a probe answers. A route is a chain of usable endpoints whose ranges tile [0, num_layers), least loaded first.
Re-planning (services/gateway/decode/replan.py) changes what endpoints serve; this module only sees the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2_grpc

from edgeinspect import codec
from edgeinspect.errors import Unavailable
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.tasks import BackgroundTasks
from edgeinspect.services.gateway.replicas.health import HANDSHAKE_TIMEOUT_S, ban, follow_health, probe_until_serving
from edgeinspect.v1 import common_pb2, stage_pb2, stage_pb2_grpc

log = logging.getLogger(__name__)


def fmt_range(start: int, end: int) -> str:
    return f"[{start},{end})"


@dataclass
class Endpoint:
    """One decoder-stage process as this gateway knows it."""

    address: str
    stub: stage_pb2_grpc.DecoderStageStub
    health: health_pb2_grpc.HealthStub
    channel: grpc.aio.Channel
    layer_start: int = -1  # the range it serves now (from its last handshake)
    layer_end: int = -1
    home: tuple[int, int] | None = None  # the range of its own config: its place in the normal plan
    weights: str = ""
    device: str = ""  # where it runs its layers ("cpu", "cuda:0"), from its handshake
    max_batch: int = 8  # sessions one of its forward passes holds (admission is sized from it)
    serving: bool = False  # its health watch says SERVING
    verified: bool = False  # handshaken since it last came up
    mismatch: str = ""  # why the last handshake refused it (never used until it comes up again)
    banned_until: float = 0.0
    ban_reason: str = ""
    failures: int = 0
    sessions: int = 0  # open sessions of this gateway routed through it
    last_step_ms: float = 0.0
    last_at: float = 0.0  # monotonic time of its latest good step (status: which replica of a range served last)
    probing: bool = False

    @property
    def range(self) -> tuple[int, int]:
        return (self.layer_start, self.layer_end)

    @property
    def name(self) -> str:
        return fmt_range(self.layer_start, self.layer_end)

    def usable(self, now: float) -> bool:
        return self.serving and self.verified and not self.mismatch and now >= self.banned_until

    def state(self, now: float) -> str:
        if self.mismatch:
            return "mismatch"
        if not self.serving:
            return "down" if self.home is not None else "connecting"
        if now < self.banned_until:
            return "banned"
        return "healthy" if self.verified else "connecting"


@dataclass
class RouterEvents:
    """Counters the status call and the metrics read."""

    failovers: int = 0
    bans: int = 0
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(f"{time.strftime('%H:%M:%S')} {text}")
        del self.notes[:-20]


class StageRouter:
    """Owns the endpoints: health watches, handshakes, bans with backoff and readmission, route choice."""

    def __init__(
        self,
        addresses: Iterable[str],
        identity: common_pb2.PeerIdentity,
        num_layers: int,
        wire_codec: codec.Codec,
        max_message_mb: int,
        on_change: Callable[[], None] = lambda: None,
        tls=None,
    ):
        self.identity = identity
        self.num_layers = num_layers
        self.codec = wire_codec
        self.on_change = on_change
        self.endpoints: list[Endpoint] = []
        for address in dict.fromkeys(addresses):  # a listed twice address is one endpoint
            # Forward streams are cancelled on every failover: no interceptors on them (see make_channel).
            channel = make_channel(address, max_message_mb, tls, intercept=False)
            self.endpoints.append(
                Endpoint(
                    address, stage_pb2_grpc.DecoderStageStub(channel), health_pb2_grpc.HealthStub(channel), channel
                )
            )
        self.events = RouterEvents()
        # Measured prefill speed (EWMA over sessions, ms per prompt token): stall bounds for prefills derive from it.
        self.prefill_ms_per_token = 0.0
        self._tasks = BackgroundTasks("decoder stage router")
        self._changed = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        for ep in self.endpoints:
            self._tasks.spawn(self._watch(ep), name=f"watch {ep.address}")

    async def close(self) -> None:
        await self._tasks.close()
        for ep in self.endpoints:
            await ep.channel.close()

    def _notify(self) -> None:
        self._changed.set()
        self.on_change()

    async def wait_changed(self, timeout: float) -> None:
        """Returns when any endpoint changed state, or after `timeout` seconds."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def wait_complete(self, timeout_s: float) -> None:
        """Waits until a complete route exists; Unavailable naming the missing ranges when none does in time."""
        deadline = time.monotonic() + timeout_s
        while not self.complete():
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(self.missing_message())
            await self.wait_changed(min(left, 0.5))

    # -- the heartbeat -------------------------------------------------------------------------------------------

    async def _watch(self, ep: Endpoint) -> None:
        """Follows the endpoint's health stream forever; a fresh handshake each time it (re)turns SERVING."""

        async def on_status(serving: bool) -> None:
            if serving and not ep.verified:
                await self._handshake(ep)
            self._set_serving(ep, serving, "NOT_SERVING")

        def on_lost(why: str) -> None:
            self._set_serving(ep, False, why)
            ep.verified = False  # whatever comes back on this address is handshaken again
            ep.mismatch = ""

        await follow_health(ep.health, on_status, on_lost)

    def _set_serving(self, ep: Endpoint, serving: bool, why: str) -> None:
        if ep.serving == serving:
            return
        ep.serving = serving
        if serving:
            log.info("stage %s %s is up", ep.address, ep.name)
        else:
            log.warning("stage %s %s is down (%s)", ep.address, ep.name, why)
            self.events.note(f"stage {ep.address} {ep.name} down: {why}")
        self._notify()

    async def _handshake(self, ep: Endpoint) -> None:
        """Asks what the endpoint serves, then handshakes expecting exactly that; a refusal bans it."""
        try:
            stats = await ep.stub.Stats(stage_pb2.StatsRequest(), timeout=HANDSHAKE_TIMEOUT_S)
            ident = stats.identity
            await ep.stub.Handshake(
                stage_pb2.HandshakeRequest(
                    client=self.identity,
                    expect_layer_start=ident.layer_start,
                    expect_layer_end=ident.layer_end,
                    codec=codec.codec_to_proto(self.codec),
                ),
                timeout=HANDSHAKE_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                ep.mismatch = exc.details() or exc.code().name
                log.error("stage %s refused: %s; it will not be used until it restarts", ep.address, ep.mismatch)
                self.events.note(f"stage {ep.address} refused: {ep.mismatch}")
                self._notify()
            else:
                log.warning("stage %s: handshake failed (%s); retrying", ep.address, exc.code().name)
            return
        ep.layer_start, ep.layer_end = ident.layer_start, ident.layer_end
        ep.weights = ident.weights_dtype
        ep.device = ident.device or "cpu"  # a stage from before the field runs on the CPU
        ep.max_batch = stats.max_batch_sessions or ep.max_batch
        home = (stats.home_layer_start, stats.home_layer_end)
        ep.home = home if home[1] > home[0] else ep.home or ep.range
        ep.mismatch = ""
        ep.verified = True
        log.info("stage %s handshaken: layers %s, weights %s on %s", ep.address, ep.name, ep.weights, ep.device)
        self._notify()

    async def rehandshake(self, ep: Endpoint) -> None:
        """After the endpoint changed its range (re-planning): what it serves is asked again."""
        ep.verified = False
        await self._handshake(ep)

    # -- failures, bans, readmission -----------------------------------------------------------------------------

    def report_failure(self, ep: Endpoint, reason: str) -> None:
        """A session saw `ep` fail or stall: ban it for a growing time; a probe readmits it afterwards."""
        delay = ban(ep)
        ep.ban_reason = reason
        self.events.bans += 1
        self.events.note(f"stage {ep.address} {ep.name} banned {delay:.1f}s: {reason}")
        log.warning(
            "stage %s %s banned for %.1fs after failure %d: %s", ep.address, ep.name, delay, ep.failures, reason
        )
        if not ep.probing:
            ep.probing = True  # before the task runs: a second failure now must not start another probe
            self._tasks.spawn(self._readmit(ep), name=f"readmit {ep.address}")
        self._notify()

    def observe_prefill(self, tokens: int, ms: float) -> None:
        per_token = ms / max(tokens, 1)
        self.prefill_ms_per_token = (
            per_token if not self.prefill_ms_per_token else 0.8 * self.prefill_ms_per_token + 0.2 * per_token
        )

    def report_success(self, ep: Endpoint, compute_ms: float) -> None:
        ep.failures = 0
        ep.last_step_ms, ep.last_at = compute_ms, time.monotonic()

    async def _readmit(self, ep: Endpoint) -> None:
        try:
            await probe_until_serving(ep.health, ep)
            log.info("stage %s %s readmitted", ep.address, ep.name)
            self._notify()
        finally:
            ep.probing = False

    # -- routes ----------------------------------------------------------------------------------------------------

    def usable(self, exclude: Iterable[Endpoint] = ()) -> list[Endpoint]:
        now = time.monotonic()
        skip = {id(e) for e in exclude}
        return [ep for ep in self.endpoints if ep.usable(now) and id(ep) not in skip]

    def route(self, exclude: Iterable[Endpoint] = ()) -> list[Endpoint]:
        """The least-loaded chain of usable endpoints tiling [0, num_layers); Unavailable naming the gap."""
        chain = choose_route(self.usable(exclude), self.num_layers)
        if chain is None:
            raise Unavailable(self.missing_message(exclude))
        return chain

    def complete(self) -> bool:
        return choose_route(self.usable(), self.num_layers) is not None

    def missing_message(self, exclude: Iterable[Endpoint] = ()) -> str:
        gaps = missing_ranges([ep.range for ep in self.usable(exclude)], self.num_layers)
        text = ", ".join(fmt_range(a, b) for a, b in gaps) or "a contiguous chain"
        return f"no healthy decoder stage serves layers {text}; retry once the stage is back"

    def acquire(self, route: list[Endpoint]) -> None:
        for ep in route:
            ep.sessions += 1

    def release(self, route: list[Endpoint]) -> None:
        for ep in route:
            ep.sessions -= 1

    # -- the plan ---------------------------------------------------------------------------------------------------

    def normal_plan(self) -> list[tuple[int, int]]:
        """The ranges the endpoints serve by their own configs."""
        return sorted({ep.home for ep in self.endpoints if ep.home is not None})

    def plan_in_force(self) -> list[tuple[int, int]]:
        return sorted({ep.range for ep in self.usable()})

    def plan_text(self) -> str:
        """'normal' while every range of the normal plan has a usable endpoint serving it, else the ranges used."""
        normal, now = self.normal_plan(), self.plan_in_force()
        if normal and all(r in now for r in normal) and all(r in normal for r in now):
            return "normal"
        return "degraded: " + "+".join(fmt_range(a, b) for a, b in now) if now else "none"

    def degraded_notes(self) -> list[str]:
        """Why the cluster is not at full strength (a range with fewer usable replicas than configured, ...)."""
        notes = []
        usable = self.usable()
        for home in self.normal_plan():
            configured = sum(1 for ep in self.endpoints if ep.home == home)
            up = sum(1 for ep in usable if ep.range == home)
            if up < configured:
                notes.append(f"layers {fmt_range(*home)}: {up} of {configured} replicas usable")
        if self.plan_text() != "normal":
            notes.append(f"plan in force: {self.plan_text()}")
        return notes


def choose_route(endpoints: list[Endpoint], num_layers: int) -> list[Endpoint] | None:
    """A chain of endpoints tiling [0, num_layers): at each layer the least-loaded endpoint starting there, with
    backtracking when a choice leads to a gap. Fewer hops win over more when both tile (a merged re-planned range
    is one hop)."""
    starts: dict[int, list[Endpoint]] = {}
    for ep in endpoints:
        if 0 <= ep.layer_start < ep.layer_end <= num_layers:
            starts.setdefault(ep.layer_start, []).append(ep)
    for options in starts.values():
        options.sort(key=lambda e: (e.sessions, -(e.layer_end - e.layer_start), e.last_step_ms))

    def walk(at: int, depth: int) -> list[Endpoint] | None:
        if at == num_layers:
            return []
        if depth > num_layers:
            return None
        for ep in starts.get(at, []):
            rest = walk(ep.layer_end, depth + 1)
            if rest is not None:
                return [ep, *rest]
        return None

    return walk(0, 0)


def missing_ranges(ranges: list[tuple[int, int]], num_layers: int) -> list[tuple[int, int]]:
    """Layer ranges no serving endpoint covers (by coverage, which is what a person needs to see)."""
    covered = [False] * num_layers
    for a, b in ranges:
        for i in range(max(a, 0), min(b, num_layers)):
            covered[i] = True
    gaps, start = [], None
    for i, c in enumerate([*covered, True]):
        if not c and start is None:
            start = i
        elif c and start is not None:
            gaps.append((start, i))
            start = None
    return gaps
