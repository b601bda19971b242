"""Which sessions' KV caches to drop: idle past the TTL, then oldest idle first until under the byte budget."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionUsage:
    session_id: str
    last_used: float  # monotonic seconds
    nbytes: int
    busy: bool = False  # a step is running on it now: never evicted


def choose_evictions(
    sessions: list[SessionUsage], now: float, ttl_s: float, budget_bytes: int
) -> list[tuple[str, str]]:
    """Returns (session_id, reason) pairs, reason "ttl" or "budget"; pure, so it is tested without a model."""
    evict: list[tuple[str, str]] = []
    kept: list[SessionUsage] = []
    for s in sessions:
        if not s.busy and now - s.last_used > ttl_s:
            evict.append((s.session_id, "ttl"))
        else:
            kept.append(s)
    total = sum(s.nbytes for s in kept)
    for s in sorted(kept, key=lambda s: s.last_used):
        if total <= budget_bytes:
            break
        if not s.busy:
            evict.append((s.session_id, "budget"))
            total -= s.nbytes
    return evict
