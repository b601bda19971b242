"""The stage's compute side: a StageExecutor, per-session sampling state, eviction, continuous batching.

Steps from concurrent streams are queued; one drain task runs them on the compute thread, each forward pass
holding every ready session the scheduler admits (services/stage/scheduler.py). Steps arriving while a pass runs
join the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from edgeinspect import PROTOCOL_VERSION
from edgeinspect.errors import PeerMismatch, PrefixCacheMiss, ResourceExhausted, Unavailable
from edgeinspect.models.checkpoint import Checkpoint, open_checkpoint
from edgeinspect.models.device import free_bytes, resolve_device
from edgeinspect.models.grammar import SessionConstraints, grammar_cache_for
from edgeinspect.models.prefix_cache import PrefixCache
from edgeinspect.models.sampling import SamplingParams, make_generator, sample
from edgeinspect.models.stage import (
    LayerRange,
    StageExecutor,
    StepInput,
    chunk_input,
    load_device_stage,
    step_positions,
)
from edgeinspect.services.common import metrics
from edgeinspect.services.stage.admission import RETRY_AFTER_MS, kv_budget_bytes, refusal, reservation_bytes
from edgeinspect.services.stage.batching import Job
from edgeinspect.services.stage.eviction import SessionUsage, choose_evictions
from edgeinspect.services.stage.scheduler import BatchLimits, Pending, plan_step
from edgeinspect.services.stage.settings import StageSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    protocol_version: str
    checkpoint_fingerprint: str
    tokenizer_fingerprint: str
    layer_start: int
    layer_end: int
    num_layers: int
    weights_dtype: str
    device: str = "cpu"  # where the layers run ("cuda:0"): reported in the handshake, never checked


@dataclass
class SessionWork:
    """One session's step as the servicer hands it over (tensors already decoded)."""

    session_id: str
    inputs: StepInput
    sampling: SamplingParams | None = None
    return_logits: bool = False
    grammar_id: str = ""  # constrained decoding (last stage): the schema's id ...
    grammar_json: str = ""  # ... and, on the session's first step, the schema
    prefix_key: str = ""  # prefix cache: the shared prompt prefix's key ...
    prefix_length: int = 0  # ... and its positions
    micro_batch: int = 0  # pipeline micro-batch group: one group per forward pass
    max_positions: int = 0  # the most positions the session will reach (KV reserved for them); 0: unknown
    max_forced_tokens: int = 0  # grammar jump-forward (greedy, constrained): return up to this many forced tokens


@dataclass
class SessionOutcome:
    session_id: str
    length: int
    hidden: torch.Tensor | None = None  # [T, D]
    token_id: int = -1
    logits: torch.Tensor | None = None  # [vocab]
    forced_token_ids: list[int] = field(default_factory=list)  # jump-forward: forced after token_id, accepted
    batch_sessions: int = 1  # sessions in the forward pass that finished this step (traces)


class StageBackend:
    def __init__(self, cfg: StageSettings, ckpt: Checkpoint | None = None):
        self.cfg = cfg
        self.ckpt = ckpt or open_checkpoint(cfg.checkpoint)
        self.range = LayerRange(cfg.layer_start, cfg.layer_end, self.ckpt.num_layers)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = resolve_device(cfg.device, f"stage {self.range}")
        self.executor = StageExecutor(
            load_device_stage(self.ckpt, self.range, cfg.weights.value, self.device),
            native=cfg.native_kernels,
            kv_cache=cfg.kv_cache.value,
            device=self.device,
        )
        self.hidden_size = self.ckpt.text_config.hidden_size
        self.vision_hidden = self.ckpt.vision_config.hidden_size
        self.identity = Identity(
            PROTOCOL_VERSION,
            self.ckpt.fingerprint,
            self.ckpt.tokenizer_fingerprint,
            self.range.start,
            self.range.end,
            self.range.total,
            self.executor.module.weights,  # what runs: `auto` is resolved by measurement at load
            str(self.device),
        )
        self._generators: dict[str, torch.Generator | None] = {}
        self.prefixes = PrefixCache(cfg.prefix_cache_mb << 20)
        # Per-session grammar matchers at the sampling stage; the tokenizer is loaded on the first constrained step.
        self.constraints = SessionConstraints(lambda: grammar_cache_for(self.ckpt))
        self._busy: set[str] = set()
        # Torch work runs on one thread: steps are serialised and the event loop stays free for health checks.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage-compute")
        self.evicted = {"ttl": 0, "budget": 0}  # "budget" stays 0: admission refuses new sessions instead
        self.refused = 0  # new sessions refused because the KV budget could not hold them
        # KV bytes reserved per admitted session, to the end of its budget of positions (admission.py)
        self._reserved: dict[str, int] = {}
        self.released = 0
        self.limits = BatchLimits(
            max_sessions=cfg.max_batch_sessions,
            max_tokens=cfg.max_step_tokens,
            kv_budget_bytes=kv_budget_bytes(cfg.kv_budget_mb << 20, free_bytes(self.device), cfg.kv_free_fraction),
            kv_bytes_per_position=self.executor.kv_bytes_per_position(),
        )
        self._jobs: dict[int, Job] = {}
        self._seq = 0
        self._drainer: asyncio.Task | None = None
        # set whenever a step is queued; each drain task makes its own (a backend may outlive one asyncio.run)
        self._arrived = asyncio.Event()
        # sessions of the last two forward passes of each micro-batch group
        self._recent: dict[int, deque[set[str]]] = {}
        self.steps_run = 0  # forward passes
        self.sessions_stepped = 0  # session-steps inside them (their ratio is the mean batch size)

    @property
    def is_first(self) -> bool:
        return self.range.is_first

    @property
    def is_last(self) -> bool:
        return self.range.is_last

    def check_peer(self, client: Identity, expect_start: int, expect_end: int) -> None:
        """Refuses a peer that differs in anything that would make tensors meaningless; names each difference."""
        ours = self.identity
        diffs = []
        if client.protocol_version and client.protocol_version != ours.protocol_version:
            diffs.append(f"protocol {client.protocol_version} != {ours.protocol_version}")
        if client.checkpoint_fingerprint != ours.checkpoint_fingerprint:
            diffs.append(f"checkpoint fingerprint {client.checkpoint_fingerprint} != {ours.checkpoint_fingerprint}")
        if client.tokenizer_fingerprint != ours.tokenizer_fingerprint:
            diffs.append(f"tokenizer fingerprint {client.tokenizer_fingerprint} != {ours.tokenizer_fingerprint}")
        if (expect_start, expect_end) != (ours.layer_start, ours.layer_end):
            diffs.append(
                f"layer range [{expect_start}, {expect_end}) expected, this stage serves "
                f"[{ours.layer_start}, {ours.layer_end})"
            )
        if diffs:
            raise PeerMismatch("peer mismatch: " + "; ".join(diffs))

    async def run(self, work: list[SessionWork]) -> list[SessionOutcome]:
        """Admits the new sessions of `work` (admit), then runs its steps (submit)."""
        self.admit(work)
        return await self.submit(work)

    async def submit(self, work: list[SessionWork]) -> list[SessionOutcome]:
        """Queues admitted steps; they run in the next forward passes, batched with other streams' steps."""
        loop = asyncio.get_running_loop()
        jobs = []
        for w in work:
            self._seq += 1
            jobs.append(Job(self._seq, w, loop.create_future(), step_positions(w.inputs)))
            self._jobs[self._seq] = jobs[-1]
        ids = {w.session_id for w in work}
        self._busy |= ids
        if self._drainer is None or self._drainer.done():
            self._arrived = asyncio.Event()  # bound to this loop (a backend may outlive one asyncio.run)
            self._drainer = loop.create_task(self._drain())
        self._arrived.set()
        try:
            return list(await asyncio.gather(*(j.future for j in jobs)))
        finally:
            for j in jobs:
                if not j.future.done():
                    j.future.cancel()  # a cancelled caller's steps that have not run are dropped
            self._busy -= ids
            self._update_gauges()

    def admit(self, work: list[SessionWork]) -> None:
        """Reserves KV for each new session in `work` to the end of its budget of positions, or refuses them all
        (ResourceExhausted, nothing reserved) when the budget cannot hold them beside the live reservations."""
        held = self.reservations()
        added: dict[str, int] = {}
        for w in work:
            if w.session_id in held or w.session_id in added:
                continue
            end = w.inputs.position + step_positions(w.inputs)
            need = reservation_bytes(w.max_positions, end, self.limits.kv_bytes_per_position)
            why = refusal(need, held | added, self.limits.kv_budget_bytes)
            if why is not None:
                self.refused += 1
                log.info("refused session %s: %s", w.session_id, why)
                raise ResourceExhausted(why, retry_after_ms=RETRY_AFTER_MS)
            added[w.session_id] = need
        self._reserved.update(added)

    def reservations(self) -> dict[str, int]:
        """KV bytes each live session holds against the budget: its reservation, or more where it grew past one
        (a session of unknown budget reserves only its first step)."""
        held = dict(self._reserved)
        for sid, sess in list(self.executor.sessions.items()):  # list(): the compute thread may open one now
            held[sid] = max(held.get(sid, 0), sess.nbytes)
        return held

    def _reserved_positions(self, session_id: str) -> int:
        return self._reserved.get(session_id, 0) // max(self.limits.kv_bytes_per_position, 1)

    async def _drain(self) -> None:
        try:
            await self._drain_loop()
        except BaseException as exc:
            # Never leave callers waiting on a queue nobody drains: they hear what stopped it.
            log.exception("stage step queue stopped")
            error = exc if isinstance(exc, Exception) else Unavailable("the stage is shutting down")
            for job in self._jobs.values():
                if not job.future.done():
                    job.future.set_exception(error)
            raise

    async def _drain_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for seq in [s for s, j in self._jobs.items() if j.future.done()]:
                del self._jobs[seq]
            if not self._jobs:
                return
            await self._wait_for_recent_sessions()
            jobs = dict(self._jobs)
            chosen, results = await loop.run_in_executor(self._pool, self._plan_and_run, jobs)
            if chosen:  # a pass holds one group (plan_step)
                recent = self._recent.setdefault(chosen[0][0].work.micro_batch, deque(maxlen=2))
                recent.append({job.work.session_id for job, _ in chosen})
            for (job, _), res in zip(chosen, results, strict=True):
                if job.future.done() or res is None:
                    continue
                if isinstance(res, Exception):
                    job.future.set_exception(res)
                else:
                    job.future.set_result(res)

    async def _wait_for_recent_sessions(self) -> None:
        """Gives the sessions of the last two passes of the next pass's micro-batch group up to batch_window_ms
        to queue their next steps.

        Their answers travel to the client and back, so the first to return would otherwise start a pass alone
        and the rest wait for it: batches split into groups that alternate and never merge again (measured: mean
        batch 2.0 of 4 concurrent sessions; 1.0 of 2). Two passes, so that alternating groups are seen and
        merged (per group: groups take turns by design, and a group split once must merge again). The wait ends
        as soon as they are all queued: in steady state it costs nothing; a session that is busy elsewhere
        (another pipeline stage) costs at most the window."""
        window = self.cfg.batch_window_ms / 1e3
        live = [j for j in self._jobs.values() if not j.future.done()]
        if window <= 0 or not live:
            return
        group = min(live, key=lambda j: j.seq).work.micro_batch  # the next pass runs the oldest step's group
        # released ones will not come back
        expected = set().union(*self._recent.get(group, ())) & set(self.executor.sessions)
        if len(expected) < 2:
            return
        deadline = asyncio.get_running_loop().time() + window
        while expected - {j.work.session_id for j in self._jobs.values() if not j.future.done()}:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _plan_and_run(self, jobs: dict[int, Job]) -> tuple[list[tuple[Job, int]], list]:
        """On the compute thread (the KV byte count must not race a step): plan the next pass, then run it."""
        pending = [Pending(j.seq, j.work.session_id, max(j.remaining, 1), j.work.micro_batch) for j in jobs.values()]
        chosen = [(jobs[p.seq], p.tokens) for p in plan_step(pending, self.limits, self.executor.kv_bytes())]
        return chosen, self._run_planned(chosen)

    def _run_planned(self, chosen: list[tuple[Job, int]]) -> list[SessionOutcome | Exception | None]:
        """One forward pass over a chunk of each chosen job: an outcome when a job finishes, None while it has
        chunks left, or the error of a job whose input was refused (the other jobs still run)."""
        results: list[SessionOutcome | Exception | None] = [None] * len(chosen)
        batch, where = [], []
        for i, (job, n) in enumerate(chosen):
            try:
                if job.done == 0:
                    self._start_from_prefix(job.work)
                    self.executor.check(job.work.session_id, job.work.inputs)  # the whole step, before any chunk
                    sid = job.work.session_id
                    if sid not in self.executor.sessions:  # its reservation allocated once (no regrowth copies)
                        self.executor.open(sid, time.monotonic(), capacity=self._reserved_positions(sid))
                inputs = chunk_input(job.work.inputs, job.done, n, self.executor.module.image_token_id)
                self.executor.check(job.work.session_id, inputs)
            except Exception as exc:  # noqa: BLE001 (typed errors go back to that job's caller)
                results[i] = exc
                continue
            batch.append((job.work.session_id, inputs))
            where.append(i)
        if not batch:
            return results
        try:
            outs = self.executor.step(batch, time.monotonic())
        except Exception as exc:  # noqa: BLE001 (the whole pass failed: every job in it gets the error)
            for i in where:
                results[i] = exc
            return results
        self.steps_run += 1
        self.sessions_stepped += len(batch)
        for i, out in zip(where, outs, strict=True):
            job, n = chosen[i]
            job.done += n
            if out.hidden is not None:
                job.hidden_parts.append(out.hidden)
            if job.done < job.total:
                continue
            if len(job.hidden_parts) > 1:
                out.hidden = torch.cat(job.hidden_parts)
            self._store_prefix(job.work, out.length)
            try:
                outcome = self._finish(job.work, out)
                outcome.batch_sessions = len(batch)
                results[i] = outcome
            except Exception as exc:  # noqa: BLE001 (e.g. a grammar refused: that job's caller hears it)
                results[i] = exc
        return results

    def _start_from_prefix(self, w: SessionWork) -> None:
        """A new session's first step at its prefix's end starts from the cached prefix keys/values."""
        if not w.prefix_key or w.session_id in self.executor.sessions or w.inputs.position != w.prefix_length:
            return
        entry = self.prefixes.get(w.prefix_key, w.prefix_length)
        metrics.PREFIX_CACHE.labels(role="stage", result="hit" if entry else "miss").inc()
        if entry is None:
            raise PrefixCacheMiss(
                f"prefix cache miss: prefix {w.prefix_key} ({w.prefix_length} positions) is not cached on stage "
                f"{self.range}; send the whole prompt"
            )
        spare = max(step_positions(w.inputs), self._reserved_positions(w.session_id) - w.prefix_length)
        self.executor.open_from(w.session_id, entry.kv, time.monotonic(), spare=spare)

    def _store_prefix(self, w: SessionWork, length: int) -> None:
        """Keeps the session's prefix keys/values once it holds them all (first session of a new prefix)."""
        if not w.prefix_key or not 0 < w.prefix_length <= length or w.prefix_key in self.prefixes:
            return
        if self.prefixes.put(w.prefix_key, self.executor.snapshot(w.session_id, w.prefix_length)):
            log.info("cached prompt prefix %s (%d positions)", w.prefix_key, w.prefix_length)

    def _run_sync(self, work: list[SessionWork]) -> list[SessionOutcome]:
        """All steps as one forward pass, now, on the calling thread (canary; no queue, no chunking)."""
        outs = self.executor.step([(w.session_id, w.inputs) for w in work], time.monotonic())
        return [self._finish(w, out) for w, out in zip(work, outs, strict=True)]

    def _finish(self, w: SessionWork, out) -> SessionOutcome:
        """A finished step's outcome; at the last stage, samples the next token (constrained if asked)."""
        res = SessionOutcome(w.session_id, out.length, hidden=out.hidden)
        if out.logits is not None:
            params = w.sampling or SamplingParams()
            if w.session_id not in self._generators:
                self._generators[w.session_id] = make_generator(params)
            res.logits = out.logits.clone() if w.return_logits else None  # unmasked, for verification
            constraint = self.constraints.for_step(w.session_id, w.grammar_id, w.grammar_json)
            logits = constraint.mask(out.logits) if constraint is not None else out.logits
            res.token_id = sample(logits, params, self._generators[w.session_id])
            if constraint is not None:
                constraint.advance(res.token_id)
                # greedy only: a sampled run draws from its generator at every step, forced or not; skipping
                # those draws would change its later samples
                if w.max_forced_tokens and params.greedy:
                    res.forced_token_ids = constraint.forced_tokens(w.max_forced_tokens)
            metrics.TOKENS.labels(role="stage").inc()
        return res

    async def release(self, session_ids: list[str]) -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._release_sync, session_ids)

    def _release_sync(self, session_ids: list[str]) -> int:
        n = 0
        for sid in session_ids:
            # The reservation goes first, the session after. reservations() reads reservations before sessions,
            # so a session being released is counted once, through one or the other; and a reader that finds the
            # session gone (Stats counts sessions before reservations) finds its reservation gone too.
            self._reserved.pop(sid, None)
            self._generators.pop(sid, None)
            self.constraints.release(sid)
            if self.executor.release(sid):
                n += 1
        self.released += n
        self._update_gauges()
        return n

    async def evict(self) -> list[tuple[str, str]]:
        """Drops sessions idle past the TTL (never one for room: admission refuses new sessions instead)."""
        usage = [
            SessionUsage(sid, s.last_used, s.nbytes, sid in self._busy)
            for sid, s in list(self.executor.sessions.items())
        ]
        chosen = choose_evictions(usage, time.monotonic(), self.cfg.session_ttl_s)
        if chosen:
            await self.release([sid for sid, _ in chosen])
            for sid, reason in chosen:
                self.evicted[reason] += 1
                log.info("evicted session %s (%s)", sid, reason)
        return chosen

    async def close(self) -> None:
        """Stops the drain task (its queued steps fail: their sessions are gone) and the compute thread."""
        drainer, self._drainer = self._drainer, None
        if drainer is not None and not drainer.done():
            drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drainer
        self._pool.shutdown(wait=False, cancel_futures=True)

    def canary(self) -> None:
        """A real step through the loaded weights on a throwaway session, before the stage reports SERVING."""
        if self.is_first:
            inputs = StepInput(position=0, input_ids=torch.full((3,), self.ckpt.text_config.eos_token_id))
        else:
            inputs = StepInput(position=0, hidden=torch.zeros(3, self.hidden_size))
        out = self._run_sync([SessionWork("__canary__", inputs)])[0]
        self._release_sync(["__canary__"])
        self.released -= 1
        if out.length != 3:
            raise RuntimeError("canary step returned a wrong cache length")

    def _update_gauges(self) -> None:
        stage = f"stage[{self.range.start},{self.range.end})"
        metrics.KV_SESSIONS.labels(role="stage", stage=stage).set(len(self.executor.sessions))
        metrics.KV_BYTES.labels(role="stage", stage=stage).set(self.executor.kv_bytes())
