"""The public API's input checks, once, at the edge: a request that passes is trusted by everything behind it.

Each check raises InvalidInput naming the field and the limit, which the error interceptor maps to INVALID_ARGUMENT.
"""

from __future__ import annotations

from edgeinspect.errors import InvalidInput
from edgeinspect.models.anomaly.bank import check_part
from edgeinspect.services.gateway.prompt import check_prompt
from edgeinspect.v1 import inspection_pb2

MAX_FIELD_CHARS = 128
MAX_NEW_TOKENS_LIMIT = 2048
MAX_TEACH_REPORTS = 200  # the vision node's default max_teach_frames: one Teach carries them all
# google.protobuf.Timestamp's valid range (years 1..9999): anything else breaks every reader of the report.
MIN_TS_SECONDS, MAX_TS_SECONDS = -62_135_596_800, 253_402_300_799


def check_inspect(req: inspection_pb2.InspectRequest) -> inspection_pb2.InspectRequest:
    """The request itself when every field lies within its limits; InvalidInput naming the first that does not."""
    if not req.image:
        raise InvalidInput("image is empty: send the encoded image file bytes (JPEG, PNG, ...)")
    check_prompt(req.prompt)
    for name in ("station", "part", "idempotency_key", "camera_id"):
        if len(getattr(req, name)) > MAX_FIELD_CHARS:
            raise InvalidInput(f"{name} is longer than {MAX_FIELD_CHARS} characters")
    if not 0 <= req.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise InvalidInput(f"max_new_tokens must lie in [0, {MAX_NEW_TOKENS_LIMIT}] (0 = server default)")
    time_arg(req, "capture_time")
    return req


def check_teach_from_reports(req: inspection_pb2.TeachFromReportsRequest) -> inspection_pb2.TeachFromReportsRequest:
    """Station and part named, last_n a bank's worth of frames; InvalidInput naming the field otherwise."""
    for name in ("station", "part"):
        value = getattr(req, name)
        if not value or len(value) > MAX_FIELD_CHARS:
            raise InvalidInput(f"{name} is required and at most {MAX_FIELD_CHARS} characters")
    if not 2 <= req.last_n <= MAX_TEACH_REPORTS:
        raise InvalidInput(f"last_n must lie in [2, {MAX_TEACH_REPORTS}]: a bank needs at least 2 good frames")
    return req


def check_promote_bank(req: inspection_pb2.PromoteBankRequest) -> inspection_pb2.PromoteBankRequest:
    """A valid part name and a version number (1 or more); InvalidInput naming the field otherwise."""
    check_part(req.part)
    if req.version <= 0:
        raise InvalidInput(f"version must be a published bank version (1 or more), got {req.version}")
    return req


def time_arg(request, name: str) -> int | None:
    """A Timestamp field as epoch microseconds (None when unset); InvalidInput outside Timestamp's range."""
    if not request.HasField(name):
        return None
    ts = getattr(request, name)
    if not MIN_TS_SECONDS <= ts.seconds <= MAX_TS_SECONDS or not 0 <= ts.nanos < 1_000_000_000:
        raise InvalidInput(
            f"{name} is not a valid timestamp: seconds must lie in years 1..9999 and nanos in [0, 999999999]"
        )
    return ts.seconds * 1_000_000 + ts.nanos // 1000
