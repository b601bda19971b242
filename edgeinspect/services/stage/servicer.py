"""DecoderStage servicer: protobuf <-> domain and session ownership per stream. The reload policy of LoadLayers
lives in reload.py, admission in the backend."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from edgeinspect import codec
from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.models.sampling import SamplingParams
from edgeinspect.models.stage import StepInput, ids_tensor
from edgeinspect.services.common import metrics
from edgeinspect.services.common.tasks import BackgroundTasks
from edgeinspect.services.stage import reload
from edgeinspect.services.stage.backend import Identity, SessionOutcome, SessionWork, StageBackend
from edgeinspect.services.stage.step_spans import StreamTally, traced_run
from edgeinspect.v1 import common_pb2, stage_pb2, stage_pb2_grpc

log = logging.getLogger(__name__)

ACCEPTED_CODECS = [codec.codec_to_proto(c) for c in codec.Codec]
MAX_STEP_TOKENS = 8192
MAX_POSITIONS = 1 << 20  # far beyond any model context; bounds the reservation arithmetic
MAX_FORCED_TOKENS = 64  # jump-forward: forced tokens one step may return


def identity_to_proto(ident: Identity) -> common_pb2.PeerIdentity:
    return common_pb2.PeerIdentity(
        protocol_version=ident.protocol_version,
        checkpoint_fingerprint=ident.checkpoint_fingerprint,
        tokenizer_fingerprint=ident.tokenizer_fingerprint,
        role="stage",
        layer_start=ident.layer_start,
        layer_end=ident.layer_end,
        num_layers=ident.num_layers,
        weights_dtype=ident.weights_dtype,
        device=ident.device,
    )


def identity_from_proto(p: common_pb2.PeerIdentity) -> Identity:
    return Identity(
        p.protocol_version,
        p.checkpoint_fingerprint,
        p.tokenizer_fingerprint,
        p.layer_start,
        p.layer_end,
        p.num_layers,
        p.weights_dtype,
        p.device or "cpu",
    )


class DecoderStageServicer(stage_pb2_grpc.DecoderStageServicer):
    def __init__(self, backend: StageBackend | None):
        self._backend = backend
        self._cleanup = BackgroundTasks("decoder stage")  # releases of ended streams
        self.home = (-1, -1)
        self._reloading = asyncio.Lock()

    def attach(self, backend: StageBackend) -> None:
        """The loaded backend; until then every call answers UNAVAILABLE (health says NOT_SERVING meanwhile)."""
        self._backend = backend
        if self.home == (-1, -1):
            self.home = (backend.range.start, backend.range.end)  # the range of its own config

    @property
    def backend(self) -> StageBackend:
        if self._backend is None:
            raise Unavailable("this stage is still loading its weights; retry once health reports SERVING")
        return self._backend

    @property
    def name(self) -> str:
        return f"stage[{self.backend.range.start},{self.backend.range.end})"

    async def Handshake(self, request: stage_pb2.HandshakeRequest, context) -> stage_pb2.HandshakeResponse:
        """Refuses a peer whose protocol, checkpoint, tokenizer or expected layer range differ."""
        self.backend.check_peer(
            identity_from_proto(request.client), request.expect_layer_start, request.expect_layer_end
        )
        if request.codec and request.codec not in ACCEPTED_CODECS:
            raise InvalidInput(f"codec {request.codec} is not one this stage accepts")
        return stage_pb2.HandshakeResponse(server=identity_to_proto(self.backend.identity), codecs=ACCEPTED_CODECS)

    async def Forward(self, request_iterator, context) -> AsyncIterator[stage_pb2.StepResponse]:
        """Steps sessions as requests arrive; every session opened on this stream is released when it ends."""
        opened: set[str] = set()
        # A cancelled call may leave this generator suspended at `yield` until garbage collection, so its
        # `finally` can run minutes late: release on the RPC's own termination instead.
        context.add_done_callback(lambda _ctx: self._cleanup_later(opened))
        tally = StreamTally()
        async for request in request_iterator:
            outcomes, timing = await self._run(request, opened)
            tally.add(outcomes, timing)
            yield self._to_response(request, outcomes, timing)
        tally.log(self.name)

    @traced_run
    async def _run(self, request: stage_pb2.StepRequest, opened: set[str]):
        t0 = time.perf_counter()
        work = [self._to_work(step) for step in request.steps]
        # Admission first: a refused session is not this stream's to release (a retry may hold it elsewhere).
        self.backend.admit(work)
        opened |= {w.session_id for w in work}
        outcomes = await self.backend.submit(work)
        return outcomes, stage_pb2.StageTiming(stage=self.name, compute_ms=(time.perf_counter() - t0) * 1e3)

    def _cleanup_later(self, opened: set[str]) -> None:
        self._cleanup.spawn(self._release_ended(sorted(opened)), name="release ended stream")

    async def _release_ended(self, session_ids: list[str]) -> None:
        """The stream is over: drop the sessions it opened."""
        if session_ids:
            released = await self.backend.release(session_ids)
            log.info("stream ended: released %d of %d sessions", released, len(session_ids))

    async def Release(self, request: stage_pb2.ReleaseRequest, context) -> stage_pb2.ReleaseResponse:
        """Drops sessions now."""
        n = await self.backend.release(list(request.session_ids))
        return stage_pb2.ReleaseResponse(released=n)

    async def Stats(self, request: stage_pb2.StatsRequest, context) -> stage_pb2.StageStats:
        """Live sessions, KV bytes and eviction counters."""
        b = self.backend
        return stage_pb2.StageStats(
            identity=identity_to_proto(b.identity),
            sessions=len(b.executor.sessions),
            kv_bytes=b.executor.kv_bytes(),
            kv_budget_bytes=b.cfg.kv_budget_mb << 20,
            evicted_ttl=b.evicted["ttl"],
            evicted_budget=b.evicted["budget"],
            released=b.released,
            session_ids=sorted(b.executor.sessions),
            prefix_hits=b.prefixes.hits,
            prefix_misses=b.prefixes.misses,
            prefix_entries=len(b.prefixes),
            prefix_bytes=b.prefixes.nbytes,
            passes=b.steps_run,
            session_steps=b.sessions_stepped,
            kv_reserved_bytes=sum(b.reservations().values()),
            refused_sessions=b.refused,
            max_batch_sessions=b.cfg.max_batch_sessions,
            home_layer_start=self.home[0],
            home_layer_end=self.home[1],
            memory_available_bytes=reload.memory_available(),
            weight_bytes=reload.range_weight_bytes(b.ckpt, b.range.start, b.range.end, b.executor.module.weights),
        )

    async def LoadLayers(self, request: stage_pb2.LoadLayersRequest, context) -> stage_pb2.StageStats:
        """Serves layers [a, b) from now on (re-planning), loaded from this box's checkpoint; drops every session."""
        b = self.backend
        start, end, total = request.layer_start, request.layer_end, b.range.total
        if not 0 <= start < end <= total:
            raise InvalidInput(f"layer range [{start}, {end}) is not within the model's {total} layers")
        if (start, end) != (b.range.start, b.range.end):
            async with self._reloading:
                reload.check_room(b.ckpt, start, end, b.executor.module.weights)
                cfg = b.cfg.model_copy(update={"layer_start": start, "layer_end": end})
                log.info("re-planning: loading layers [%d, %d) (was %s)", start, end, b.range)
                new = await asyncio.to_thread(StageBackend, cfg, b.ckpt)
                await asyncio.to_thread(new.canary)
                self.attach(new)
                await b.close()
                log.info("re-planning: now serving layers %s; every earlier session was dropped", new.range)
        return await self.Stats(stage_pb2.StatsRequest(), context)

    # -- translation -------------------------------------------------------------------------------------------

    def _to_work(self, step: stage_pb2.SessionStep) -> SessionWork:
        if not step.session_id:
            raise InvalidInput("every step needs a session_id")
        if step.position < 0:
            raise InvalidInput(f"position must be >= 0, got {step.position}")
        b = self.backend
        inputs = StepInput(position=step.position, logits=not step.prefill_chunk)
        if b.is_first:
            if not step.input_ids or len(step.input_ids) > MAX_STEP_TOKENS:
                raise InvalidInput(f"the first stage needs 1..{MAX_STEP_TOKENS} input_ids per step")
            inputs.input_ids = ids_tensor(step.input_ids)
            if step.HasField("visual_tokens"):
                inputs.visual_tokens = codec.decode_frame(
                    step.visual_tokens, expect_shape=[None, b.vision_hidden], name="visual tokens"
                )
                metrics.WIRE_BYTES.labels(
                    role="stage", codec=str(codec.codec_from_proto(step.visual_tokens.codec)), direction="in"
                ).inc(codec.wire_nbytes(step.visual_tokens))
        else:
            if not step.HasField("hidden"):
                raise InvalidInput(f"{self.name} needs hidden states from the previous stage")
            inputs.hidden = codec.decode_frame(
                step.hidden,
                expect_shape=[None, b.hidden_size],
                max_numel=MAX_STEP_TOKENS * b.hidden_size,
                name="hidden states",
            )
            metrics.WIRE_BYTES.labels(
                role="stage", codec=str(codec.codec_from_proto(step.hidden.codec)), direction="in"
            ).inc(codec.wire_nbytes(step.hidden))
        sampling = None
        grammar_id = grammar_json = ""
        if step.HasField("sampling"):
            s = step.sampling
            sampling = SamplingParams(temperature=s.temperature, top_p=s.top_p or 1.0, seed=s.seed)
            grammar_id, grammar_json = s.grammar_id, s.grammar_json
        if step.prefix.length < 0:
            raise InvalidInput(f"prefix length must be >= 0, got {step.prefix.length}")
        if not 0 <= step.max_positions <= MAX_POSITIONS:
            raise InvalidInput(f"max_positions must lie in [0, {MAX_POSITIONS}], got {step.max_positions}")
        return SessionWork(
            step.session_id,
            inputs,
            sampling,
            step.return_logits,
            grammar_id,
            grammar_json,
            step.prefix.key,
            step.prefix.length,
            step.micro_batch,
            step.max_positions,
            min(step.sampling.max_forced_tokens, MAX_FORCED_TOKENS) if step.HasField("sampling") else 0,
        )

    def _to_response(self, request, outcomes: list[SessionOutcome], timing) -> stage_pb2.StepResponse:
        out_codec = codec.codec_from_proto(request.output_codec) if request.output_codec else codec.Codec.fp32
        results = []
        for o in outcomes:
            r = stage_pb2.SessionResult(session_id=o.session_id, cached_length=o.length, token_id=o.token_id)
            r.forced_token_ids.extend(o.forced_token_ids)
            if o.hidden is not None:
                r.hidden.CopyFrom(codec.encode_frame(o.hidden, out_codec, request.output_zstd))
                metrics.WIRE_BYTES.labels(role="stage", codec=str(out_codec), direction="out").inc(
                    codec.wire_nbytes(r.hidden)
                )
            if o.logits is not None:
                r.logits.CopyFrom(codec.encode_frame(o.logits, codec.Codec.fp32))
            results.append(r)
        return stage_pb2.StepResponse(results=results, timings=[timing])
