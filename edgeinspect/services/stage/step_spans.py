"""A stage's spans of the steps it runs (one SERVER span per traced SessionStep, a child of the span that sent it)
and the one log line per Forward stream (a stream is one inspection's session on this stage).

The gateway marks the steps it traces (SessionStep.trace_context); untraced steps cost one ContextVar lookup.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind

from edgeinspect import codec
from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.common.tracing import (
    REQUEST_ID_ATTR,
    SESSION_ATTR,
    context_from,
    fail,
    tracing_var,
)
from edgeinspect.v1 import stage_pb2

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
log = logging.getLogger(__name__)


class StreamTally:
    """What one Forward stream did, said in one log line when it ends (with the stream's request id)."""

    def __init__(self) -> None:
        self.steps = 0
        self.compute_ms = 0.0
        self.positions: dict[str, int] = {}  # session -> its cached length after the last step

    def add(self, outcomes: list, timing: stage_pb2.StageTiming) -> None:
        self.steps += 1
        self.compute_ms += timing.compute_ms
        for o in outcomes:
            self.positions[o.session_id] = o.length

    def log(self, stage: str) -> None:
        if not self.steps:
            return
        sessions = sorted(self.positions)
        log.info(
            "stream done: %d steps of %s, %.1f ms computing",
            self.steps,
            ", ".join(sessions),
            self.compute_ms,
            extra={
                "stage": stage,
                "session_ids": sessions,
                "steps": self.steps,
                "positions": max(self.positions.values(), default=0),
                "compute_ms": round(self.compute_ms, 3),
            },
        )


def _received(step: stage_pb2.SessionStep) -> tuple[int, int]:
    """(positions, codec bytes) of what the step brought: hidden states, or token ids and visual tokens."""
    if step.HasField("hidden"):
        return (step.hidden.shape[0] if step.hidden.shape else 0), codec.wire_nbytes(step.hidden)
    visual = codec.wire_nbytes(step.visual_tokens) if step.HasField("visual_tokens") else 0
    return len(step.input_ids), visual


def traced_run(run: F) -> F:
    """DecoderStageServicer._run(request, opened) -> (outcomes, timing): a span per traced step of the request."""

    @functools.wraps(run)
    async def wrapper(self, request: stage_pb2.StepRequest, *args: Any, **kwargs: Any) -> Any:
        tracing = tracing_var.get()
        traced = [s for s in request.steps if s.trace_context] if tracing is not None else []
        if tracing is None or not traced:
            return await run(self, request, *args, **kwargs)
        spans = []
        for step in traced:
            positions, nbytes = _received(step)
            spans.append(
                tracing.tracer.start_span(
                    "stage step",
                    context=context_from(step.trace_context),
                    kind=SpanKind.SERVER,
                    attributes={
                        REQUEST_ID_ATTR: request_id_var.get(),
                        SESSION_ATTR: step.session_id,
                        "edgeinspect.stage": self.name,
                        "edgeinspect.position": step.position,
                        "edgeinspect.positions": positions,
                        "edgeinspect.prefill_chunk": step.prefill_chunk,
                        "edgeinspect.codec_bytes_received": nbytes,
                        "edgeinspect.request_steps": len(request.steps),
                    },
                )
            )
        try:
            outcomes, timing = await run(self, request, *args, **kwargs)
        except BaseException as exc:
            for span in spans:
                fail(span, exc)
                span.end()
            raise
        by_session = {o.session_id: o for o in outcomes}
        for step, span in zip(traced, spans, strict=True):
            outcome = by_session.get(step.session_id)
            if outcome is not None:
                # the forward pass that finished this step: how many sessions it held
                span.set_attribute("edgeinspect.batch_size", outcome.batch_sessions)
                span.set_attribute("edgeinspect.cached_length", outcome.length)
            span.set_attribute("edgeinspect.compute_ms", timing.compute_ms)
            span.end()
        return outcomes, timing

    return wrapper  # type: ignore[return-value]
