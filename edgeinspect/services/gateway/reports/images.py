"""GetReportImage's reads for a gateway of a pair: the frame, thumbnail or heatmap from this box's frame store, else
from the public API of the gateway that made the report and holds its files (each box keeps its own frames.dir
unless the pair shares one folder: then the file is here and nothing is fetched).

The holder is asked with the caller's own `authorization`, so it authorizes the same caller; the call is marked as
forwarded and a forwarded call is answered from the box's own files only (two gateways that name each other never
ping-pong). Nothing fetched is kept here: the holder's retention decides how long a frame lives, and the frames
table the pair shares has one row per frame, which a second copy here could not be counted in.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from edgeinspect.config import ServerConfig, TLSConfig
from edgeinspect.errors import FailedPrecondition
from edgeinspect.services.common.channel import channel_options, context_interceptors
from edgeinspect.services.common.tls import channel_credentials
from edgeinspect.services.gateway.reports.frames import StoredFrame
from edgeinspect.services.gateway.reports.reader import FrameAnswer, Holder, ReportReader
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

log = logging.getLogger(__name__)

FORWARDED_KEY = "edgeinspect-frame-forwarded"  # value: the asking gateway's name
PEER_TIMEOUT_S = 10.0  # one frame over the plant network; capped by the caller's own deadline
_NOT_ANSWERING = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})
_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


class FrameHeldElsewhere(FailedPrecondition):
    """The image is on another gateway's disk and that gateway cannot give it now (it is down, or refused us)."""

    code = "frame_held_elsewhere"


def peer_tls(server: ServerConfig, client_tls: TLSConfig | None) -> TLSConfig | None:
    """How this gateway calls another's public API: the way its own is served (a pair shares its config's shape):
    plaintext, or TLS verified against client_tls's CA (else server.tls.ca, else the system's roots)."""
    if server.tls is None:
        return None
    return client_tls if client_tls is not None else TLSConfig(ca=server.tls.ca)


def _outgoing(metadata: object, owner: str) -> list[tuple[str, str]]:
    """The caller's authorization (the holder checks the same token) plus the forwarded mark."""
    out = [(FORWARDED_KEY, owner or "-")]
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == "authorization":
            out.append((key, value.decode() if isinstance(value, bytes) else value))
    return out


def is_forwarded(metadata: object) -> bool:
    return any(key == FORWARDED_KEY for key, _ in metadata or ())  # type: ignore[attr-defined]


class ReportImages:
    """A report's image wherever in the pair it is kept."""

    def __init__(
        self,
        store: ReportReader,
        max_message_mb: int = 64,
        tls: TLSConfig | None = None,
        timeout_s: float = PEER_TIMEOUT_S,
    ) -> None:
        self.store = store
        self.max_message_mb = max_message_mb
        self.tls = tls  # None: plaintext to the holder (see peer_tls)
        self.timeout_s = timeout_s

    @classmethod
    def for_gateway(cls, store: ReportReader, cfg: GatewaySettings) -> ReportImages:
        return cls(store, cfg.server.max_message_mb, peer_tls(cfg.server, cfg.client_tls))

    async def image(self, report_id: str, thumbnail: bool, heatmap: bool, metadata: object = ()) -> FrameAnswer:
        """The store's answer, or the holder's for a report whose files another gateway of the pair keeps;
        FrameHeldElsewhere (naming the holder, never its address) when that gateway cannot give it now."""
        answer = await asyncio.to_thread(self.store.image, report_id, thumbnail, heatmap)
        holder = answer.holder
        if holder is None or is_forwarded(metadata):
            return answer
        if not holder.live:
            raise FrameHeldElsewhere(
                f"the image of report {report_id[:12]} is kept by gateway {holder.owner!r}, which has not been "
                f"heard from for {holder.silent_s:.0f} s; it can be read again once {holder.owner!r} is back"
            )
        if not holder.address:
            raise FrameHeldElsewhere(
                f"the image of report {report_id[:12]} is kept by gateway {holder.owner!r}, which advertises no "
                f"address to the pair (set store.advertise on {holder.owner!r}, or give both one frames.dir)"
            )
        request = inspection_pb2.GetReportImageRequest(report_id=report_id, thumbnail=thumbnail, heatmap=heatmap)
        try:
            reply = await self._fetch(holder, request, _outgoing(metadata, self.store.owner))
        except grpc.aio.AioRpcError as exc:
            raise self._failure(report_id, holder, exc) from exc
        frame = StoredFrame(reply.image_sha256, len(reply.data), reply.media_type, reply.width, reply.height)
        return FrameAnswer(reply.state, frame if reply.image_sha256 else None, reply.data)

    async def _fetch(
        self, holder: Holder, request: inspection_pb2.GetReportImageRequest, metadata: list[tuple[str, str]]
    ) -> inspection_pb2.ReportImage:
        # A channel per read: a person opening a report page, not a hot path; nothing is left open to close.
        options = channel_options(self.max_message_mb)
        interceptors = context_interceptors(holder.address)  # request id, and the caller's deadline caps ours
        if self.tls is None:
            channel = grpc.aio.insecure_channel(holder.address, options=options, interceptors=interceptors)
        else:
            creds = channel_credentials(self.tls)
            channel = grpc.aio.secure_channel(holder.address, creds, options=options, interceptors=interceptors)
        async with channel:
            stub = inspection_pb2_grpc.InspectionServiceStub(channel)
            return await stub.GetReportImage(request, metadata=metadata, timeout=self.timeout_s)

    @staticmethod
    def _failure(report_id: str, holder: Holder, exc: grpc.aio.AioRpcError) -> FrameHeldElsewhere:
        log.warning(
            "reading report %s's image from gateway %r at %s failed: %s: %s",
            report_id[:12], holder.owner, holder.address, exc.code().name, exc.details(),
        )  # fmt: skip
        where = f"the image of report {report_id[:12]} is kept by gateway {holder.owner!r}"
        if exc.code() in _NOT_ANSWERING:  # its details may name the address: the log has them
            return FrameHeldElsewhere(f"{where}, which is not answering; it can be read again once it is back")
        if exc.code() in _REFUSED:
            return FrameHeldElsewhere(
                f"{where}, which refused this caller's token ({exc.code().name}): the gateways of a pair need the "
                "same api_tokens"
            )
        return FrameHeldElsewhere(f"{where}, which answered {exc.code().name}: {exc.details()}")
