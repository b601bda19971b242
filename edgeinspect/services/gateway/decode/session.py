"""Recovery's home: one inspection's generation across the decoder stages, surviving stage failures by replay.

The session keeps a journal (prompt ids, visual tokens, tokens generated so far). When a stage fails, closes its
stream or stalls past the step bound, the failed endpoint is reported to the router (which bans it), the session
takes another route and rebuilds its KV cache there by replaying the journal: the prompt exactly as first sent
(same chunks, same prefix), then every decode step but the last as first sent, every replayed step checked
against the journal (position by position: the stages refuse a step at the wrong position, and each replayed sample
must equal the token already generated). Greedy fp32 replicas reproduce the undisturbed run bit for bit, the
grammar matcher of the last stage advances over the same tokens, and the failed step then runs on the new route.
Failovers per inspection are bounded.

Grammar jump-forward: a greedy constrained step may bring, after its sampled token, the tokens the grammar forces
(exactly one allowed at each); they are journaled with it and the next step feeds them all at once. The replay
sends the same steps again, asking each for as many forced tokens as it brought the first time: the same grammar
state forces the same tokens, and the stages compute the same shapes as in the undisturbed run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from edgeinspect.errors import ResourceExhausted, Unavailable
from edgeinspect.services.common import metrics
from edgeinspect.services.gateway.decode.pipeline import (
    MicroBatchGroups,
    PrefixBook,
    PrefixMissed,
    RouteSession,
    StageFailure,
    StageRefused,
    StepResult,
    WireOptions,
    prefix_key,
    prompt_chunks,
)
from edgeinspect.services.gateway.decode.routing import Endpoint, StageRouter, fmt_range
from edgeinspect.v1 import inspection_pb2, stage_pb2, tensor_pb2

log = logging.getLogger(__name__)


@dataclass
class Journal:
    """What it takes to replay a session into a replacement route."""

    prompt_ids: list[int]
    visual_tokens: tensor_pb2.TensorFrame | None  # as received from the vision node
    # first step's (carries the grammar and the jump-forward limit); later steps send only the grammar's id
    sampling: stage_pb2.SamplingParams
    prefix_length: int = 0  # shared prompt prefix (system + spec context), 0: none
    generated: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)  # new tokens per step (sampled + forced); sum = len(generated)

    def add(self, result: StepResult) -> None:
        self.generated += result.tokens
        self.steps.append(len(result.tokens))

    def unfed(self) -> list[int]:
        """The newest step's tokens, which the caches do not hold yet: the next step's input."""
        return self.generated[-self.steps[-1] :]

    @property
    def forced(self) -> int:
        """Tokens the grammar forced (each one a decode step saved)."""
        return len(self.generated) - len(self.steps)

    def stop_at(self, token: int) -> bool:
        """True when the newest step brought `token` (end of sequence); whatever came after it is dropped."""
        new = self.unfed()
        if token not in new:
            return False
        drop = len(new) - new.index(token) - 1
        if drop:
            del self.generated[-drop:]
            self.steps[-1] -= drop
        return True


@dataclass(frozen=True)
class RecoveryPolicy:
    """Stall bounds and the failover budget (GatewaySettings fills it)."""

    max_failovers: int = 3
    stall_min_s: float = 2.0  # a decode step is stalled after max(stall_min_s, stall_factor x its usual time)
    stall_factor: float = 20.0
    prefill_stall_s: float = 60.0  # bound for one prefill (a whole prompt through a stage)
    chunk_tokens: int = 128
    image_token_id: int = 0
    route_wait_s: float = 0.0  # a session that lost its route waits this long for one (re-planning), new ones never


class InferenceSession:
    """Prefill, then decode steps; each survives a stage failure by moving to another route and replaying."""

    def __init__(
        self,
        router: StageRouter,
        groups: MicroBatchGroups,
        prefixes: PrefixBook,
        wire: WireOptions,
        base_id: str,
        journal: Journal,
        max_positions: int,
        policy: RecoveryPolicy,
    ):
        self.router = router
        self.groups = groups
        self.prefixes = prefixes
        self.wire_opts = wire
        self.base_id = base_id
        self.journal = journal
        self.max_positions = max_positions
        self.policy = policy
        self.group = 0
        self.wire: RouteSession | None = None
        self.failovers: list[inspection_pb2.Failover] = []
        self.refused: list[Endpoint] = []  # endpoints too full for this session: not banned, only avoided
        self.prefix_reused = 0
        self.prefilled = False  # the prompt went through on some route (replays then redo it)
        self.truncated = True  # the budget ran out before end of sequence
        self._opened = 0
        self._route: list[Endpoint] = []
        self._decode_ms = 0.0  # usual wall time of a decode step (EWMA), for the stall bound

    async def __aenter__(self) -> InferenceSession:
        self.group = self.groups.join()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self.groups.leave(self.group)
        wire, self.wire = self.wire, None
        if wire is None:
            return
        self.router.release(wire.route)
        if exc_type is None:
            await wire.close()
        else:
            wire.cancel()

    @property
    def route_names(self) -> list[str]:
        """The route that served the latest step (kept after the session closed, for the report)."""
        return [f"stage{k}={ep.address}{ep.name}" for k, ep in enumerate(self._route)]

    @property
    def served(self) -> list[inspection_pb2.StageServed]:
        """route_names' stages with the device and weight format each ran (formats differ after a GPU-to-CPU
        failover)."""
        return [
            inspection_pb2.StageServed(layers=ep.name, address=ep.address, device=ep.device, weights=ep.weights)
            for ep in self._route
        ]

    # -- the two operations --------------------------------------------------------------------------------------

    async def prefill(self) -> StepResult:
        """The prompt through the stages; samples the first token and journals it with any the grammar forces."""
        forced = self._forced_limit()
        result = await self._with_failover(lambda wire: self._prefill_on(wire, forced))
        self.prefilled = True
        self.journal.add(result)
        return result

    async def decode(self) -> StepResult:
        """Feeds the newest step's tokens (the last sampled one and those forced after it) as one step; samples and
        journals the next."""
        feed, forced = self.journal.unfed(), self._forced_limit()
        t0 = time.perf_counter()
        result = await self._with_failover(lambda wire: self._step_on(wire, feed, forced))
        ms = (time.perf_counter() - t0) * 1e3
        self._decode_ms = ms if not self._decode_ms else 0.8 * self._decode_ms + 0.2 * ms
        self.journal.add(result)
        return result

    def _forced_limit(self) -> int:
        """Jump-forward tokens the next step may bring: as many as asked for, never past the session's budget of
        positions (the step's sampled token comes first)."""
        want = self.journal.sampling.max_forced_tokens
        if not want or not self.max_positions:
            return want
        left = self.max_positions - len(self.journal.prompt_ids) - len(self.journal.generated) - 1
        return max(0, min(want, left))

    # -- failover --------------------------------------------------------------------------------------------------

    async def _with_failover(self, op) -> StepResult:
        noticed: float | None = None
        failure: StageFailure | None = None
        while True:
            try:
                if self.wire is None:
                    await self._open(replay=self.prefilled)
                result = await op(self.wire)
            except StageFailure as exc:
                failure, noticed = exc, noticed or time.perf_counter()
                self._fail_over(exc)
                continue
            except StageRefused as exc:
                self._drop_wire()
                self.refused.append(exc.endpoint)
                log.info("session %s: stage %s is full (%s); trying another route", self.base_id, exc.endpoint, exc)
                try:
                    self.router.route(exclude=self.refused)
                except Unavailable:
                    raise ResourceExhausted(
                        f"decoder stages are full: {exc}", retry_after_ms=exc.retry_after_ms
                    ) from None
                continue
            if failure is not None:
                self.failovers[-1].recovery_ms = (time.perf_counter() - noticed) * 1e3
                self.failovers[-1].route.extend(self.route_names)
                log.info(
                    "session %s: recovered from %s in %.0f ms",
                    self.base_id,
                    failure,
                    self.failovers[-1].recovery_ms,
                )
            for ep, timing in zip(self.wire.route, result.timings, strict=False):
                self.router.report_success(ep, timing.compute_ms)
            return result

    def _fail_over(self, exc: StageFailure) -> None:
        """Bans the failed endpoint, records the failover and drops the route; the next attempt replays."""
        position = self.wire.position if self.wire else 0
        self._drop_wire()
        self.router.report_failure(exc.endpoint, exc.reason)
        self.router.events.failovers += 1
        metrics.FAILOVERS.labels(stage=exc.endpoint.name).inc()
        self.failovers.append(
            inspection_pb2.Failover(
                stage=exc.endpoint.name,
                endpoint=exc.endpoint.address,
                position=position,
                reason=exc.reason,
                replayed_tokens=len(self.journal.generated) - (self.journal.steps[-1] if self.journal.steps else 0),
            )
        )
        log.warning(
            "session %s: stage %s %s failed at position %d (%s); failover %d of at most %d",
            self.base_id,
            exc.endpoint.address,
            exc.endpoint.name,
            position,
            exc.reason,
            len(self.failovers),
            self.policy.max_failovers,
        )
        if len(self.failovers) > self.policy.max_failovers:
            raise Unavailable(
                f"decoder stage {exc.endpoint.name} failed ({exc.reason}) and {self.policy.max_failovers} failovers "
                "did not get this inspection through; retry shortly"
            )

    def _drop_wire(self) -> None:
        if self.wire is not None:
            self.wire.cancel()
            self.router.release(self.wire.route)
            self.wire = None

    async def _open(self, replay: bool) -> None:
        """A route for the session (least loaded, avoiding full endpoints) under a fresh session id; with `replay`
        the journal is fed through it first so it holds what the failed route held."""
        # A session that already had a route (even one that stalled in its prefill) waits for one; a new one never.
        route = await self._choose_route(waiting=self._opened > 0)
        self._opened += 1
        session_id = self.base_id if self._opened == 1 else f"{self.base_id}-f{self._opened - 1}"
        self.wire = RouteSession(route, session_id, self.wire_opts, self.group, self.max_positions)
        self._route = route
        self.router.acquire(route)
        if not replay:
            return
        generated, steps = self.journal.generated, self.journal.steps
        # Each step asks for the forced tokens it brought the first time; the newest step is the caller's to send.
        replayed = (await self._prefill_on(self.wire, steps[0] - 1)).tokens
        fed = 0
        for n, brought in zip(steps, steps[1:], strict=False):
            replayed += (await self._step_on(self.wire, generated[fed : fed + n], brought - 1)).tokens
            fed += n
        if replayed != generated:
            pairs = enumerate(zip(replayed, generated, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(replayed), len(generated)))
            # The cache holds the journal's tokens either way; only this new route would have sampled otherwise.
            log.error(
                "session %s: replay on %s diverged at generated token %d (%s != %s): replicas differ in format?",
                self.base_id,
                self.route_names,
                at,
                replayed[at : at + 1],
                generated[at : at + 1],
            )
            if self.failovers:
                self.failovers[-1].reason += f"; replay diverged at token {at}"

    async def _choose_route(self, waiting: bool) -> list[Endpoint]:
        """A route now; a session that lost its route waits up to route_wait_s for one to appear (re-planning moves
        a failed range onto a survivor within seconds; a stalled stage is probed back in when it answers again)."""
        deadline = time.monotonic() + (self.policy.route_wait_s if waiting else 0.0)
        while True:
            try:
                return self.router.route(exclude=self.refused)
            except Unavailable:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await self.router.wait_changed(min(left, 0.5))

    # -- steps on one route ------------------------------------------------------------------------------------

    def _decode_timeout(self) -> float:
        usual_s = self._decode_ms / 1e3
        return max(self.policy.stall_min_s, self.policy.stall_factor * usual_s)

    async def _step_on(self, wire: RouteSession, tokens: list[int], forced: int) -> StepResult:
        """A decode step feeding `tokens` at the cached length; the last stage samples after the last of them."""
        return await wire.step(tokens, None, self._sampling(forced, schema=False), self._decode_timeout())

    def _sampling(self, forced: int, schema: bool) -> stage_pb2.SamplingParams:
        """The session's sampling params for one step, asking for up to `forced` jump-forward tokens; the schema
        itself travels only with a route's first step (the last stage keeps its grammar by id)."""
        sampling = stage_pb2.SamplingParams()
        sampling.CopyFrom(self.journal.sampling)
        if not schema:
            sampling.grammar_json = ""
        sampling.max_forced_tokens = forced
        return sampling

    def _chunks(self, ids: list[int], frame: tensor_pb2.TensorFrame | None):
        return prompt_chunks(ids, frame, self.policy.chunk_tokens, self.policy.image_token_id)

    async def _prefill_on(self, wire: RouteSession, forced: int) -> StepResult:
        """The prompt, sampling its first token (and up to `forced` jump-forward tokens). With a shared prefix
        (system prompt + spec context, before the image) that the stages hold, only the rest is sent; otherwise it
        is computed and the stages keep it. A stage that has evicted it answers a prefix cache miss: the session
        starts over on the same route."""
        j = self.journal
        ids, n = j.prompt_ids, j.prefix_length
        timeout = self._prefill_timeout(len(ids))
        t0 = time.perf_counter()
        try:
            return await self._prefill_prompt(wire, ids, n, timeout, self._sampling(forced, schema=True))
        finally:
            if self.wire is not None and self.wire.position >= len(ids):
                self.router.observe_prefill(len(ids) - self.prefix_reused, (time.perf_counter() - t0) * 1e3)

    def _prefill_timeout(self, tokens: int) -> float:
        """A prefill has stalled after stall_factor x its expected time (from the measured prefill speed; the
        configured bound until a prefill was measured), never less than stall_min_s."""
        per_token_s = self.router.prefill_ms_per_token / 1e3
        if not per_token_s:
            return self.policy.prefill_stall_s
        expected = per_token_s * min(tokens, self.policy.chunk_tokens or tokens)  # bounds each chunk's answer
        return min(self.policy.prefill_stall_s, max(self.policy.stall_min_s, self.policy.stall_factor * expected))

    async def _prefill_prompt(
        self, wire: RouteSession, ids: list[int], n: int, timeout: float, sampling: stage_pb2.SamplingParams
    ) -> StepResult:
        j = self.journal
        if n <= 0:
            return await wire.prefill(self._chunks(ids, j.visual_tokens), sampling, timeout, None)
        ref = stage_pb2.PrefixRef(key=prefix_key(ids[:n]), length=n)
        if ref.key in self.prefixes:
            wire.position = n
            try:
                result = await wire.prefill(self._chunks(ids[n:], j.visual_tokens), sampling, timeout, ref)
                self.prefix_reused = n
                return result
            except PrefixMissed as miss:
                log.info("session %s: %s; sending the whole prompt", self.base_id, miss)
                self.prefixes.forget(ref.key)
                wire = self._restart(wire)
        # The prefix is a chunk boundary, so the stages can store exactly its keys/values.
        chunks = self._chunks(ids[:n], None) + self._chunks(ids[n:], j.visual_tokens)
        result = await wire.prefill(chunks, sampling, timeout, ref)
        self.prefixes.remember(ref.key)
        return result

    def _restart(self, wire: RouteSession) -> RouteSession:
        """Drops the session on its route and starts over at position 0 under a new id (the old streams' release
        runs asynchronously on the stages, so the id must not be reused)."""
        wire.cancel()
        self._opened += 1
        self.wire = RouteSession(
            wire.route, f"{self.base_id}-f{self._opened - 1}", self.wire_opts, self.group, self.max_positions
        )
        return self.wire


def route_text(route: list[Endpoint]) -> str:
    return "+".join(fmt_range(*ep.range) for ep in route)
