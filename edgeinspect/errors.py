"""Typed errors that cross module boundaries. Each names the gRPC status it maps to (mapped in one place:
edgeinspect.services.common.errors), so core code (models/, rag/, codec) never imports grpc."""

from __future__ import annotations


class EdgeInspectError(Exception):
    """Base: `status` is the name of a grpc.StatusCode member."""

    status = "INTERNAL"
    # A stable, machine-readable reason a peer acts on (sent as trailing metadata `edgeinspect-error-code`), so
    # no peer ever has to match message text.
    code = ""


class InvalidInput(EdgeInspectError):
    status = "INVALID_ARGUMENT"


class CodecError(InvalidInput):
    """A tensor frame that does not decode to what the receiver expects."""


class PositionError(InvalidInput):
    """A step whose position does not continue the session's cache."""


class NotFound(EdgeInspectError):
    status = "NOT_FOUND"


class FailedPrecondition(EdgeInspectError):
    status = "FAILED_PRECONDITION"


class PrefixCacheMiss(FailedPrecondition):
    """A stage no longer holds the prompt prefix a session asked to start from: send the whole prompt."""

    code = "prefix_cache_miss"


class PeerMismatch(FailedPrecondition):
    """A peer that differs in protocol, checkpoint, tokenizer, layer range or codec."""


class Unauthenticated(EdgeInspectError):
    status = "UNAUTHENTICATED"


class PermissionDenied(EdgeInspectError):
    """A known caller (token or certificate role) asking for something its role may not do."""

    status = "PERMISSION_DENIED"


class ResourceExhausted(EdgeInspectError):
    """Something is full (KV budget, inspection slots); `retry_after_ms` goes to the caller as the gRPC retry
    pushback (trailing metadata `grpc-retry-pushback-ms`), so clients back off instead of retrying hot."""

    status = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_ms: int = 1000) -> None:
        super().__init__(message)
        self.retry_after_ms = max(0, int(retry_after_ms))


class DiskFull(ResourceExhausted):
    """A disk of the gateway is below its free-space floor (or out of space): new inspections wait until it is not."""

    code = "disk_full"


class OutboxFull(ResourceExhausted):
    """An output's queue for a station is full (its peer is down): that station's inspections wait until it drains."""

    code = "outbox_full"


class Unavailable(EdgeInspectError):
    """A peer or resource is down; `retry_after_ms` (when given) goes to the caller as retry pushback."""

    status = "UNAVAILABLE"

    def __init__(self, message: str = "", retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_ms = None if retry_after_ms is None else max(0, int(retry_after_ms))


class DeadlineExceeded(EdgeInspectError):
    """The inspection's deadline passed before it finished; the message names the hop that was running."""

    status = "DEADLINE_EXCEEDED"


class PlanInfeasible(EdgeInspectError):
    """The model does not fit the nodes' memory; the message names the shortfall."""

    status = "FAILED_PRECONDITION"


class CheckpointError(EdgeInspectError):
    """A checkpoint folder that is missing files or does not hold DeepSeek-VL weights."""

    status = "FAILED_PRECONDITION"
