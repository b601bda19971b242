"""The gateway's spans of stage steps (services/gateway/decode/pipeline.py RouteSession wears these decorators), and the
attributes the servicer puts on an inspection's span.

A prefill is one span, every `decode_every`-th decode step of a session is one; inside either, each message to a
stage (a prompt chunk or a step) is a CLIENT span from its write to that stage's answer, and its context travels
in the message (SessionStep.trace_context), so the stage's span of the same step is its child. Untraced decode
steps send no trace context, and the stages trace nothing for them. With tracing off every wrapper is one
ContextVar lookup.
"""

from __future__ import annotations

import functools
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry.trace import Span, SpanKind

from edgeinspect import codec
from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.common.tracing import (
    REQUEST_ID_ATTR,
    SESSION_ATTR,
    annotate,
    fail,
    inject_into,
    tracing_var,
)
from edgeinspect.v1 import inspection_pb2, stage_pb2, tensor_pb2

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# True inside a traced prefill or decode step: its messages to the stages get client spans.
_traced_step: ContextVar[bool] = ContextVar("traced_step", default=False)


class StepSpans:
    """One RouteSession's open client spans, per callee in send order (a Forward stream answers in order), and
    its count of decode steps (which of them are traced)."""

    def __init__(self) -> None:
        self.open: defaultdict[int, deque[Span]] = defaultdict(deque)
        self.decode_steps = 0

    def fail_open(self, k: int, exc: BaseException) -> None:
        """Stage k's stream failed: every message still waiting for its answer failed with it."""
        queue = self.open.pop(k, deque())
        for span in queue:
            fail(span, exc)
            span.end()


def _rows(frame: tensor_pb2.TensorFrame) -> int:
    return frame.shape[0] if frame.shape else 0


def _sent_frame(step: stage_pb2.SessionStep) -> tensor_pb2.TensorFrame | None:
    for name in ("hidden", "visual_tokens"):
        if step.HasField(name):
            return getattr(step, name)
    return None


def traced_write(write: F) -> F:
    """RouteSession._write(k, request): a CLIENT span per traced message, its context stamped into the step."""

    @functools.wraps(write)
    async def wrapper(self, k: int, request: stage_pb2.StepRequest, *args: Any, **kwargs: Any) -> Any:
        tracing = tracing_var.get()
        if tracing is None or not _traced_step.get() or not request.steps:
            return await write(self, k, request, *args, **kwargs)
        step = request.steps[0]
        frame = _sent_frame(step)
        ep = self.route[k]
        span = tracing.tracer.start_span(
            "stage forward",
            kind=SpanKind.CLIENT,
            attributes={
                REQUEST_ID_ATTR: request_id_var.get(),
                SESSION_ATTR: step.session_id,
                "edgeinspect.stage": f"stage{ep.name}",  # as the stage names itself
                "edgeinspect.stage_address": ep.address,
                "edgeinspect.position": step.position,
                "edgeinspect.positions": len(step.input_ids) or (_rows(step.hidden) if step.HasField("hidden") else 0),
                "edgeinspect.prefill_chunk": step.prefill_chunk,
                "edgeinspect.batch_size": len(request.steps),
                "edgeinspect.codec_bytes_sent": codec.wire_nbytes(frame) if frame is not None else 0,
            },
        )
        inject_into(step.trace_context, span)
        self.spans.open[k].append(span)
        try:
            return await write(self, k, request, *args, **kwargs)
        except BaseException as exc:
            self.spans.fail_open(k, exc)
            raise

    return wrapper  # type: ignore[return-value]


def traced_read(read: F) -> F:
    """RouteSession._read(k, ...): ends the oldest open client span of stage k with what the stage answered."""

    @functools.wraps(read)
    async def wrapper(self, k: int, *args: Any, **kwargs: Any) -> Any:
        queue = self.spans.open.get(k)
        if not queue:
            return await read(self, k, *args, **kwargs)
        try:
            response = await read(self, k, *args, **kwargs)
        except BaseException as exc:
            self.spans.fail_open(k, exc)
            raise
        span = queue.popleft()
        if response.results:
            result = response.results[0]
            received = codec.wire_nbytes(result.hidden) if result.HasField("hidden") else 0
            span.set_attribute("edgeinspect.codec_bytes_received", received)
            span.set_attribute("edgeinspect.token_id", result.token_id)
        span.set_attribute("edgeinspect.compute_ms", sum(t.compute_ms for t in response.timings))
        span.end()
        return response

    return wrapper  # type: ignore[return-value]


async def _step_span(tracing, name: str, attrs: dict, call: Awaitable[Any]) -> Any:
    """Runs a prefill or decode step under its span (its stage messages become children; nested steps, as a prompt
    sent whole, are not traced again) and records what the step sampled."""
    with tracing.tracer.start_as_current_span(name, attributes=attrs) as span:
        token = _traced_step.set(True)
        try:
            result = await call
        finally:
            _traced_step.reset(token)
        span.set_attribute("edgeinspect.token_id", result.token_id)
        span.set_attribute("edgeinspect.wire_ms", result.wire_ms)
        return result


def traced_step(step: F) -> F:
    """RouteSession.step: a span for every decode_every-th decode step (a prompt sent whole is its prefill's)."""

    @functools.wraps(step)
    async def wrapper(self, input_ids: list[int], *args: Any, **kwargs: Any) -> Any:
        tracing = tracing_var.get()
        if tracing is None or _traced_step.get():
            return await step(self, input_ids, *args, **kwargs)
        index = self.spans.decode_steps
        self.spans.decode_steps += 1
        if index % tracing.decode_every:
            return await step(self, input_ids, *args, **kwargs)
        attrs = {
            REQUEST_ID_ATTR: request_id_var.get(),
            SESSION_ATTR: self.session_id,
            "edgeinspect.position": self.position,
            "edgeinspect.positions": len(input_ids),
            "edgeinspect.decode_step": index,
        }
        return await _step_span(tracing, "decode step", attrs, step(self, input_ids, *args, **kwargs))

    return wrapper  # type: ignore[return-value]


def annotate_request(request) -> None:
    """The inspection's server span names what was asked (station, part, camera)."""
    asked = {"station": request.station, "part": request.part, "camera_id": request.camera_id}
    annotate({f"edgeinspect.{key}": value for key, value in asked.items()})


def annotate_report(report) -> None:
    """... and what came of it: the report id and verdict join the trace to the stored report."""
    verdict = inspection_pb2.Verdict.Name(report.verdict).removeprefix("VERDICT_")
    annotate({"edgeinspect.report_id": report.report_id, "edgeinspect.verdict": verdict})


def traced_prefill(prefill: F) -> F:
    """RouteSession.prefill(chunks, ...): one span over the prompt; each chunk's messages are its children."""

    @functools.wraps(prefill)
    async def wrapper(self, chunks: list, *args: Any, **kwargs: Any) -> Any:
        tracing = tracing_var.get()
        if tracing is None:
            return await prefill(self, chunks, *args, **kwargs)
        attrs = {
            REQUEST_ID_ATTR: request_id_var.get(),
            SESSION_ATTR: self.session_id,
            "edgeinspect.position": self.position,
            "edgeinspect.positions": sum(len(ids) for ids, _ in chunks),
            "edgeinspect.chunks": len(chunks),
            "edgeinspect.route": [ep.name for ep in self.route],
        }
        return await _step_span(tracing, "prefill", attrs, prefill(self, chunks, *args, **kwargs))

    return wrapper  # type: ignore[return-value]
