"""Typed errors that cross module boundaries. Each names the gRPC status it maps to (mapped in one place:
edgeinspect.services.common.errors), so core code (models/, rag/, codec) never imports grpc."""

from __future__ import annotations


class EdgeInspectError(Exception):
    """Base: `status` is the name of a grpc.StatusCode member."""

    status = "INTERNAL"


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


class Unavailable(EdgeInspectError):
    status = "UNAVAILABLE"


class PlanInfeasible(EdgeInspectError):
    """The model does not fit the nodes' memory; the message names the shortfall."""

    status = "FAILED_PRECONDITION"


class CheckpointError(EdgeInspectError):
    """A checkpoint folder that is missing files or does not hold DeepSeek-VL weights."""

    status = "FAILED_PRECONDITION"
