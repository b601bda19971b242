"""Per-request context that travels with a call: the request id and the caller's deadline.

The server interceptor sets both ContextVars for the task that runs a handler; the client interceptor
(edgeinspect.services.common.channel) reads them, so a request id and a deadline flow hop to hop without any
servicer passing them along by hand.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from contextvars import ContextVar

import grpc
from opentelemetry import propagate

REQUEST_ID_KEY = "x-request-id"

request_id_var: ContextVar[str] = ContextVar("request_id", default="")
# Absolute time.monotonic() by which the inbound call must finish; None when the caller set no deadline.
deadline_var: ContextVar[float | None] = ContextVar("deadline", default=None)


def new_request_id() -> str:
    """A fresh request id (32 hex characters)."""
    return uuid.uuid4().hex


def request_id_from(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The x-request-id value in `metadata`, or None when absent or empty."""
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY and value:
            return value.decode("ascii", "replace") if isinstance(value, bytes) else value
    return None


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """Metadata every outgoing call carries: the current request id (if any) and the current span's W3C trace
    context (traceparent; none while tracing is off, services/common/tracing.py)."""
    rid = request_id_var.get()
    trace_context: dict[str, str] = {}
    propagate.inject(trace_context)
    return (((REQUEST_ID_KEY, rid),) if rid else ()) + tuple(trace_context.items())


def deadline_remaining() -> float | None:
    """Seconds left before the inbound call's deadline (>= 0), or None when there is none."""
    deadline = deadline_var.get()
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def remaining_timeout(context: grpc.aio.ServicerContext | None, default: float | None) -> float | None:
    """Timeout for a downstream call: what is left of the inbound deadline, capped by `default`.

    With no inbound deadline (or no context) this is `default`; an exhausted deadline gives 0.0, which makes
    the downstream call fail fast with DEADLINE_EXCEEDED instead of running past the caller's patience.
    """
    left = context.time_remaining() if context is not None else None
    if left is None:
        return default
    left = max(0.0, left)
    return left if default is None else min(left, default)
