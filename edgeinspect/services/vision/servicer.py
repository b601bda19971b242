"""VisionService over gRPC: protobuf in, a domain call (encoder, anomaly gate, bank keeper), protobuf out."""

from __future__ import annotations

import asyncio
import logging

import grpc

import edgeinspect
from edgeinspect.codec import Codec, codec_from_proto, encode_frame, wire_nbytes
from edgeinspect.errors import EdgeInspectError, FailedPrecondition, InvalidInput, Unavailable
from edgeinspect.models.anomaly.bank import Bank, BankArchive, check_part
from edgeinspect.services.common.metrics import WIRE_BYTES
from edgeinspect.services.vision.anomaly import AnomalyGate, ScoreCall
from edgeinspect.services.vision.banks import BankKeeper, TeachCall
from edgeinspect.services.vision.encoder import EncodeResult, VisionEncoder
from edgeinspect.v1 import common_pb2, tensor_pb2, vision_pb2, vision_pb2_grpc

ROLE = "vision"
log = logging.getLogger(__name__)


class VisionServicer(vision_pb2_grpc.VisionServiceServicer):
    """Answers UNAVAILABLE until `encoder` is set (the model loads after the port is bound)."""

    def __init__(self, anomaly_enabled: bool = True) -> None:
        self.encoder: VisionEncoder | None = None
        self.keeper: BankKeeper | None = None  # set after the encoder; stays None with anomaly.enabled off
        self.gate: AnomalyGate | None = None  # scores against `keeper`; set with it
        self.gate_enabled = anomaly_enabled

    def _ready(self) -> VisionEncoder:
        if self.encoder is None:
            raise Unavailable("vision node is still loading its model; retry once health is SERVING")
        return self.encoder

    def _gate(self) -> AnomalyGate:
        self._ready()
        if self.gate is None:
            raise self._no_anomaly()
        return self.gate

    def _keeper(self) -> BankKeeper:
        self._ready()
        if self.keeper is None:
            raise self._no_anomaly()
        return self.keeper

    def _no_anomaly(self) -> EdgeInspectError:
        if not self.gate_enabled:
            return FailedPrecondition("the anomaly gate is off on this vision node (anomaly.enabled is false)")
        return Unavailable("vision node is still loading its anomaly banks; retry once health is SERVING")

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
        """Checkpoint identity, backend, output shape and the anomaly bank of every part this node can score."""
        encoder = self._ready()
        identity = common_pb2.PeerIdentity(
            protocol_version=edgeinspect.PROTOCOL_VERSION,
            checkpoint_fingerprint=encoder.ckpt.fingerprint,
            tokenizer_fingerprint=encoder.ckpt.tokenizer_fingerprint,
            role=ROLE,
        )
        held = self.keeper.banks() if self.keeper is not None else []
        staged = self.keeper.staged() if self.keeper is not None else []
        return vision_pb2.VisionInfo(
            identity=identity,
            backend=encoder.backend.name,
            output_shape=list(encoder.output_shape),
            banks=[_bank_proto(h.bank, h.frames) for h in held],
            staged_banks=[_bank_proto(b, _frames(b), staged=True) for b in staged],
        )

    async def Score(
        self, request: vision_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> vision_pb2.AnomalyScore:
        """One frame against its part's anomaly bank: score, verdict, regions, and the heatmap PNG when asked."""
        gate = self._gate()
        call = ScoreCall(check_part(request.part), request.image, request.expect_bank_id, request.heatmap)
        outcome = await asyncio.to_thread(gate.score, call)
        result = outcome.result
        log.info(
            "scored part %s: %.4g (threshold %.4g) %s in %.1f ms",
            call.part,
            result.score,
            result.threshold,
            result.verdict,
            outcome.score_ms,
            extra={"part": call.part, "bank_id": result.bank_id, "verdict": result.verdict},
        )
        return vision_pb2.AnomalyScore(
            score=result.score,
            threshold=result.threshold,
            band_low=outcome.band[0],
            band_high=outcome.band[1],
            verdict=VERDICTS[result.verdict],
            regions=[
                vision_pb2.AnomalyRegion(x=r.x0, y=r.y0, width=r.x1 - r.x0, height=r.y1 - r.y0, peak=r.peak)
                for r in result.regions
            ],
            heatmap_png=outcome.heatmap_png,
            bank_id=result.bank_id,
            extractor_fingerprint=result.fingerprint,
            score_ms=outcome.score_ms,
            image_sha256=outcome.image_sha256,
        )

    async def Teach(
        self, request: vision_pb2.TeachRequest, context: grpc.aio.ServicerContext
    ) -> vision_pb2.TeachResponse:
        """Teaches the part's next bank version from good frames and publishes it; a refusal changes nothing."""
        keeper = self._keeper()
        call = TeachCall(
            check_part(request.part), list(request.frames), request.add_to_current, request.extractor, request.stage
        )
        outcome = await asyncio.to_thread(keeper.teach, call)
        return vision_pb2.TeachResponse(
            bank=_bank_proto(outcome.bank, outcome.frames, staged=outcome.staged),
            outliers=[
                f"{o.name}: score {o.score:.4g}, {o.robust_z:.1f} MADs above the set's median" for o in outcome.outliers
            ],
            teach_ms=outcome.teach_ms,
        )

    async def Promote(
        self, request: vision_pb2.PromoteRequest, context: grpc.aio.ServicerContext
    ) -> vision_pb2.AnomalyBank:
        """Makes the part's staged bank version current (its go-live figures checked unless forced)."""
        keeper = self._keeper()
        bank = await asyncio.to_thread(
            keeper.promote, check_part(request.part), _version(request.version), request.force
        )
        return _bank_proto(bank, _frames(bank))

    async def ExportBank(
        self, request: vision_pb2.ExportBankRequest, context: grpc.aio.ServicerContext
    ) -> vision_pb2.BankArchive:
        """One published bank version as a deterministic tar and its sha256."""
        keeper = self._keeper()
        archive = await asyncio.to_thread(keeper.export_bank, check_part(request.part), _version(request.version))
        return vision_pb2.BankArchive(part=archive.part, version=archive.version, bank_id=archive.bank_id,
                                      sha256=archive.sha256, archive=archive.data, staged=archive.staged)  # fmt: skip

    async def ImportBank(
        self, request: vision_pb2.BankArchive, context: grpc.aio.ServicerContext
    ) -> vision_pb2.AnomalyBank:
        """Installs another node's bank version, checked against its sha256 (same content held: a no-op)."""
        keeper = self._keeper()
        archive = BankArchive(check_part(request.part), _version(request.version), request.bank_id, request.staged,
                              request.archive, request.sha256)  # fmt: skip
        bank, staged = await asyncio.to_thread(keeper.import_bank, archive)
        return _bank_proto(bank, _frames(bank), staged=staged)


VERDICTS = {
    "OK": vision_pb2.ANOMALY_VERDICT_OK,
    "DEFECT": vision_pb2.ANOMALY_VERDICT_DEFECT,
    "UNCERTAIN": vision_pb2.ANOMALY_VERDICT_UNCERTAIN,
}


def _version(version: int) -> int:
    if version <= 0:
        raise InvalidInput(f"version must be a published bank version (1 or more), got {version}")
    return version


def _frames(bank: Bank) -> int:
    return int(bank.stats.get("n_kept", len(bank.teach_hashes)))


def _bank_proto(bank: Bank, frames: int, staged: bool = False) -> vision_pb2.AnomalyBank:
    return vision_pb2.AnomalyBank(
        staged=staged,
        part=bank.part,
        bank_id=bank.bank_id,
        version=bank.version,
        extractor=bank.extractor["name"],
        extractor_fingerprint=bank.fingerprint,
        threshold=bank.threshold,
        frames=frames,
    )


def _encode(
    encoder: VisionEncoder, image: bytes, codec: Codec, zstd: bool
) -> tuple[EncodeResult, tensor_pb2.TensorFrame]:
    # Both halves are CPU work (tower, then int8/zstd packing): one trip to the worker thread.
    result = encoder.encode(image)
    return result, encode_frame(result.tokens, codec, zstd)
