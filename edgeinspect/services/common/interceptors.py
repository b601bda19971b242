"""Server interceptors: request id + deadline context, metrics, the error policy (bearer tokens: auth.py), and the
request-body check that runs after every caller check.

Order (start_server): ServerInterceptor outermost (context, metrics, status for every outcome), then the caller
checks (certificate roles: tls.py; tokens: auth.py), then RequestCheck innermost. grpc parses a unary request
before any handler code runs, so parsing is made tolerant and its verdict is delivered by RequestCheck: a caller
without a valid token or role learns UNAUTHENTICATED / PERMISSION_DENIED, never how the parser read its bytes.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from edgeinspect.errors import InvalidInput
from edgeinspect.services.common.context import (
    REQUEST_ID_KEY,
    deadline_var,
    new_request_id,
    request_id_from,
    request_id_var,
)
from edgeinspect.services.common.errors import abort_with
from edgeinspect.services.common.metrics import RPC_LATENCY, RPC_REQUESTS
from edgeinspect.services.common.tracing import server_span

logger = logging.getLogger(__name__)

# Probes and tooling need no token or caller role (orchestrators, grpcurl list); over mTLS they still need a
# certificate from the plant CA to complete the handshake.
AUTH_EXEMPT_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
_FACTORIES = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _kind(handler: grpc.RpcMethodHandler) -> str:
    return next(kind for kind in _KINDS if getattr(handler, kind) is not None)


def _rebuild(
    handler: grpc.RpcMethodHandler, behavior: Callable[..., Any], deserializer: Callable[[bytes], Any] | None = None
) -> grpc.RpcMethodHandler:
    return _FACTORIES[_kind(handler)](
        behavior,
        request_deserializer=deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class _Malformed:
    """What the tolerant deserializer hands on for bytes that do not parse; the wrapped handler refuses it."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that never raises. grpc answers a raising one with UNKNOWN and the exception's text; the
    caller sent bad bytes, so the handler wrapper answers INVALID_ARGUMENT naming the expected message instead."""
    if deserializer is None:
        return None
    name = getattr(getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None), "full_name", "request")

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # noqa: BLE001 (DecodeError, RecursionError of deep nesting, ...: all the caller's bytes)
            return _Malformed(f"the request is not a valid {name} message")

    return parse


def _checked(request: Any) -> Any:
    if isinstance(request, _Malformed):
        raise InvalidInput(request.message)
    return request


class _CheckedRequests:
    """A request stream that raises InvalidInput at a malformed message (a class, not an async generator: an
    unfinished generator is closed late by the garbage collector, from whichever task happens to run then)."""

    def __init__(self, requests: Any) -> None:
        self._requests = requests.__aiter__()

    def __aiter__(self) -> _CheckedRequests:
        return self

    async def __anext__(self) -> Any:
        return _checked(await self._requests.__anext__())


class _CallScope:
    """What ServerInterceptor does around one call: context vars in, metrics and status out."""

    def __init__(self, role: str, method: str, context: grpc.aio.ServicerContext) -> None:
        self.role, self.method, self.context = role, method, context
        self.code = grpc.StatusCode.OK

    def __enter__(self) -> _CallScope:
        rid = request_id_from(self.context.invocation_metadata()) or new_request_id()
        self._rid_token = request_id_var.set(rid)
        left = self.context.time_remaining()
        self._deadline_token = deadline_var.set(None if left is None else time.monotonic() + left)
        # The caller (or grpcurl) learns the id to grep the logs for.
        self.context.set_trailing_metadata(((REQUEST_ID_KEY, rid),))
        self._span = server_span(self.method, self.context.invocation_metadata(), self.role)
        self._start = time.perf_counter()
        return self

    async def fail(self, exc: BaseException) -> None:
        if isinstance(exc, grpc.aio.AbortError):  # the handler chose its status itself
            raise exc
        await abort_with(self.context, exc)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        elapsed = time.perf_counter() - self._start
        code = self.context.code()
        if code is None:
            code = grpc.StatusCode.CANCELLED if exc is not None else grpc.StatusCode.OK
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        service, _, short = self.method.rpartition("/")  # "/pkg.Service/Method" -> "pkg.Service", "Method"
        RPC_REQUESTS.labels(self.role, service.lstrip("/"), short, name).inc()
        RPC_LATENCY.labels(self.role, service.lstrip("/"), short).observe(elapsed)
        logger.debug("rpc %s %s in %.1f ms", self.method, name, elapsed * 1e3)
        if self._span is not None:
            self._span.end(code if isinstance(code, grpc.StatusCode) else None, exc)
        request_id_var.reset(self._rid_token)
        deadline_var.reset(self._deadline_token)


class RequestCheck(grpc.aio.ServerInterceptor):
    """Innermost: parses requests tolerantly and refuses a malformed one (INVALID_ARGUMENT) only once the caller
    checks outside it have passed."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        kind = _kind(handler)
        behavior = getattr(handler, kind)
        check = _CheckedRequests if kind.startswith("stream") else _checked
        if inspect.isasyncgenfunction(behavior):

            async def checked_stream(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                async for response in behavior(check(request_or_iterator), context):
                    yield response

            return _rebuild(handler, checked_stream, _tolerant(handler.request_deserializer))

        async def checked(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            result = behavior(check(request_or_iterator), context)
            return await result if inspect.isawaitable(result) else result

        return _rebuild(handler, checked, _tolerant(handler.request_deserializer))


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Per RPC: sets request id + deadline ContextVars, counts and times it, maps exceptions to status."""

    def __init__(self, role: str) -> None:
        self._role = role

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return _rebuild(handler, self._wrap(getattr(handler, _kind(handler)), handler_call_details.method))

    def _wrap(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        role = self._role
        if inspect.isasyncgenfunction(behavior):

            async def wrapped_stream(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                with _CallScope(role, method, context) as scope:
                    try:
                        async for response in behavior(request_or_iterator, context):
                            yield response
                    except Exception as exc:
                        await scope.fail(exc)

            return wrapped_stream

        async def wrapped(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            with _CallScope(role, method, context) as scope:
                try:
                    result = behavior(request_or_iterator, context)
                    return await result if inspect.isawaitable(result) else result
                except Exception as exc:
                    await scope.fail(exc)

        return wrapped
