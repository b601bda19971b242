"""One inspection end to end: vision -> retrieval -> prompt -> decoder stages -> parsed, stored DefectReport.

Each hop has its own step here and its own bounded share of the inspection's deadline; the decoder stages are
reached only through an InferenceSession (services/gateway/decode/session.py), which owns failover.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

import grpc

from edgeinspect import codec
from edgeinspect.errors import DeadlineExceeded, EdgeInspectError, Unavailable
from edgeinspect.models.checkpoint import Checkpoint, load_processor
from edgeinspect.services.common import metrics
from edgeinspect.services.common.context import deadline_var, request_id_var
from edgeinspect.services.gateway import drift, evidence, gate
from edgeinspect.services.gateway.admission import Admission
from edgeinspect.services.gateway.decode.session import InferenceSession
from edgeinspect.services.gateway.decode.stages import StageCluster
from edgeinspect.services.gateway.decode.text import IncrementalText
from edgeinspect.services.gateway.explain import Explanations
from edgeinspect.services.gateway.prompt import PromptBuilder
from edgeinspect.services.gateway.replicas.clients import RetrievalClient, VisionClient
from edgeinspect.services.gateway.reports.build import ModelFacts, vlm_report
from edgeinspect.services.gateway.reports.reader import ReportReader
from edgeinspect.services.gateway.settings import AnomalyPolicy, GatewaySettings
from edgeinspect.services.outputs.fanout import Outputs
from edgeinspect.services.outputs.result import is_shadow
from edgeinspect.v1 import inspection_pb2, stage_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hop:
    """Yielded by Inspector._inspect as each hop starts: a failure from then on is stored as this hop's."""

    name: str


@dataclass(frozen=True)
class Explained:
    """The VLM's finished report, not yet stored, with the gate's outcome (Inspector._vlm_steps' last step)."""

    report: inspection_pb2.DefectReport
    outcome: gate.GateOutcome


class ReportWriter(Protocol):
    """What an Inspector writes through: a ReportStore, or the rollout's RoutingStore that sends a candidate's shadow
    runs to the shadow database (services/gateway/rollout/manager.py)."""

    def claim(self, idempotency_key: str, request_id: str) -> tuple[str, inspection_pb2.DefectReport | None]: ...

    def complete(
        self,
        report: inspection_pb2.DefectReport,
        *,
        image: bytes | None = None,
        heatmap: bytes | None = None,
        to_line: bool = False,
    ) -> None: ...

    def fail(self, report_id: str, reason: str) -> None: ...

    def explain(self, explained: inspection_pb2.DefectReport, to_line: bool = False) -> inspection_pb2.DefectReport: ...

    def explanation_failed(
        self, report_id: str, reason: str, to_line: bool = False
    ) -> inspection_pb2.DefectReport | None: ...


class Inspector:
    def __init__(
        self,
        cfg: GatewaySettings,
        ckpt: Checkpoint,
        store: ReportWriter,
        vision: VisionClient,
        stages: StageCluster,
        retrieval: RetrievalClient | None,
    ):
        self.cfg = cfg
        self.ckpt = ckpt
        self.processor = load_processor(ckpt)
        self.tokenizer = self.processor.tokenizer
        self.eos_id = ckpt.text_config.eos_token_id
        self.prompts = PromptBuilder(cfg, ckpt, self.processor)
        self.store = store
        # Good frames for a flagged part's explanation (evidence.py): the live store reads them back; a rollout's
        # RoutingStore (shadow runs) has no reads, and its explanations show no reference.
        self.good_frames = store if isinstance(store, ReportReader) else None
        self.vision = vision
        self.gate = gate.GateStep(cfg.anomaly, vision)  # the anomaly gate per station (services/gateway/gate.py)
        self.retrieval = retrieval
        self.codec = stages.wire.codec
        self.stages = stages
        self.router = stages.router
        self.admission = Admission(cfg.max_inflight or 16, cfg.max_queued or cfg.max_inflight or 16)
        self._running: set[str] = set()
        # MQTT / webhooks draining the store's outbox: the Gateway's (server.py), shared by every model version
        self.outputs = Outputs.none()
        # Decide at takt, explain after: the VLM's runs for decisions already on the line (explain.py)
        self.explanations = Explanations(store, lambda: self.outputs.notify())
        self.drift = drift.DriftWatch()  # passed parts' scores creeping toward the OK cut (drift.py)

    def size_admission(self, per_range_batch: list[int]) -> None:
        """Default limits from the stages' batch limits: two sessions per batch slot of the thinnest range (so a
        stage never idles between steps), as many waiting; explicit settings win."""
        if self.cfg.max_inflight:
            return
        inflight = 2 * max(min(per_range_batch, default=8), 1)
        self.admission.resize(inflight, self.cfg.max_queued or inflight)

    # -- the public entry -------------------------------------------------------------------------------------------

    async def run(self, req: inspection_pb2.InspectRequest) -> AsyncIterator[inspection_pb2.InspectEvent]:
        """Yields token deltas, then the stored report (a retried idempotency key yields the stored one). The request
        was checked at the edge (services/gateway/api/requests.py)."""
        deadline = self._deadline()
        queued_at = time.monotonic()
        async with self.admission.slot(max(0.0, deadline - time.monotonic())):
            metrics.QUEUE_WAIT_SECONDS.observe(time.monotonic() - queued_at)
            if req.verification:  # a check of the cluster (`edgeinspect verify`), not a production record
                report_id, existing = f"verify-{uuid.uuid4().hex[:12]}", None
            else:
                report_id, existing = await asyncio.to_thread(
                    self.store.claim, req.idempotency_key, request_id_var.get()
                )
            if existing is not None:
                log.info("idempotency key %r: returning stored report %s", req.idempotency_key, report_id)
                yield inspection_pb2.InspectEvent(report=existing)
                return
            if report_id in self._running:
                # claim() gives a pending row's id to a retry too: only the first request runs the inspection.
                raise Unavailable(
                    f"an inspection with idempotency key {req.idempotency_key!r} is still running; retry",
                    retry_after_ms=1000,
                )
            self._running.add(report_id)
            hop = "start"
            decided = False  # the report is stored and on the line; what follows is its explanation's (explain.py)
            try:
                async with aclosing(self._inspect(req, report_id, deadline)) as steps:
                    async for step in steps:
                        if isinstance(step, Hop):
                            hop = step.name
                        else:
                            decided = decided or step.HasField("decision")
                            yield step
            except BaseException as exc:
                if decided:  # the caller stopped following the explanation (Inspect answers with the decision)
                    raise
                reason = failure_reason(hop, exc)
                log.warning("report %s failed: %s", report_id, reason, extra={"report_id": report_id})
                if not req.verification:
                    await asyncio.shield(asyncio.to_thread(self.store.fail, report_id, reason))
                raise
            finally:
                self._running.discard(report_id)

    def _deadline(self) -> float:
        """The inspection's absolute deadline: the caller's, capped by upstream_timeout_s. Set for this task, so
        every upstream call's own timeout is capped by it too (services/common/channel.py)."""
        deadline = time.monotonic() + self.cfg.upstream_timeout_s
        inbound = deadline_var.get()
        if inbound is not None:
            deadline = min(deadline, inbound)
        deadline_var.set(deadline)
        return deadline

    # -- the hops ---------------------------------------------------------------------------------------------------

    async def _inspect(
        self, req, report_id: str, deadline: float
    ) -> AsyncGenerator[Hop | inspection_pb2.InspectEvent, None]:
        """The hops in order: each announces itself (a Hop, what a failure is blamed on), then yields its events."""
        timings: list[stage_pb2.StageTiming] = []
        t0 = time.perf_counter()
        yield Hop("anomaly gate")
        gated = self.cfg.anomaly.for_station(req.station).policy is AnomalyPolicy.gate
        score_timeout = _share(deadline, self.cfg.anomaly.score_timeout_s)
        outcome = None
        if gated:  # the gate first: a good part ends here, before any visual token or decoder step
            outcome = await self.gate.score(req, score_timeout)
            timings.extend(gate.timing(outcome, t0))
            if outcome.decides_ok:
                yield await self._finish(req, self._gate_report(req, report_id, outcome, timings), outcome, t0)
                return
            if outcome.decides_at_takt and not (req.evaluation or req.verification):
                # The VLM cannot change this verdict: it goes to the line now, the explanation follows (explain.py).
                yield Hop("store")
                decision = self._gate_report(req, report_id, outcome, timings, gate.decision_report)
                stored = await self._finish(req, decision, outcome, t0)
                # Started before the decision is yielded: a caller answered with it closes this generator there.
                explain = functools.partial(self._explain_after, req, report_id, outcome, list(timings), t0)
                job = self.explanations.start(report_id, explain, to_line=True)
                yield inspection_pb2.InspectEvent(decision=stored.report)
                async for event in job.follow():
                    yield event
                return
        async for step in self._vlm_steps(req, report_id, outcome, timings, t0, deadline):
            yield await self._finish(req, step.report, step.outcome, t0) if isinstance(step, Explained) else step

    async def _explain_after(self, req, report_id: str, outcome: gate.GateOutcome, timings, t0: float):
        """The VLM's run for a decision already stored, as its own task (explain.py): its own deadline and admission
        slot, not the caller's; yields token deltas, then the explained report (explain.py stores it)."""
        deadline = time.monotonic() + self.cfg.upstream_timeout_s
        deadline_var.set(deadline)
        async with self.admission.slot(self.cfg.upstream_timeout_s):
            async for step in self._vlm_steps(req, report_id, outcome, timings, t0, deadline):
                if isinstance(step, Explained):
                    yield inspection_pb2.InspectEvent(report=step.report)
                elif not isinstance(step, Hop):
                    yield step

    async def _vlm_steps(
        self, req, report_id: str, outcome: gate.GateOutcome | None, timings, t0: float, deadline: float
    ) -> AsyncGenerator[Hop | inspection_pb2.InspectEvent | Explained, None]:
        """Vision, retrieval, the decoder stages: Hops, token deltas, then the report (Explained, not yet stored).
        outcome: the gate's, where it scored first (None: it scores here, alongside Encode)."""
        gated = outcome is not None
        score_timeout = _share(deadline, self.cfg.anomaly.score_timeout_s)
        yield Hop("vision")
        t1 = time.perf_counter()
        vision_timeout = _share(deadline, self.cfg.vision_timeout_s)
        # Under vlm the gate scores alongside Encode (its finding is recorded, it decides nothing).
        scoring = None if gated else asyncio.ensure_future(self.gate.score(req, score_timeout))
        try:
            enc = await self.vision.encode(req.image, self.codec, self.cfg.zstd, vision_timeout)
        except BaseException:
            if scoring is not None:
                scoring.cancel()
            raise
        timings.append(
            stage_pb2.StageTiming(
                stage="vision", compute_ms=enc.encode_ms, wire_ms=(time.perf_counter() - t1) * 1e3 - enc.encode_ms
            )
        )
        if scoring is not None:
            outcome = await scoring
            timings.extend(gate.timing(outcome, t1))
        if outcome is None:  # never: the gate scored before this (the caller's outcome) or alongside Encode
            raise RuntimeError("the anomaly gate gave no outcome for this frame")
        yield Hop("retrieval")
        degraded: list[str] = []
        chunks, index_version = [], ""
        if not req.verification:
            chunks, index_version = await self._spec_context(req, timings, deadline, degraded)
        visual_tokens, shown = await self._evidence(req, outcome, enc, deadline, timings)
        extra = gate.gate_instruction(outcome.required_score()) if outcome.flagged else ""
        prompt = self.prompts.prompt(req, chunks, extra, shown.captions if shown else ())
        prompt.degraded[:0] = degraded
        yield Hop("decoder stages")
        sampling = stage_pb2.SamplingParams(
            grammar_id=prompt.grammar.grammar_id if prompt.grammar else "",
            grammar_json=prompt.grammar.text if prompt.grammar else "",
        )
        if prompt.grammar is not None and sampling.temperature == 0:
            # Greedy only: where the grammar allows one token, greedy picks it, so the tokens are the same either way.
            sampling.max_forced_tokens = self.cfg.jump_forward_tokens
        session = self.stages.session(
            f"{report_id}-{uuid.uuid4().hex[:8]}",
            prompt.ids,
            visual_tokens,
            sampling,
            prefix_length=self.prompts.prefix_length(prompt.ids),
            max_positions=len(prompt.ids) + prompt.budget,
        )
        journal = session.journal
        async with session:
            async for event in self._generate(session, prompt.budget, deadline, timings, t0):
                yield event
        yield Hop("store")
        raw = self.tokenizer.decode(journal.generated, skip_special_tokens=True)
        model = ModelFacts.of(self.ckpt, self.codec, self.router.plan_text())
        report = vlm_report(model, req, report_id, session, prompt, raw, index_version, timings, enc.image_sha256)
        if shown is not None:
            report.model.images.extend(shown.shown)
        vlm_verdict = report.verdict
        gate.settle(report, outcome, heatmap_stored=False)
        if outcome.decides_at_takt:  # two moments (also when run in one go: an eval's frame): the decision stands
            report.verdict, report.verdict_reason = gate.decided_verdict(outcome.required_score().verdict)
            report.vlm_verdict, report.explanation = vlm_verdict, inspection_pb2.EXPLANATION_DONE
            report.explained_time.GetCurrentTime()
        log.info("report %s: %d tokens, %d failovers", report_id, len(journal.generated), len(session.failovers),
                 extra={"report_id": report_id})  # fmt: skip
        yield Explained(report, outcome)

    async def _evidence(self, req, outcome: gate.GateOutcome, enc, deadline: float, timings):
        """The prompt's visual tokens, and what it shows beside the frame: for the explanation of a part the gate
        flagged (decided at takt), the flagged region cut from the full-resolution frame and a good frame of the part
        (evidence.py), encoded on the vision node and joined after the frame's in the prompt's order."""
        if not (outcome.decides_at_takt and self.cfg.explain_with_evidence):
            return enc.visual_tokens, None
        shown = await asyncio.to_thread(
            evidence.collect, req.image, outcome.required_score(), req.part, self.good_frames
        )
        if not shown.images:
            return enc.visual_tokens, None
        t0, timeout = time.perf_counter(), _share(deadline, self.cfg.vision_timeout_s)
        encoded = await asyncio.gather(
            *(self.vision.encode(i, self.codec, self.cfg.zstd, timeout) for i in shown.images)
        )
        ms = sum(e.encode_ms for e in encoded)
        timings.append(
            stage_pb2.StageTiming(stage="vision_evidence", compute_ms=ms, wire_ms=(time.perf_counter() - t0) * 1e3 - ms)
        )
        frames = [enc.visual_tokens, *(e.visual_tokens for e in encoded)]
        return codec.join_rows(frames, name="visual tokens"), shown  # stage 0 fills the placeholders in order

    async def _finish(self, req, report, outcome: gate.GateOutcome, t0: float) -> inspection_pb2.InspectEvent:
        """Stores the report (with its frame and the gate's heatmap) and, in the same transaction, its result for the
        line's outputs; counts it."""
        heatmap = outcome.score.heatmap_png if outcome.score is not None else b""
        if not req.verification:  # verify's reports are answered only: never stored, never published
            # An eval's labelled frames never reach the plant's systems; a shadow report never does either (store).
            store = functools.partial(
                self.store.complete, report, image=req.image, heatmap=heatmap or None, to_line=not req.evaluation
            )
            await asyncio.to_thread(store)  # sets anomaly.heatmap_stored when it kept the heatmap
            self.outputs.notify()  # the outbox rows are committed: the drainers send them now
        score = outcome.score
        if score is not None and score.verdict == gate.GATE_OK and not (req.evaluation or req.verification):
            await self._watch_drift(req, report, score)
        verdict = inspection_pb2.Verdict.Name(report.verdict).removeprefix("VERDICT_")
        metrics.INSPECTIONS.labels(station=req.station, verdict=verdict).inc()
        metrics.INSPECTION_SECONDS.observe(time.perf_counter() - t0)
        if report.model.plan:
            metrics.MODEL_INFO.info({"fingerprint": report.model.checkpoint_fingerprint, "plan": report.model.plan})
        decided = inspection_pb2.DecidedBy.Name(report.anomaly.decided_by).removeprefix("DECIDED_BY_")
        log.info("report %s stored: %s (decided by %s)", report.report_id, verdict, decided,
                 extra={"report_id": report.report_id, "verdict": verdict, "decided_by": decided})  # fmt: skip
        return inspection_pb2.InspectEvent(report=report)

    async def _watch_drift(self, req, report, score) -> None:
        """A passed frame's score into the drift watch; a flip of its drifting state is queued for the line (MQTT),
        never from a shadow run (is_shadow: the store flags it)."""
        state = self.drift.observe(req.station, req.part, score.bank_id, score.score, score.band_low)
        if not state.changed or is_shadow(report):
            return
        try:
            await asyncio.to_thread(self.outputs.publish_drift, drift.alert(state))
        except Exception as exc:  # the report is stored: a lost alert must not fail its inspection (the gauge holds)
            log.error("station %s part %s: drift alert not queued for the line: %s", req.station, req.part, exc)

    def _gate_report(
        self, req, report_id: str, outcome: gate.GateOutcome, timings, build=gate.ok_report
    ) -> inspection_pb2.DefectReport:
        """A report the gate decided alone: a good part (ok_report), or a flagged one decided at takt."""
        model = inspection_pb2.ModelInfo(
            checkpoint=str(self.ckpt.path),
            checkpoint_fingerprint=self.ckpt.fingerprint,
            tokenizer_fingerprint=self.ckpt.tokenizer_fingerprint,
        )
        return build(
            req, report_id, outcome, request_id=request_id_var.get() or "", model=model, timings=timings,
            image_sha256=outcome.required_score().image_sha256 or hashlib.sha256(req.image).hexdigest(),
        )  # fmt: skip

    async def _generate(self, session: InferenceSession, budget: int, deadline: float, timings, t0):
        """The decode loop: yields text deltas; fills `timings` with per-stage compute and per-token figures."""
        generated = session.journal.generated
        step_timings: dict[str, list[float]] = {}
        text = IncrementalText(self.tokenizer)
        delta_from = 0  # first generated token not yet sent in a delta
        network_ms, t_first = 0.0, None
        while len(generated) < budget:
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(f"the inspection's deadline passed after {len(generated)} generated tokens")
            result = await (session.decode() if generated else session.prefill())
            metrics.JUMP_FORWARD_TOKENS.inc(len(result.forced_token_ids))
            if t_first is None:
                t_first = time.perf_counter()
                metrics.TTFT_SECONDS.observe(t_first - t0)
                if session.prefix_reused:
                    log.info("session %s: %d prompt positions from cache", session.base_id, session.prefix_reused)
            else:  # decode steps only: prefill is in time_to_first_token
                network_ms += result.wire_ms
            for t in result.timings:
                step_timings.setdefault(t.stage, []).append(t.compute_ms)
                metrics.STAGE_STEP_SECONDS.labels(stage=t.stage).observe(t.compute_ms / 1e3)
            # The end of sequence may come sampled or forced (after a complete object); nothing after it counts.
            ended = session.journal.stop_at(self.eos_id)
            upto = len(generated) - 1 if ended else len(generated)  # the end of sequence itself is never streamed
            delta = text.delta(generated[:upto] if ended else generated)
            if delta:
                # Tokens held back (no new text yet, or a partial UTF-8 sequence) travel with this delta.
                yield inspection_pb2.InspectEvent(
                    delta=inspection_pb2.TokenDelta(text=delta, token_ids=generated[delta_from:upto])
                )
                delta_from = upto
            if ended:
                session.truncated = False
                break
        metrics.TOKENS.labels(role="gateway").inc(len(generated))
        for stage, values in step_timings.items():
            timings.append(stage_pb2.StageTiming(stage=stage, compute_ms=sum(values)))
        t_end = time.perf_counter()
        t_first = t_first or t_end
        timings.append(stage_pb2.StageTiming(stage="time_to_first_token", wire_ms=(t_first - t0) * 1e3))
        decode_steps = max(len(generated) - 1, 1)
        # Per decode step: wall time, and the part of it not spent computing in a stage (wire, codec, relay).
        timings.append(stage_pb2.StageTiming(stage="decode_per_token", wire_ms=(t_end - t_first) * 1e3 / decode_steps))
        timings.append(stage_pb2.StageTiming(stage="network_per_token", wire_ms=network_ms / decode_steps))

    async def _spec_context(self, req, timings, deadline: float, degraded: list[str]):
        """Spec chunks for the prompt. Spec context is optional: a retrieval node that is down or slow degrades the
        report (said in it, counted in metrics) instead of failing the inspection."""
        if self.retrieval is None or self.cfg.spec_chunks == 0:
            return [], ""
        t0 = time.perf_counter()
        query = " ".join(x for x in (req.part, req.station, req.prompt or "visual defects acceptance limits") if x)
        timeout = _share(deadline, self.cfg.retrieval_timeout_s)
        try:
            # The part's own specs (and general ones) first: their defect classes make the report schema.
            resp = await self.retrieval.search(
                query, self.cfg.spec_chunks, {"product": req.part} if req.part else {}, timeout
            )
            if req.part and not resp.chunks:
                resp = await self.retrieval.search(query, self.cfg.spec_chunks, {}, timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.INVALID_ARGUMENT:
                raise
            return self._without_specs(degraded, f"retrieval unavailable ({exc.code().name})")
        except (Unavailable, DeadlineExceeded) as exc:  # no retrieval replica usable (services/gateway/replicas/)
            return self._without_specs(degraded, f"retrieval unavailable ({exc.status})")
        timings.append(
            stage_pb2.StageTiming(
                stage="retrieval", compute_ms=resp.search_ms, wire_ms=(time.perf_counter() - t0) * 1e3 - resp.search_ms
            )
        )
        return list(resp.chunks), resp.index_version

    def _without_specs(self, degraded: list[str], why: str):
        degraded.append(f"no spec context: {why}")
        metrics.DEGRADED.labels(reason="no_spec_context").inc()
        log.warning("inspection without spec context: %s", why)
        return [], ""


def _share(deadline: float, cap_s: float) -> float:
    """A hop's timeout: its own cap, but never past the inspection's deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the inspection's deadline passed before this step could start")
    return min(left, cap_s)


def failure_reason(hop: str, exc: BaseException) -> str:
    """What the stored failed row says: the hop that was running and the status that ended it."""
    if isinstance(exc, EdgeInspectError):
        return f"{hop}: {exc.status}: {exc}"[:500]
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{hop}: {exc.code().name}: {exc.details() or ''}"[:500]
    if isinstance(exc, asyncio.CancelledError):
        return f"{hop}: CANCELLED: the caller went away or the gateway stopped"
    if isinstance(exc, TimeoutError):
        return f"{hop}: DEADLINE_EXCEEDED"
    return f"{hop}: INTERNAL: {type(exc).__name__}"
