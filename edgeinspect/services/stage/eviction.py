"""Which sessions' KV caches to drop: those idle (no step) for longer than the TTL.

There is no eviction for room: admission (services/stage/admission.py) reserves each session's KV to the end of
its budget of positions, so a live session between two steps (its next token is on its way through the other
stages) is never dropped mid-inspection; new sessions are refused instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionUsage:
    session_id: str
    last_used: float  # monotonic seconds
    nbytes: int
    busy: bool = False  # a step is queued or running on it now: never evicted


def choose_evictions(sessions: list[SessionUsage], now: float, ttl_s: float) -> list[tuple[str, str]]:
    """Returns (session_id, "ttl") pairs for sessions idle past the TTL; pure, so it is tested without a model."""
    return [(s.session_id, "ttl") for s in sessions if not s.busy and now - s.last_used > ttl_s]
