"""The one place where exceptions become gRPC status codes (edgeinspect.errors types name theirs)."""

from __future__ import annotations

import errno
import logging
import re
from typing import NoReturn

import grpc

from edgeinspect.errors import EdgeInspectError
from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.common.redact import cite, redact, upstream_message

logger = logging.getLogger(__name__)

# Set on an AioRpcError by the client interceptor: the address of the server that answered with it.
PEER_ATTR = "edgeinspect_peer"

_ADDRESS_IN_DEBUG = re.compile(r"(ipv[46]:[^\s,\"]+)")

# Status details sent to callers are cut to this many characters: a 1 MB id echoed into a message must not exceed
# a client's trailer limit (which turns the answer into an unreadable transport error).
MAX_DETAILS_CHARS = 300
# The gRPC retry convention: how long a client should wait before retrying (ms, decimal string).
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
ERROR_CODE_KEY = "edgeinspect-error-code"  # EdgeInspectError.code: what a peer acts on, never the message text
DISK_FULL_PUSHBACK_MS = 10_000  # a write that found its disk full: space returns by pruning or a person, not at once
_SQLITE_FULL = 13  # sqlite3.OperationalError.sqlite_errorcode of "database or disk is full"
_PG_DISK_FULL = "53100"  # PostgreSQL's SQLSTATE disk_full


def disk_full(exc: BaseException) -> bool:
    """A write that ran out of space (a file, SQLite or PostgreSQL): the caller retries later, nothing is broken."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL or getattr(exc, "sqlstate", None) == _PG_DISK_FULL


def bounded(details: str, limit: int = MAX_DETAILS_CHARS) -> str:
    """`details` cut to `limit` characters, saying how much was cut."""
    if len(details) <= limit:
        return details
    tail = f" ... (cut; {len(details)} characters in all)"
    return details[: limit - len(tail)] + tail


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code a failed RPC reports for `exc`."""
    if isinstance(exc, EdgeInspectError):
        return getattr(grpc.StatusCode, exc.status, grpc.StatusCode.INTERNAL)
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if disk_full(exc):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INTERNAL


def error_code_of(exc: grpc.aio.AioRpcError) -> str:
    """The typed reason (EdgeInspectError.code) a peer sent with its error, or ""."""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_CODE_KEY:
            return value.decode() if isinstance(value, bytes) else value
    return ""


def upstream_peer(exc: grpc.aio.AioRpcError) -> str:
    """Which server an upstream error came from: tagged by our channel, else parsed from the debug string."""
    tagged = getattr(exc, PEER_ATTR, None)
    if tagged:
        return tagged
    match = _ADDRESS_IN_DEBUG.search(exc.debug_error_string() or "")
    return match.group(1) if match else "upstream"


def log_details_for(exc: BaseException) -> str:
    """Everything known about a failure, for the log only (addresses, the upstream peer)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{upstream_peer(exc)}: {exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def details_for(exc: BaseException) -> str:
    """Status details a person can act on; never addresses, ports, paths or exception classes (those go to
    the log under the request id, which a message that left something out cites)."""
    rid = request_id_var.get()
    if isinstance(exc, EdgeInspectError):
        text = str(exc)
        if not text:
            return cite(f"request failed ({exc.status.lower().replace('_', ' ')})", rid)
        clean = redact(text)
        return clean if clean == text else cite(clean, rid)
    if isinstance(exc, grpc.aio.AioRpcError):
        text = exc.details() or ""
        clean = upstream_message(exc.code(), text)
        return clean if clean == text else cite(clean, rid)
    if isinstance(exc, TimeoutError):
        return cite("timed out waiting for an upstream step", rid)
    if disk_full(exc):
        return cite("a disk of the gateway is full: the inspection was not stored; retry later", rid)
    return f"internal error; see the server log for request id {rid}" if rid else "internal error; see server log"


async def abort_with(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """Ends the RPC with the status for `exc`; logs unexpected exceptions with their traceback."""
    code = status_for(exc)
    details = bounded(details_for(exc))
    # abort's trailing_metadata replaces what the call set before (the request id): keep both
    extra = []
    pushback = getattr(exc, "retry_after_ms", None)
    if pushback is None and disk_full(exc):
        pushback = DISK_FULL_PUSHBACK_MS
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE) and pushback is not None:
        extra.append((RETRY_PUSHBACK_KEY, str(pushback)))
    if isinstance(exc, EdgeInspectError) and exc.code:
        extra.append((ERROR_CODE_KEY, exc.code))
    if extra:
        context.set_trailing_metadata((*(context.trailing_metadata() or ()), *extra))
    if code is grpc.StatusCode.INTERNAL and not isinstance(exc, EdgeInspectError | grpc.aio.AioRpcError):
        logger.error("unhandled %s in handler", type(exc).__name__, exc_info=exc)
    else:
        logger.info("rpc failed: %s %s [%s]", code.name, details, log_details_for(exc))
    await context.abort(code, details)
