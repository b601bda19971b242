"""The gateway's clients of the internal roles: vision, retrieval and the decoder-stage pipeline."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import grpc

from edgeinspect import PROTOCOL_VERSION, codec
from edgeinspect.errors import Unavailable
from edgeinspect.services.common.channel import make_channel
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

    def __init__(self, addresses: list[str], wire_codec: codec.Codec, zstd: bool, chained: bool, max_message_mb: int):
        self.addresses = addresses
        self.codec = wire_codec
        self.zstd = zstd
        self.chained = chained
        self.channels = [make_channel(a, max_message_mb) for a in addresses]
        self.stubs = [stage_pb2_grpc.DecoderStageStub(c) for c in self.channels]
        self.stages: list[StageInfo] = []

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
        self.session_id = session_id
        self.calls: list = []
        self.position = 0

    async def __aenter__(self) -> PipelineSession:
        stubs = self.p.stubs[:1] if self.p.chained else self.p.stubs
        self.calls = [stub.Forward() for stub in stubs]
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            for call in self.calls:  # cancellation ends the stage streams, which release the session
                call.cancel()
            return
        for call in self.calls:
            await call.done_writing()
        for call in self.calls:
            async for _ in call:  # drain so the stage sees a clean end of stream
                pass

    async def step(
        self, input_ids: list[int], visual_tokens: tensor_pb2.TensorFrame | None, sampling: stage_pb2.SamplingParams
    ) -> StepResult:
        first = stage_pb2.SessionStep(
            session_id=self.session_id, position=self.position, input_ids=input_ids, sampling=sampling
        )
        if visual_tokens is not None:
            first.visual_tokens.CopyFrom(visual_tokens)
        request = stage_pb2.StepRequest(
            steps=[first], output_codec=codec.codec_to_proto(self.p.codec), output_zstd=self.p.zstd
        )
        t0 = time.perf_counter()
        timings: list[stage_pb2.StageTiming] = []
        response = None
        for k, call in enumerate(self.calls):
            await call.write(request)
            response = await call.read()
            if response is grpc.aio.EOF:
                raise Unavailable(f"stage {self.p.addresses[k]} closed the stream")
            timings.extend(response.timings)
            if k + 1 < len(self.calls):
                result = response.results[0]
                nxt = stage_pb2.SessionStep(session_id=self.session_id, position=self.position, sampling=sampling)
                nxt.hidden.CopyFrom(result.hidden)
                request = stage_pb2.StepRequest(steps=[nxt], output_codec=request.output_codec, output_zstd=self.p.zstd)
        total_ms = (time.perf_counter() - t0) * 1e3
        self.position += len(input_ids)
        return StepResult(response.results[0].token_id, timings, total_ms - sum(t.compute_ms for t in timings))


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
