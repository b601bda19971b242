"""One inspection end to end: vision -> retrieval -> prompt -> decoder stages -> parsed, stored DefectReport."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from edgeinspect import codec
from edgeinspect.config import GatewaySettings
from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.models.checkpoint import Checkpoint, load_processor
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_ids, prompt_text
from edgeinspect.services.common import metrics
from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.gateway.report_text import parse_report_text
from edgeinspect.services.gateway.schema import build_report_grammar, parse_structured, schema_instruction
from edgeinspect.services.gateway.store import ReportStore
from edgeinspect.services.gateway.upstream import RetrievalClient, StagePipeline, VisionClient
from edgeinspect.services.outputs.fanout import Outputs
from edgeinspect.v1 import inspection_pb2, retrieval_pb2, stage_pb2

log = logging.getLogger(__name__)
MAX_PROMPT_CHARS = 2000
MAX_FIELD_CHARS = 128
MAX_NEW_TOKENS_LIMIT = 2048
MIN_PREFIX_TOKENS = 16  # shorter shared prefixes cost more in bookkeeping than they save


@dataclass
class Journal:
    """What it takes to replay a session into a replacement stage: prompt ids, visual tokens, generated ids."""

    prompt_ids: list[int]
    visual_tokens: object  # TensorFrame, kept as received
    generated: list[int] = field(default_factory=list)


class Inspector:
    def __init__(
        self,
        cfg: GatewaySettings,
        ckpt: Checkpoint,
        store: ReportStore,
        vision: VisionClient,
        stages: StagePipeline,
        retrieval: RetrievalClient | None,
    ):
        self.cfg = cfg
        self.ckpt = ckpt
        self.processor = load_processor(ckpt)
        self.tokenizer = self.processor.tokenizer
        self.eos_id = ckpt.text_config.eos_token_id
        self.store = store
        self.vision = vision
        self.stages = stages
        self.retrieval = retrieval
        self.codec = codec.Codec(cfg.codec.value)
        self._running: set[str] = set()
        self.outputs = Outputs.for_gateway(cfg)  # MQTT / webhooks (cfg.outputs); a no-op when none

    def validate(self, req: inspection_pb2.InspectRequest) -> None:
        if not req.image:
            raise InvalidInput("image is empty: send the encoded image file bytes (JPEG, PNG, ...)")
        if len(req.prompt) > MAX_PROMPT_CHARS:
            raise InvalidInput(f"prompt is {len(req.prompt)} characters; at most {MAX_PROMPT_CHARS}")
        for name in ("station", "part", "idempotency_key", "camera_id"):
            if len(getattr(req, name)) > MAX_FIELD_CHARS:
                raise InvalidInput(f"{name} is longer than {MAX_FIELD_CHARS} characters")
        if not 0 <= req.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise InvalidInput(f"max_new_tokens must lie in [0, {MAX_NEW_TOKENS_LIMIT}] (0 = server default)")

    async def run(self, req: inspection_pb2.InspectRequest) -> AsyncIterator[inspection_pb2.InspectEvent]:
        """Yields token deltas, then the stored report (a retried idempotency key yields the stored one)."""
        self.validate(req)
        report_id, existing = await asyncio.to_thread(self.store.claim, req.idempotency_key, request_id_var.get())
        if existing is not None:
            log.info("idempotency key %r: returning stored report %s", req.idempotency_key, report_id)
            yield inspection_pb2.InspectEvent(report=existing)
            return
        if report_id in self._running:
            # claim() gives a pending row's id to a retry too: only the first request runs the inspection.
            raise Unavailable(f"an inspection with idempotency key {req.idempotency_key!r} is still running; retry")
        self._running.add(report_id)
        try:
            async with aclosing(self._inspect(req, report_id)) as events:
                async for event in events:
                    yield event
        except BaseException:
            await asyncio.to_thread(self.store.fail, report_id, "inspection failed")
            raise
        finally:
            self._running.discard(report_id)

    async def _inspect(self, req, report_id: str) -> AsyncIterator[inspection_pb2.InspectEvent]:
        timings: list[stage_pb2.StageTiming] = []
        t0 = time.perf_counter()
        enc = await self.vision.encode(req.image, self.codec, self.cfg.zstd)
        timings.append(
            stage_pb2.StageTiming(
                stage="vision", compute_ms=enc.encode_ms, wire_ms=(time.perf_counter() - t0) * 1e3 - enc.encode_ms
            )
        )
        chunks, index_version = ([], "") if req.verification else await self._spec_context(req, timings)
        context = "\n".join(f"[{c.doc_id} / {c.section}] {c.text}" for c in chunks)
        budget = req.max_new_tokens or self.cfg.max_new_tokens
        instruction = req.prompt or DEFAULT_INSTRUCTION
        # Verification compares with unconstrained generate(), so it is never constrained.
        grammar = None
        if self.cfg.structured_output and not req.verification:
            grammar = build_report_grammar(chunks, req.part, budget)
            instruction = f"{instruction}\n{schema_instruction(grammar.vocabulary)}"
        text = prompt_text(self.processor, build_messages(instruction, context))
        ids = prompt_ids(self.processor, text)
        journal = Journal(ids, enc.visual_tokens)
        # The schema travels with the first step only; the last stage keeps its grammar under the id.
        sampling = stage_pb2.SamplingParams(
            grammar_id=grammar.grammar_id if grammar else "", grammar_json=grammar.text if grammar else ""
        )
        step_timings: dict[str, list[float]] = {}
        t_first = None
        network_ms = 0.0
        delta_from = 0  # first generated token not yet sent in a delta
        emitted = ""
        truncated = True
        session_id = f"{report_id}-{uuid.uuid4().hex[:8]}"
        async with self.stages.session(session_id) as session:
            step_ids, visual = ids, enc.visual_tokens
            while len(journal.generated) < budget:
                if journal.generated:
                    result = await session.step(step_ids, visual, sampling)
                else:
                    result = await session.prefill(
                        step_ids,
                        visual,
                        sampling,
                        self.cfg.prefill_chunk_tokens,
                        self.ckpt.config.image_token_id,
                        self._prefix_length(ids),
                    )
                    if session.prefix_reused:
                        log.info(
                            "session %s: %d prompt positions from the prefix cache", session_id, session.prefix_reused
                        )
                t_first = t_first or time.perf_counter()
                if len(journal.generated) > 0:  # decode steps only: prefill is in time_to_first_token
                    network_ms += result.wire_ms
                for t in result.timings:
                    step_timings.setdefault(t.stage, []).append(t.compute_ms)
                token = result.token_id
                journal.generated.append(token)
                if token == self.eos_id:
                    truncated = False
                    break
                decoded = self.tokenizer.decode(journal.generated, skip_special_tokens=True)
                if len(decoded) > len(emitted) and not decoded.endswith("\ufffd"):
                    # Tokens held back (no new text yet, or a partial UTF-8 sequence) travel with this delta.
                    yield inspection_pb2.InspectEvent(
                        delta=inspection_pb2.TokenDelta(
                            text=decoded[len(emitted) :], token_ids=journal.generated[delta_from:]
                        )
                    )
                    emitted = decoded
                    delta_from = len(journal.generated)
                step_ids, visual = [token], None
                sampling = stage_pb2.SamplingParams(grammar_id=sampling.grammar_id)
        metrics.TOKENS.labels(role="gateway").inc(len(journal.generated))
        for stage, values in step_timings.items():
            timings.append(stage_pb2.StageTiming(stage=stage, compute_ms=sum(values)))
        t_end = time.perf_counter()
        timings.append(stage_pb2.StageTiming(stage="time_to_first_token", wire_ms=(t_first - t0) * 1e3))
        decode_steps = max(len(journal.generated) - 1, 1)
        # Per decode step: wall time, and the part of it not spent computing in a stage (wire, codec, relay).
        timings.append(stage_pb2.StageTiming(stage="decode_per_token", wire_ms=(t_end - t_first) * 1e3 / decode_steps))
        timings.append(stage_pb2.StageTiming(stage="network_per_token", wire_ms=network_ms / decode_steps))
        raw = self.tokenizer.decode(journal.generated, skip_special_tokens=True)
        truncated = truncated and raw.strip() != ""
        parsed = parse_structured(raw, truncated) if grammar else parse_report_text(raw, truncated=truncated)
        report = self._report(
            req,
            report_id,
            raw,
            journal,
            parsed,
            chunks,
            index_version,
            timings,
            enc.image_sha256,
        )
        await asyncio.to_thread(self.store.complete, report, image=req.image)
        self.outputs.publish(report)  # returns at once: each output delivers from its own outbox
        metrics.INSPECTIONS.labels(verdict=inspection_pb2.Verdict.Name(report.verdict)).inc()
        log.info(
            "report %s stored: %s, %d tokens",
            report_id,
            inspection_pb2.Verdict.Name(report.verdict),
            len(journal.generated),
        )
        yield inspection_pb2.InspectEvent(report=report)

    def _prefix_length(self, ids: list[int]) -> int:
        """The shared prompt prefix (system prompt + spec context): everything before the image, which is the same
        for every frame of a part; 0 when prefix caching is off or the prefix is too short to be worth it."""
        image_id = self.ckpt.config.image_token_id
        if not self.cfg.prefix_cache or image_id not in ids:
            return 0
        n = ids.index(image_id)
        return n if n >= MIN_PREFIX_TOKENS else 0

    async def _spec_context(self, req, timings) -> tuple[list[retrieval_pb2.SpecChunk], str]:
        if self.retrieval is None or self.cfg.spec_chunks == 0:
            return [], ""
        t0 = time.perf_counter()
        query = " ".join(x for x in (req.part, req.station, req.prompt or "visual defects acceptance limits") if x)
        # The part's own specs (and general ones) first: their defect classes make the report schema.
        resp = await self.retrieval.search(query, self.cfg.spec_chunks, {"product": req.part} if req.part else {})
        if req.part and not resp.chunks:
            resp = await self.retrieval.search(query, self.cfg.spec_chunks, {})
        timings.append(
            stage_pb2.StageTiming(
                stage="retrieval", compute_ms=resp.search_ms, wire_ms=(time.perf_counter() - t0) * 1e3 - resp.search_ms
            )
        )
        return list(resp.chunks), resp.index_version

    def _report(self, req, report_id, raw, journal, parsed, chunks, index_version, timings, image_sha):
        now = Timestamp()
        now.GetCurrentTime()
        report = inspection_pb2.DefectReport(
            report_id=report_id,
            request_id=request_id_var.get() or "",
            idempotency_key=req.idempotency_key,
            station=req.station,
            part=req.part,
            camera_id=req.camera_id,
            created_time=now,
            verdict=parsed.verdict,
            description=parsed.description,
            verdict_reason=parsed.verdict_reason,
            raw_text=raw,
            generated_token_ids=journal.generated,
            image_sha256=image_sha or hashlib.sha256(req.image).hexdigest(),
            prompt_tokens=len(journal.prompt_ids),
            timings=timings,
            defects=[inspection_pb2.Defect(**d) for d in parsed.defects],
            references=[
                inspection_pb2.Reference(
                    doc_id=c.doc_id,
                    section=c.section,
                    score=c.score,
                    index_version=index_version,
                    path=c.path,
                    page=c.page,
                    text=c.text,
                )
                for c in chunks
            ],
            model=inspection_pb2.ModelInfo(
                checkpoint=str(self.ckpt.path),
                checkpoint_fingerprint=self.ckpt.fingerprint,
                tokenizer_fingerprint=self.ckpt.tokenizer_fingerprint,
                codec=self.codec.value,
                partition=[
                    f"stage{k}={s.address}[{s.layer_start},{s.layer_end})" for k, s in enumerate(self.stages.stages)
                ],
            ),
        )
        if req.verification:
            report.prompt_token_ids.extend(journal.prompt_ids)
        if req.HasField("capture_time"):
            report.capture_time.CopyFrom(req.capture_time)
        return report
