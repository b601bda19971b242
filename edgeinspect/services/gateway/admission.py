"""Admission control: a bounded number of inspections run, a bounded number wait; the rest are refused at once.

Admitting everything makes every inspection slow together (128 concurrent: p50 40 s); a refusal with pushback lets
a camera or PLC come back when there is room (RESOURCE_EXHAUSTED + grpc-retry-pushback-ms, as Triton and vLLM do).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from edgeinspect.errors import DeadlineExceeded, ResourceExhausted


def pushback_ms(mean_inspection_s: float, queued: int, max_inflight: int) -> int:
    """How long a refused caller should wait: the time for the queue ahead of it to drain (at least 100 ms)."""
    waves = (queued + 1) / max(max_inflight, 1)
    return max(100, int(1000 * mean_inspection_s * waves))


class Admission:
    """`max_inflight` slots and a FIFO of at most `max_queued` waiters; a freed slot goes to the oldest waiter."""

    def __init__(self, max_inflight: int, max_queued: int):
        self.max_inflight = max(1, max_inflight)
        self.max_queued = max(0, max_queued)
        self.inflight = 0
        self._waiters: deque[asyncio.Future] = deque()
        self.mean_s = 1.0  # EWMA of an inspection's duration, for the pushback estimate
        self.refused = 0

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def resize(self, max_inflight: int, max_queued: int) -> None:
        """New limits (derived from the stages once they are known); waiters are let in when slots appear."""
        self.max_inflight, self.max_queued = max(1, max_inflight), max(0, max_queued)
        while self._waiters and self.inflight < self.max_inflight:
            self.inflight += 1
            self._waiters.popleft().set_result(None)

    @asynccontextmanager
    async def slot(self, timeout_s: float) -> AsyncIterator[None]:
        """Holds one slot for the body; waits at most `timeout_s` in the queue; refuses at once when full."""
        if self.inflight < self.max_inflight and not self._waiters:
            self.inflight += 1
        elif len(self._waiters) >= self.max_queued:
            self.refused += 1
            raise ResourceExhausted(
                f"the gateway is at capacity: {self.inflight} inspections running and {len(self._waiters)} waiting "
                f"(limits {self.max_inflight} + {self.max_queued}); retry later",
                retry_after_ms=pushback_ms(self.mean_s, len(self._waiters), self.max_inflight),
            )
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # the slot was handed to us just as we gave up: pass it on
                else:
                    waiter.cancel()
                    self._waiters.remove(waiter)
                if isinstance(exc, TimeoutError):
                    raise DeadlineExceeded(
                        f"waited {timeout_s:.1f} s for a free inspection slot (the deadline); none came free"
                    ) from None
                raise
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.mean_s = 0.8 * self.mean_s + 0.2 * (time.monotonic() - t0)
            self._release()

    def _release(self) -> None:
        if self._waiters and self.inflight <= self.max_inflight:
            self._waiters.popleft().set_result(None)  # the slot passes on: inflight stays
        else:
            self.inflight -= 1
