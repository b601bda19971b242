"""Clients of a gateway pair (or more): every gateway serves the whole public API, so a client holds a list, uses the
one that answered last, and on UNAVAILABLE (the box is gone, or another gateway still runs this key) sends the
*same* request, with the same idempotency key, to the next one until its deadline. The shared report store makes
that exactly once: a key a dead gateway left running is taken over there (reports/store.py), a finished key returns
its report. This module owns that recovery for every client: the CLI's InspectionClient, ingest (the camera feed and
the PLC's cycles) and the console.

Only UNAVAILABLE moves on: DEADLINE_EXCEEDED means the budget is spent, and every other code is the request's own
fault, which another gateway would answer the same way.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Generic, TypeVar

import grpc

from edgeinspect.errors import InvalidInput
from edgeinspect.services.common.errors import RETRY_PUSHBACK_KEY

logger = logging.getLogger(__name__)

S = TypeVar("S")  # a stub (or a channel): what one gateway's connection gives the caller
T = TypeVar("T")

ROUND_PAUSE_S = 0.25  # after every gateway answered UNAVAILABLE once: let a restarting one come back
MAX_PUSHBACK_S = 5.0
# How long a pair keeps trying after its first UNAVAILABLE: longer than a dead gateway's key takes to be taken over
# (the store's owner lease) plus a restart, shorter than a person waits.
FAILOVER_S = 30.0


def gateway_addresses(spec: str | Sequence[str]) -> list[str]:
    """'host-a:50051,host-b:50051' (commas or spaces) or a list -> the addresses, in order, without repeats."""
    parts = re.split(r"[,\s]+", spec) if isinstance(spec, str) else [p for s in spec for p in re.split(r"[,\s]+", s)]
    addresses = list(dict.fromkeys(p.strip() for p in parts if p.strip()))
    if not addresses:
        raise InvalidInput("no gateway address given (expected host:port, or several separated by commas)")
    return addresses


def pushback_s(error: grpc.RpcError) -> float:
    """The server's grpc-retry-pushback-ms, in seconds (0 when it sent none)."""
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():  # pyright: ignore[reportGeneralTypeIssues]  # typeshed: _Metadatum; grpc: (key, value)
        if key == RETRY_PUSHBACK_KEY:
            try:
                return min(MAX_PUSHBACK_S, max(0.0, int(value) / 1000.0))
            except ValueError:
                return 0.0
    return 0.0


def _moves_on(error: BaseException) -> bool:
    return isinstance(error, grpc.RpcError) and error.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


class _Rotation(Generic[S]):
    """The gateways in order, the one to try first (the last that answered), and the rule for when to stop."""

    def __init__(self, addresses: Sequence[str], connect: Callable[[str], S], failover_s: float = FAILOVER_S) -> None:
        self.addresses = list(addresses)
        self.ends = [connect(a) for a in self.addresses]
        self.failover_s = failover_s
        self.current = 0
        self._lock = threading.Lock()

    def order(self) -> list[int]:
        with self._lock:
            start = self.current
        return [(start + i) % len(self.ends) for i in range(len(self.ends))]

    def answered(self, index: int) -> None:
        with self._lock:
            if self.current != index:
                logger.info("gateway %s answered; using it from now on", self.addresses[index])
            self.current = index

    def skipped(self, index: int, exc: grpc.RpcError) -> None:
        if len(self.ends) == 1:
            return  # one gateway: its caller reports the error itself
        logger.warning("gateway %s unavailable (%s); trying the next", self.addresses[index], exc.details())  # type: ignore[attr-defined]


class _Trial:
    """One call's walk over the gateways, shared by the sync and async clients: `tries()` gives the gateways of a
    round while time is left, `failed()` keeps an UNAVAILABLE (and re-raises anything else), `pause()` says how long
    to wait before the next round, or raises when there is none. One gateway is tried once (the caller hears at once
    that it is down); a pair keeps going within failover_s and the call's deadline."""

    def __init__(self, rotation: _Rotation, timeout_s: float) -> None:
        self.rotation = rotation
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.first_failure = 0.0
        self.last: grpc.RpcError | None = None
        self.wait = ROUND_PAUSE_S

    def tries(self) -> Iterator[tuple[int, float]]:
        """(gateway index, seconds left) for each gateway of this round, the last that answered first."""
        self.last, self.wait = None, ROUND_PAUSE_S
        for index in self.rotation.order():
            left = self.deadline - time.monotonic()
            if left <= 0:
                return
            yield index, left

    def failed(self, index: int, exc: grpc.RpcError) -> None:
        if not _moves_on(exc):
            raise exc
        self.last, self.wait = exc, max(self.wait, pushback_s(exc))
        self.first_failure = self.first_failure or time.monotonic()
        self.rotation.skipped(index, exc)

    def pause(self) -> float:
        if self.last is None:
            raise TimeoutError(f"no gateway answered within {self.timeout_s:.0f} s")
        end = min(self.deadline, self.first_failure + self.rotation.failover_s)
        if len(self.rotation.ends) == 1 or time.monotonic() + self.wait >= end:
            raise self.last
        return self.wait


class GatewayFailover(_Rotation[S]):
    """Synchronous: `call(lambda stub, timeout: stub.Inspect(request, timeout=timeout), timeout_s)`."""

    def call(self, fn: Callable[[S, float], T], timeout_s: float) -> T:
        trial = _Trial(self, timeout_s)
        while True:
            for index, left in trial.tries():
                try:
                    result = fn(self.ends[index], left)
                except grpc.RpcError as exc:
                    trial.failed(index, exc)
                    continue
                self.answered(index)
                return result
            time.sleep(trial.pause())


class AsyncGatewayFailover(_Rotation[S]):
    """The same for asyncio clients (ingest, the console)."""

    async def call(self, fn: Callable[[S, float], Awaitable[T]], timeout_s: float) -> T:
        trial = _Trial(self, timeout_s)
        while True:
            for index, left in trial.tries():
                try:
                    result = await fn(self.ends[index], left)
                except grpc.RpcError as exc:
                    trial.failed(index, exc)
                    continue
                self.answered(index)
                return result
            await asyncio.sleep(trial.pause())
