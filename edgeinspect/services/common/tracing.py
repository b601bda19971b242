"""Traces across the roles (OpenTelemetry): one trace per inspection, W3C trace context from hop to hop.

A role sets tracing up at entry from its `tracing` settings (off by default). The trace context travels in gRPC
metadata beside the request id (context.outgoing_metadata adds `traceparent`) and, on the stages' Forward streams,
in each SessionStep's `trace_context`: a stream's metadata is sent once for the many steps of a session. A trace
started here takes the request id as its trace id (both are 128 bits), so the id in a log line finds the trace;
every span carries it as `edgeinspect.request_id` too.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from edgeinspect.config import TraceExporter, TracingConfig
from edgeinspect.services.common.context import request_id_var

REQUEST_ID_ATTR = "edgeinspect.request_id"
SESSION_ATTR = "edgeinspect.session_id"
# Calls that start a trace of their own; any other call is traced only when its caller's trace reached it
# (health probes, handshakes and the gateway's Stats polls would each be a trace of one span).
ROOT_METHODS = frozenset(
    {"/edgeinspect.v1.InspectionService/Inspect", "/edgeinspect.v1.InspectionService/InspectStream"}
)
# Statuses that mean the server failed (OpenTelemetry's gRPC conventions); the others are the caller's mistake.
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


@dataclass(frozen=True)
class Tracing:
    """A role's tracer and the settings its spans need; `shutdown` flushes what is not exported yet."""

    tracer: trace.Tracer
    provider: TracerProvider
    role: str
    decode_every: int

    def shutdown(self) -> None:
        self.provider.shutdown()


# Set once at role entry (run_role, before asyncio.run, so every task copies it); None: tracing is off.
tracing_var: ContextVar[Tracing | None] = ContextVar("tracing", default=None)


class RequestIdGenerator(RandomIdGenerator):
    """A new trace takes the current request id as its trace id when that is 32 hex digits (ours always are), so
    a log line's request id is its trace id; any other request id (a caller's own) gets a random trace id."""

    def generate_trace_id(self) -> int:
        rid = request_id_var.get()
        if len(rid) == 32:
            try:
                value = int(rid, 16)
            except ValueError:
                value = 0
            if value:
                return value
        return super().generate_trace_id()


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One span as a flat JSON-able record (ids in hex as W3C writes them)."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
        "span_id": f"{ctx.span_id:016x}" if ctx else None,
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "kind": span.kind.name,
        "start_unix_ns": span.start_time,
        "end_unix_ns": span.end_time,
        "status": span.status.status_code.name,
        "status_message": span.status.description,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "time_unix_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events
        ],
        "resource": dict(span.resource.attributes),
    }


class JsonlSpanExporter(SpanExporter):
    """Appends each span as one JSON line to a file (a box without a collector; `jq` reads it)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # O_APPEND and one write per batch: lines of several processes appending to one file do not interleave.
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(json.dumps(span_record(s), separators=(",", ":"), default=str) + "\n" for s in spans).encode()
        with self._lock:
            if self._fd is None:
                return SpanExportResult.FAILURE
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def jsonl_path(template: Path, role: str) -> Path:
    """The JSONL file of this process: `{role}` and `{pid}` in the configured path filled in."""
    return Path(str(template).format(role=role, pid=os.getpid()))


def setup_tracing(cfg: TracingConfig, role: str) -> Tracing | None:
    """The role's tracer from its settings, or None when tracing is off (the exporter is `none`)."""
    if cfg.exporter is TraceExporter.none:
        return None
    resource = Resource.create(
        {
            "service.name": f"edgeinspect-{role}",
            "service.namespace": "edgeinspect",
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
            "edgeinspect.role": role,
        }
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(cfg.sample_rate)), id_generator=RequestIdGenerator()
    )
    if cfg.exporter is TraceExporter.jsonl:
        # Written as each span ends: a local file costs microseconds, and a role ended by SIGKILL loses nothing.
        provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(jsonl_path(cfg.jsonl_path, role))))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.endpoint)))
    return Tracing(provider.get_tracer("edgeinspect"), provider, role, cfg.decode_every)


def current_trace_id() -> str | None:
    """The current span's trace id in hex (log lines carry it), or None outside a recorded span."""
    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


# -- trace context in and out ----------------------------------------------------------------------------------------


def inject_into(carrier: MutableMapping[str, str], span: Span) -> None:
    """Writes `span`'s W3C trace context into `carrier` (a SessionStep's trace_context map), replacing any."""
    carrier.clear()
    propagate.inject(carrier, context=trace.set_span_in_context(span))


def context_from(carrier: Iterable[tuple[str, str | bytes]] | MutableMapping[str, str]) -> otel_context.Context:
    """The trace context a caller sent (gRPC metadata pairs or a trace_context map); empty when none."""
    pairs = carrier.items() if isinstance(carrier, MutableMapping) else carrier
    return propagate.extract({k: v for k, v in pairs if isinstance(v, str)})


def has_parent(ctx: otel_context.Context) -> bool:
    return trace.get_current_span(ctx).get_span_context().is_valid


class ServerSpan:
    """The span of one inbound RPC, current while its handler runs (opened and closed by the server interceptor)."""

    def __init__(self, span: Span, token: Token[otel_context.Context]) -> None:
        self.span = span
        self._token = token

    def end(self, code: grpc.StatusCode | None, exc: BaseException | None) -> None:
        if code is not None:
            self.span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code in SERVER_ERRORS:
                self.span.set_status(Status(StatusCode.ERROR, code.name))
        if exc is not None and not isinstance(exc, grpc.aio.AbortError):
            self.span.record_exception(exc)
        otel_context.detach(self._token)
        self.span.end()


def server_span(method: str, metadata: Iterable[tuple[str, str | bytes]] | None, role: str) -> ServerSpan | None:
    """Starts the span of an inbound call to `method` ("/pkg.Service/Method"): a child of the caller's span when
    its metadata carries one, a new trace for the public inspection calls, else nothing (None)."""
    tracing = tracing_var.get()
    if tracing is None:
        return None
    parent = context_from(metadata or ())
    if not has_parent(parent) and method not in ROOT_METHODS:
        return None
    service, _, short = method.rpartition("/")
    span = tracing.tracer.start_span(
        f"{service.lstrip('/')}/{short}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": service.lstrip("/"),
            "rpc.method": short,
            "edgeinspect.role": role,
            REQUEST_ID_ATTR: request_id_var.get(),
        },
    )
    return ServerSpan(span, otel_context.attach(trace.set_span_in_context(span, parent)))


@contextlib.contextmanager
def client_span(name: str, attributes: dict[str, Any] | None = None) -> Iterator[Span | None]:
    """A CLIENT span, current for the calls made inside (their metadata carries it); None when tracing is off.
    An exception leaving it marks the span failed."""
    tracing = tracing_var.get()
    if tracing is None:
        yield None
        return
    attrs = {REQUEST_ID_ATTR: request_id_var.get(), **(attributes or {})}
    with tracing.tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attrs) as span:
        yield span


def annotate(attributes: dict[str, Any]) -> None:
    """Adds attributes to the current span (the call's server span, say) when it is recorded."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def fail(span: Span, exc: BaseException) -> None:
    """Marks a span failed with what ended it (a cancelled step is not an exception worth a stack trace)."""
    span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
    if isinstance(exc, Exception):
        span.record_exception(exc)
