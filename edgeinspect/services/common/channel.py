"""Client side: channels with our limits and keepalive, request-id/deadline propagation, readiness wait."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from contextvars import ContextVar
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.config import TLSConfig
from edgeinspect.errors import Unavailable
from edgeinspect.services.common.context import deadline_remaining, outgoing_metadata
from edgeinspect.services.common.errors import PEER_ATTR
from edgeinspect.services.common.retry import backoff_delays
from edgeinspect.services.common.tls import channel_credentials

logger = logging.getLogger(__name__)

# The certificate this process presents to the internal roles it calls: set once at role entry (run_role, from the
# role's `client_tls` setting), so every channel the role opens, wherever in the role, is mTLS without each caller
# passing it along.
client_tls_var: ContextVar[TLSConfig | None] = ContextVar("client_tls", default=None)


def channel_options(max_message_mb: int) -> list[tuple[str, int]]:
    """Message limits matching the servers', and keepalive that notices a dead peer within ~40 s."""
    limit = max_message_mb * 1024 * 1024
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # Stage-to-stage channels sit idle between inspections; ping them anyway so the first call after a
        # peer reboot fails fast instead of waiting on a half-open TCP connection.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # gRPC's default reconnect backoff grows to 120 s: a peer that restarts would be noticed minutes late.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def _with_context(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    """Adds the request id and trace context (unless the caller set them) and caps the timeout at the inbound
    deadline."""
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    for key, value in outgoing_metadata():
        if key in metadata:
            continue  # the caller chose an id (or a trace context) for this call explicitly
        metadata.add(key, value)
    timeout = details.timeout
    left = deadline_remaining()
    if left is not None:
        timeout = left if timeout is None else min(timeout, left)
    return grpc.aio.ClientCallDetails(
        method=details.method,
        timeout=timeout,
        metadata=metadata,
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
    )


class _ContextUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, address: str) -> None:
        self._address = address

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(_with_context(details), request)
        try:
            # Awaited here so an error can be tagged with the server that raised it (errors.details_for).
            await call
        except grpc.aio.AioRpcError as exc:
            setattr(exc, PEER_ATTR, self._address)
            raise
        return call


class _ContextUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_context(details), request)


class _ContextStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_context(details), request_iterator)


class _ContextStreamStream(grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_context(details), request_iterator)


def context_interceptors(address: str) -> list[grpc.aio.ClientInterceptor]:
    """One interceptor per call kind (grpc.aio files each under one kind only)."""
    return [_ContextUnaryUnary(address), _ContextUnaryStream(), _ContextStreamUnary(), _ContextStreamStream()]


def make_channel(
    address: str, max_message_mb: int = 64, tls: TLSConfig | None = None, intercept: bool = True
) -> grpc.aio.Channel:
    """A channel to host:port that propagates request id and deadline on every call; mTLS with `tls` (default:
    the role's client_tls). `intercept=False`: no client interceptors, for long-lived streams whose caller passes
    metadata and timeout itself (grpc.aio wraps an intercepted stream's writes in an async generator that a
    cancelled call leaves pending: "Task was destroyed" / "aclose(): asynchronous generator is already running")."""
    options = channel_options(max_message_mb)
    interceptors = context_interceptors(address) if intercept else None
    tls = tls if tls is not None else client_tls_var.get()
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, channel_credentials(tls), options=options, interceptors=interceptors)


async def wait_for_serving(address: str, timeout_s: float, tls: TLSConfig | None = None) -> None:
    """Polls grpc.health.v1 Check("") until SERVING; raises Unavailable naming the last state seen."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    # Quick polls first (a server that is just starting), then every 0.5 s.
    delays = itertools.chain(backoff_delays(0.05, 2.0, 0.5, attempts=6), itertools.repeat(0.5))
    async with make_channel(address, 1, tls) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Check
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"{address} not SERVING after {timeout_s:.1f}s (last: {last})")
            try:
                reply = await check(health_pb2.HealthCheckRequest(service=""), timeout=min(left, 2.0))
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.aio.AioRpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            await asyncio.sleep(min(next(delays), max(0.0, deadline - time.monotonic())))
