"""The project's one retry/backoff helper: a pure delay schedule and an async retry loop over it."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from edgeinspect.services.common.errors import status_for

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def backoff_delays(
    base_s: float,
    factor: float,
    max_s: float,
    attempts: int,
    jitter: float = 0.0,
    seed: int | None = None,
) -> list[float]:
    """Sleeps between `attempts` tries (attempts - 1 values): base_s * factor**i capped at max_s.

    jitter in [0, 1] shortens each delay by a random fraction up to `jitter` (so replicas retrying the same
    peer spread out, and no delay ever exceeds max_s); seed makes the jitter reproducible.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if base_s < 0 or max_s < 0:
        raise ValueError(f"base_s and max_s must be >= 0, got {base_s}, {max_s}")
    if factor < 1:
        raise ValueError(f"factor must be >= 1 (delays never shrink), got {factor}")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter must be in [0, 1], got {jitter}")
    rng = random.Random(seed)
    delays = []
    for i in range(attempts - 1):
        delay = min(max_s, base_s * factor**i)
        if jitter:
            delay *= 1.0 - jitter * rng.random()
        delays.append(delay)
    return delays


async def retry_async(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    base_s: float,
    max_s: float,
    retry_codes: Sequence[grpc.StatusCode] = DEFAULT_RETRY_CODES,
    on_retry: Callable[[int, BaseException, float], object] | None = None,
    factor: float = 2.0,
    jitter: float = 0.2,
) -> T:
    """Awaits fn() up to `attempts` times, retrying only errors whose status (errors.status_for) is in
    retry_codes; on_retry(attempt, exc, delay) runs (and is awaited if async) before each sleep."""
    delays = backoff_delays(base_s, factor, max_s, attempts, jitter)
    for attempt in range(attempts):
        try:
            return await fn()
        except Exception as exc:
            if attempt == attempts - 1 or status_for(exc) not in retry_codes:
                raise
            delay = delays[attempt]
            logger.info(
                "retrying after %s (%s), attempt %d/%d in %.3fs",
                status_for(exc).name,
                exc,
                attempt + 2,
                attempts,
                delay,
            )
            if on_retry is not None:
                result = on_retry(attempt + 1, exc, delay)
                if inspect.isawaitable(result):
                    await result
            await asyncio.sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")
