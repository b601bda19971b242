"""VisionService over gRPC: protobuf in, the encoder's domain call, protobuf out."""

from __future__ import annotations

import asyncio
import logging

import grpc

import edgeinspect
from edgeinspect.codec import Codec, codec_from_proto, encode_frame, wire_nbytes
from edgeinspect.errors import Unavailable
from edgeinspect.services.common.metrics import WIRE_BYTES
from edgeinspect.services.vision.encoder import EncodeResult, VisionEncoder
from edgeinspect.v1 import common_pb2, tensor_pb2, vision_pb2, vision_pb2_grpc

ROLE = "vision"
log = logging.getLogger(__name__)


class VisionServicer(vision_pb2_grpc.VisionServiceServicer):
    """Answers UNAVAILABLE until `encoder` is set (the model loads after the port is bound)."""

    def __init__(self) -> None:
        self.encoder: VisionEncoder | None = None

    def _ready(self) -> VisionEncoder:
        if self.encoder is None:
            raise Unavailable("vision node is still loading its model; retry once health is SERVING")
        return self.encoder

    async def Encode(
        self, request: vision_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> vision_pb2.EncodeResponse:
        """Visual tokens [N, vision_hidden] of one image, in the requested wire codec."""
        encoder = self._ready()
        codec = codec_from_proto(request.codec)
        result, frame = await asyncio.to_thread(_encode, encoder, request.image, codec, request.zstd)
        WIRE_BYTES.labels(ROLE, codec.value, "out").inc(wire_nbytes(frame))
        tokens = frame.shape[0] if frame.shape else 0
        log.info(  # one line per inspection, with its request id (and trace id when traced)
            "encoded an image: %d visual tokens in %.1f ms%s",
            tokens,
            result.encode_ms,
            " (cached)" if result.cache_hit else "",
            extra={
                "image_bytes": len(request.image),
                "visual_tokens": tokens,
                "encode_ms": round(result.encode_ms, 3),
                "cache_hit": result.cache_hit,
                "codec_bytes": wire_nbytes(frame),
            },
        )
        return vision_pb2.EncodeResponse(
            visual_tokens=frame,
            image_sha256=result.image_sha256,
            encode_ms=result.encode_ms,
            cache_hit=result.cache_hit,
        )

    async def Info(self, request: vision_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> vision_pb2.VisionInfo:
        """Checkpoint identity, backend and output shape of this node."""
        encoder = self._ready()
        identity = common_pb2.PeerIdentity(
            protocol_version=edgeinspect.PROTOCOL_VERSION,
            checkpoint_fingerprint=encoder.ckpt.fingerprint,
            tokenizer_fingerprint=encoder.ckpt.tokenizer_fingerprint,
            role=ROLE,
        )
        return vision_pb2.VisionInfo(
            identity=identity, backend=encoder.backend.name, output_shape=list(encoder.output_shape)
        )


def _encode(
    encoder: VisionEncoder, image: bytes, codec: Codec, zstd: bool
) -> tuple[EncodeResult, tensor_pb2.TensorFrame]:
    # Both halves are CPU work (tower, then int8/zstd packing): one trip to the worker thread.
    result = encoder.encode(image)
    return result, encode_frame(result.tokens, codec, zstd)
