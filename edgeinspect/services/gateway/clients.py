"""The gateway's clients of the vision and retrieval nodes, and a health watch for a single peer."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect import PROTOCOL_VERSION, codec
from edgeinspect.errors import Unavailable
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.errors import upstream_peer
from edgeinspect.services.common.tracing import client_span
from edgeinspect.services.gateway.decode.routing import WATCH_DELAYS
from edgeinspect.v1 import common_pb2, retrieval_pb2, retrieval_pb2_grpc, vision_pb2, vision_pb2_grpc

log = logging.getLogger(__name__)
VISION_PUSHBACK_MS = 2000


class PeerHealth:
    """Follows one peer's grpc.health.v1 Watch stream; `state` is SERVING, NOT_SERVING or UNREACHABLE."""

    def __init__(self, name: str, channel: grpc.aio.Channel):
        self.name = name
        self.stub = health_pb2_grpc.HealthStub(channel)
        self.state = "UNREACHABLE"
        self._task: asyncio.Task | None = None

    @property
    def serving(self) -> bool:
        return self.state == "SERVING"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        attempt = 0
        while True:
            try:
                async for reply in self.stub.Watch(health_pb2.HealthCheckRequest(service="")):
                    attempt = 0
                    self._set(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
            except grpc.aio.AioRpcError:
                pass
            self._set("UNREACHABLE")
            await asyncio.sleep(WATCH_DELAYS[min(attempt, len(WATCH_DELAYS) - 1)])
            attempt += 1

    def _set(self, state: str) -> None:
        if state != self.state:
            (log.info if state == "SERVING" else log.warning)("%s node: %s", self.name, state)
            self.state = state


class VisionClient:
    def __init__(self, address: str, max_message_mb: int, tls=None):
        self.address = address
        self.channel = make_channel(address, max_message_mb, tls)
        self.stub = vision_pb2_grpc.VisionServiceStub(self.channel)
        self.health = PeerHealth("vision", self.channel)

    async def encode(
        self, image: bytes, wire_codec: codec.Codec, zstd: bool, timeout_s: float
    ) -> vision_pb2.EncodeResponse:
        """Visual tokens of one image; a vision node that is down answers Unavailable with pushback at once."""
        attrs = {"edgeinspect.image_bytes": len(image), "edgeinspect.codec": str(wire_codec)}
        try:
            with client_span("vision encode", attrs) as span:
                reply = await self.stub.Encode(
                    vision_pb2.EncodeRequest(image=image, codec=codec.codec_to_proto(wire_codec), zstd=zstd),
                    timeout=timeout_s,
                )
                if span is not None:
                    span.set_attribute("edgeinspect.codec_bytes", codec.wire_nbytes(reply.visual_tokens))
                    span.set_attribute("edgeinspect.visual_tokens", (reply.visual_tokens.shape or [0])[0])
                    span.set_attribute("edgeinspect.encode_ms", reply.encode_ms)
                return reply
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                log.warning("vision %s: %s", upstream_peer(exc), exc.details())
                raise Unavailable(
                    "the vision node is unavailable; retry shortly", retry_after_ms=VISION_PUSHBACK_MS
                ) from None
            raise

    async def info(self) -> vision_pb2.VisionInfo:
        return await self.stub.Info(vision_pb2.InfoRequest(), timeout=10)

    async def score(self, request: vision_pb2.ScoreRequest, timeout_s: float) -> vision_pb2.AnomalyScore:
        """The anomaly gate's score of one frame; errors propagate (services/gateway/gate.py decides on them)."""
        with client_span("vision score", {"edgeinspect.part": request.part}) as span:
            reply = await self.stub.Score(request, timeout=timeout_s)
            if span is not None:
                span.set_attribute("edgeinspect.anomaly_score", reply.score)
                span.set_attribute("edgeinspect.score_ms", reply.score_ms)
            return reply

    async def teach(self, request: vision_pb2.TeachRequest, timeout_s: float) -> vision_pb2.TeachResponse:
        """Publishes a part's next bank version on the vision node (slow: features for every frame)."""
        with client_span("vision teach", {"edgeinspect.part": request.part, "edgeinspect.frames": len(request.frames)}):
            return await self.stub.Teach(request, timeout=timeout_s)

    async def close(self) -> None:
        await self.health.close()
        await self.channel.close()


class RetrievalClient:
    def __init__(self, address: str, max_message_mb: int, tls=None):
        self.address = address
        self.channel = make_channel(address, max_message_mb, tls)
        self.stub = retrieval_pb2_grpc.RetrievalServiceStub(self.channel)
        self.health = PeerHealth("retrieval", self.channel)

    async def search(
        self, query: str, k: int, filters: dict[str, str], timeout_s: float
    ) -> retrieval_pb2.SearchResponse:
        with client_span("retrieval search", {"edgeinspect.k": k, "edgeinspect.filtered": bool(filters)}) as span:
            reply = await self.stub.Search(
                retrieval_pb2.SearchRequest(query=query, k=k, filters=filters), timeout=timeout_s
            )
            if span is not None:
                span.set_attribute("edgeinspect.chunks", len(reply.chunks))
                span.set_attribute("edgeinspect.search_ms", reply.search_ms)
            return reply

    async def close(self) -> None:
        await self.health.close()
        await self.channel.close()


def gateway_identity(checkpoint_fingerprint: str, tokenizer_fingerprint: str) -> common_pb2.PeerIdentity:
    return common_pb2.PeerIdentity(
        protocol_version=PROTOCOL_VERSION,
        checkpoint_fingerprint=checkpoint_fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint,
        role="gateway",
    )
