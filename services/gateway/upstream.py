"""The gateway's clients of the internal roles: vision, retrieval and the decoder-stage pipeline."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import grpc

from edgeinspect import PROTOCOL_VERSION, codec
from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.stage.protocol import next_stage_step
from edgeinspect.v1 import (
    common_pb2,
    retrieval_pb2,
    retrieval_pb2_grpc,
    stage_pb2,
    stage_pb2_grpc,
    tensor_pb2,
    vision_pb2,
    vision_pb2_grpc,
)

log = logging.getLogger(__name__)
MAX_KNOWN_PREFIXES = 1024


@dataclass
class StageInfo:
    address: str
    layer_start: int
    layer_end: int


class StagePipeline:
    """Drives the decoder stages for one inspection at a time per session.

    Gateway-driven (Petals-style): the gateway relays each stage's hidden-state frame, untouched, to the next.
    Chained (exo-style): the gateway talks to stage 0 only, which forwards along the chain.
    """

    def __init__(
        self,
        addresses: list[str],
        wire_codec: codec.Codec,
        zstd: bool,
        chained: bool,
        max_message_mb: int,
        micro_batches: int = 0,
    ):
        self.addresses = addresses
        self.codec = wire_codec
        self.zstd = zstd
        self.chained = chained
        self.channels = [make_channel(a, max_message_mb) for a in addresses]
        self.stubs = [stage_pb2_grpc.DecoderStageStub(c) for c in self.channels]
        self.stages: list[StageInfo] = []
        # Prompt prefixes every stage is believed to hold (a stage that evicted one says so, and it is forgotten).
        self.cached_prefixes: OrderedDict[str, None] = OrderedDict()
        # Open sessions per micro-batch group: by default one group per stage, so S groups can occupy S stages at
        # once. On separate boxes that is S x the work per step time; where stages share one memory bus, groups
        # read the weights once per group instead of once per pass and a single group (lockstep) can be faster.
        self.group_sessions = [0] * (micro_batches or len(addresses))

    def join_group(self) -> int:
        """The micro-batch group with the fewest open sessions (groups stay balanced as inspections come and go)."""
        group = min(range(len(self.group_sessions)), key=self.group_sessions.__getitem__)
        self.group_sessions[group] += 1
        return group

    def leave_group(self, group: int) -> None:
        self.group_sessions[group] -= 1

    def remember_prefix(self, key: str) -> None:
        self.cached_prefixes[key] = None
        self.cached_prefixes.move_to_end(key)
        while len(self.cached_prefixes) > MAX_KNOWN_PREFIXES:
            self.cached_prefixes.popitem(last=False)

    def forget_prefix(self, key: str) -> None:
        self.cached_prefixes.pop(key, None)

    async def handshake(self, identity: common_pb2.PeerIdentity, num_layers: int) -> list[StageInfo]:
        """Asks each stage what it serves, checks the ranges tile [0, num_layers), then handshakes for real."""
        infos = []
        for address, stub in zip(self.addresses, self.stubs, strict=True):
            stats = await stub.Stats(stage_pb2.StatsRequest(), timeout=10)
            infos.append(StageInfo(address, stats.identity.layer_start, stats.identity.layer_end))
        expected = 0
        for info in infos:
            if info.layer_start != expected:
                raise Unavailable(
                    f"stage ranges do not tile the model: {info.address} starts at layer "
                    f"{info.layer_start}, expected {expected}"
                )
            expected = info.layer_end
        if expected != num_layers:
            raise Unavailable(f"stages cover layers [0, {expected}) but the checkpoint has {num_layers}")
        for info, stub in zip(infos, self.stubs, strict=True):
            await stub.Handshake(
                stage_pb2.HandshakeRequest(
                    client=identity,
                    expect_layer_start=info.layer_start,
                    expect_layer_end=info.layer_end,
                    codec=codec.codec_to_proto(self.codec),
                ),
                timeout=10,
            )
        self.stages = infos
        return infos

    def session(self, session_id: str) -> PipelineSession:
        return PipelineSession(self, session_id)

    async def close(self) -> None:
        for c in self.channels:
            await c.close()


@dataclass
class StepResult:
    token_id: int
    timings: list[stage_pb2.StageTiming] = field(default_factory=list)
    wire_ms: float = 0.0


class PipelineSession:
    """One inspection's streams through the stages; closing them releases the session on every stage."""

    def __init__(self, pipeline: StagePipeline, session_id: str):
        self.p = pipeline
        self.base_id = self.session_id = session_id
        self.calls: list = []
        self.position = 0
        self.restarts = 0
        self.prefix_reused = 0  # prompt positions taken from the stages' prefix caches
        self.group = 0  # pipeline micro-batch group, held while the session is open

    async def __aenter__(self) -> PipelineSession:
        self.group = self.p.join_group()
        self._open()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self.p.leave_group(self.group)
        if exc_type is not None:
            self._cancel()
            return
        for call in self.calls:
            await call.done_writing()
        for call in self.calls:
            async for _ in call:  # drain so the stage sees a clean end of stream
                pass

    def _open(self) -> None:
        stubs = self.p.stubs[:1] if self.p.chained else self.p.stubs
        self.calls = [stub.Forward() for stub in stubs]

    def _cancel(self) -> None:
        for call in self.calls:  # cancellation ends the stage streams, which release the session
            call.cancel()

    def _restart(self) -> None:
        """Drops the session everywhere and starts over at position 0 under a new id (the old streams' release
        runs asynchronously on the stages, so the id must not be reused)."""
        self._cancel()
        self.restarts += 1
        self.session_id = f"{self.base_id}-r{self.restarts}"
        self.position = 0
        self._open()

    def _request(self, step: stage_pb2.SessionStep) -> stage_pb2.StepRequest:
        return stage_pb2.StepRequest(
            steps=[step], output_codec=codec.codec_to_proto(self.p.codec), output_zstd=self.p.zstd
        )

    async def step(
        self,
        input_ids: list[int],
        visual_tokens: tensor_pb2.TensorFrame | None,
        sampling: stage_pb2.SamplingParams,
        prefix: stage_pb2.PrefixRef | None = None,
    ) -> StepResult:
        """One step through every stage in turn (a decode step, or a prompt sent whole)."""
        step = stage_pb2.SessionStep(
            session_id=self.session_id,
            position=self.position,
            input_ids=input_ids,
            sampling=sampling,
            prefix=prefix,
            micro_batch=self.group,
        )
        if visual_tokens is not None:
            step.visual_tokens.CopyFrom(visual_tokens)
        t0 = time.perf_counter()
        timings: list[stage_pb2.StageTiming] = []
        response = None
        for k, call in enumerate(self.calls):
            await call.write(self._request(step))
            response = await call.read()
            if response is grpc.aio.EOF:
                raise Unavailable(f"stage {self.p.addresses[k]} closed the stream")
            timings.extend(response.timings)
            if k + 1 < len(self.calls):
                step = next_stage_step(step, response.results[0].hidden)
        total_ms = (time.perf_counter() - t0) * 1e3
        self.position += len(input_ids)
        return StepResult(response.results[0].token_id, timings, total_ms - sum(t.compute_ms for t in timings))

    async def prefill(
        self,
        input_ids: list[int],
        visual_tokens: tensor_pb2.TensorFrame | None,
        sampling: stage_pb2.SamplingParams,
        chunk_tokens: int,
        image_token_id: int,
        prefix_length: int = 0,
    ) -> StepResult:
        """The prompt, sampling its first token. `prefix_length` > 0 names the shared prefix (system prompt + spec
        context, before the image): when the stages hold it, only the rest is sent; otherwise it is computed and
        the stages keep it. A stage that has evicted it answers a prefix cache miss: the session starts over."""
        if self.position != 0:
            raise InvalidInput("prefill starts a session: it must be the session's first step")
        if prefix_length <= 0:
            return await self._prefill(input_ids, visual_tokens, sampling, chunk_tokens, image_token_id, None)
        prefix = stage_pb2.PrefixRef(key=prefix_key(input_ids[:prefix_length]), length=prefix_length)
        if prefix.key in self.p.cached_prefixes:
            self.position = prefix_length
            try:
                result = await self._prefill(
                    input_ids[prefix_length:], visual_tokens, sampling, chunk_tokens, image_token_id, prefix
                )
                self.prefix_reused = prefix_length
                return result
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION or "prefix cache miss" not in (
                    err.details() or ""
                ):
                    raise
                log.info("session %s: %s; sending the whole prompt", self.session_id, err.details())
                self.p.forget_prefix(prefix.key)
                self._restart()
        result = await self._prefill(input_ids, visual_tokens, sampling, chunk_tokens, image_token_id, prefix)
        self.p.remember_prefix(prefix.key)
        return result

    async def _prefill(self, input_ids, visual_tokens, sampling, chunk_tokens, image_token_id, prefix) -> StepResult:
        """Prompt ids from the session's position on, in chunks that flow through the stages overlapped: stage k+1
        runs chunk c while stage k runs chunk c+1, so time to first token approaches 1/S of a whole-prompt step
        plus one chunk per stage. Only the last chunk is sampled from. Chained stages overlap the same way, each
        sending a chunk on as soon as it is computed. A prefix being stored is a chunk boundary."""
        cut = max(0, prefix.length - self.position) if prefix is not None else 0
        if 0 < cut < len(input_ids):
            chunks = prompt_chunks(input_ids[:cut], None, chunk_tokens, image_token_id)
            chunks += prompt_chunks(input_ids[cut:], visual_tokens, chunk_tokens, image_token_id)
        else:
            chunks = prompt_chunks(input_ids, visual_tokens, chunk_tokens, image_token_id)
        if len(chunks) == 1:
            return await self.step(input_ids, visual_tokens, sampling, prefix)
        steps = []
        position = self.position
        for k, (ids, frame) in enumerate(chunks):
            last = k == len(chunks) - 1
            step = stage_pb2.SessionStep(
                session_id=self.session_id,
                position=position,
                input_ids=ids,
                prefill_chunk=not last,
                prefix=prefix,
                micro_batch=self.group,
            )
            if last:
                step.sampling.CopyFrom(sampling)
            if frame is not None:
                step.visual_tokens.CopyFrom(frame)
            steps.append(step)
            position += len(ids)
        t0 = time.perf_counter()
        timings: list[stage_pb2.StageTiming] = []
        responses: list[stage_pb2.StepResponse] = []

        async def feed_first() -> None:
            for step in steps:  # stage 0 reads them one by one as it finishes each chunk
                await self.calls[0].write(self._request(step))

        async def relay(k: int) -> None:
            """Reads stage k's answers in order and hands each chunk's hidden states to stage k + 1."""
            for step in steps:
                response = await self.calls[k].read()
                if response is grpc.aio.EOF:
                    raise Unavailable(f"stage {self.p.addresses[k]} closed the stream")
                timings.extend(response.timings)
                if k + 1 == len(self.calls):
                    responses.append(response)
                else:
                    await self.calls[k + 1].write(self._request(next_stage_step(step, response.results[0].hidden)))

        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the other relays
                group.create_task(feed_first())
                for k in range(len(self.calls)):
                    group.create_task(relay(k))
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        total_ms = (time.perf_counter() - t0) * 1e3
        self.position = position
        # Stages overlap, so "not computing" is wall time minus the critical path's compute, not minus the sum.
        busiest = max(sum(t.compute_ms for t in timings if t.stage == name) for name in {t.stage for t in timings})
        return StepResult(responses[-1].results[0].token_id, timings, max(total_ms - busiest, 0.0))


def prefix_key(ids: list[int]) -> str:
    """The prefix cache key of a prompt prefix: a hash of its token ids (the stages are bound to one checkpoint)."""
    return hashlib.sha256(array("q", ids).tobytes()).hexdigest()[:32]


def prompt_chunks(
    input_ids: list[int], visual_tokens: tensor_pb2.TensorFrame | None, chunk_tokens: int, image_token_id: int
) -> list[tuple[list[int], tensor_pb2.TensorFrame | None]]:
    """Splits a prompt into chunks of at most `chunk_tokens` ids, each with the visual tokens of its own image
    placeholders (re-encoded in the frame's codec; block-int8 rows re-quantize to the same values)."""
    if chunk_tokens <= 0 or len(input_ids) <= chunk_tokens:
        return [(list(input_ids), visual_tokens)]
    visual = None
    if visual_tokens is not None:
        visual = codec.decode_frame(visual_tokens, name="visual tokens")  # [N_img, vision_hidden]
        frame_codec = codec.codec_from_proto(visual_tokens.codec)
        slots = sum(1 for i in input_ids if i == image_token_id)
        if visual.dim() != 2 or visual.shape[0] != slots:
            raise InvalidInput(f"visual tokens {list(visual.shape)} do not fit the prompt's {slots} image placeholders")
    out, used = [], 0
    for start in range(0, len(input_ids), chunk_tokens):
        ids = list(input_ids[start : start + chunk_tokens])
        n = sum(1 for i in ids if i == image_token_id)
        frame = None
        if visual is not None and n:
            frame = codec.encode_frame(visual[used : used + n].contiguous(), frame_codec, visual_tokens.zstd)
            used += n
        out.append((ids, frame))
    return out


class VisionClient:
    def __init__(self, address: str, max_message_mb: int):
        self.channel = make_channel(address, max_message_mb)
        self.stub = vision_pb2_grpc.VisionServiceStub(self.channel)

    async def encode(self, image: bytes, wire_codec: codec.Codec, zstd: bool) -> vision_pb2.EncodeResponse:
        return await self.stub.Encode(
            vision_pb2.EncodeRequest(image=image, codec=codec.codec_to_proto(wire_codec), zstd=zstd)
        )

    async def info(self) -> vision_pb2.VisionInfo:
        return await self.stub.Info(vision_pb2.InfoRequest(), timeout=10)


class RetrievalClient:
    def __init__(self, address: str, max_message_mb: int):
        self.channel = make_channel(address, max_message_mb)
        self.stub = retrieval_pb2_grpc.RetrievalServiceStub(self.channel)

    async def search(self, query: str, k: int, filters: dict[str, str]) -> retrieval_pb2.SearchResponse:
        return await self.stub.Search(retrieval_pb2.SearchRequest(query=query, k=k, filters=filters))


def gateway_identity(checkpoint_fingerprint: str, tokenizer_fingerprint: str) -> common_pb2.PeerIdentity:
    return common_pb2.PeerIdentity(
        protocol_version=PROTOCOL_VERSION,
        checkpoint_fingerprint=checkpoint_fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint,
        role="gateway",
    )
