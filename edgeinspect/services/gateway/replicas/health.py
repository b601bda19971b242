"""What every replica the gateway calls shares, a decoder stage, a vision or a retrieval node alike: the heartbeat (a
grpc.health.v1 Watch stream followed forever), bans with a growing backoff, the probe that readmits a banned replica,
and the handshake's timeout and the identity the gateway presents in it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect import PROTOCOL_VERSION
from edgeinspect.services.common.retry import backoff_delays
from edgeinspect.v1 import common_pb2

HANDSHAKE_TIMEOUT_S = 5.0
PROBE_TIMEOUT_S = 1.0
# Bans after failures grow 0.5 s, 1 s, 2 s ... up to 30 s; a good step resets the count.
BAN_DELAYS = backoff_delays(0.5, 2.0, 30.0, attempts=12)
# Reconnecting a health watch: quick at first (a restart takes a second or two), then every 2 s.
WATCH_DELAYS = backoff_delays(0.1, 2.0, 2.0, attempts=8)


def gateway_identity(checkpoint_fingerprint: str, tokenizer_fingerprint: str) -> common_pb2.PeerIdentity:
    """The identity this gateway presents in its handshakes with the stages and the vision nodes."""
    return common_pb2.PeerIdentity(
        protocol_version=PROTOCOL_VERSION,
        checkpoint_fingerprint=checkpoint_fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint,
        role="gateway",
    )


class Bannable(Protocol):
    """What the ban helpers need of an endpoint (a decoder stage here, a vision or retrieval replica elsewhere)."""

    failures: int
    banned_until: float
    ban_reason: str


def ban(ep: Bannable) -> float:
    """Counts a failure and bans `ep` for a growing time (BAN_DELAYS); returns the ban's length."""
    ep.failures += 1
    delay = BAN_DELAYS[min(ep.failures - 1, len(BAN_DELAYS) - 1)]
    ep.banned_until = time.monotonic() + delay
    return delay


async def probe_until_serving(health: health_pb2_grpc.HealthStub, ep: Bannable) -> None:
    """When the ban ends, a health Check must answer SERVING within PROBE_TIMEOUT_S (a stopped process does not)
    before the endpoint is used again; otherwise the ban is extended. Returns with the ban lifted."""
    while True:
        await asyncio.sleep(max(0.0, ep.banned_until - time.monotonic()))
        try:
            check = health.Check  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Check
            reply = await check(health_pb2.HealthCheckRequest(service=""), timeout=PROBE_TIMEOUT_S)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                break
        except grpc.aio.AioRpcError:
            pass
        ban(ep)
    ep.banned_until = 0.0
    ep.ban_reason = ""


async def follow_health(
    health: health_pb2_grpc.HealthStub,
    on_status: Callable[[bool], Awaitable[None]],
    on_lost: Callable[[str], None],
) -> None:
    """The heartbeat: follows a peer's grpc.health.v1 Watch stream forever. on_status(serving) per reply;
    on_lost(why) when the stream breaks (a dead process breaks it at once), then reconnects after WATCH_DELAYS."""
    attempt = 0
    while True:
        try:
            watch = health.Watch  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Watch
            async for reply in watch(health_pb2.HealthCheckRequest(service="")):
                attempt = 0
                await on_status(reply.status == health_pb2.HealthCheckResponse.SERVING)
        except grpc.aio.AioRpcError as exc:
            on_lost(exc.code().name)
        else:
            on_lost("health stream ended")
        await asyncio.sleep(WATCH_DELAYS[min(attempt, len(WATCH_DELAYS) - 1)])
        attempt += 1
