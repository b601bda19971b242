"""Exception -> status mapping (the one place) and deadline arithmetic for downstream calls."""

from __future__ import annotations

import grpc
import pytest

from edgeinspect import errors
from edgeinspect.services.common.context import remaining_timeout, request_id_var
from edgeinspect.services.common.errors import details_for, status_for


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.InvalidInput("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.CodecError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.PositionError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (errors.PeerMismatch("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.PlanInfeasible("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.CheckpointError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.Unauthenticated("x"), grpc.StatusCode.UNAUTHENTICATED),
        (errors.ResourceExhausted("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Unavailable("x"), grpc.StatusCode.UNAVAILABLE),
        (TimeoutError(), grpc.StatusCode.DEADLINE_EXCEEDED),
        (ZeroDivisionError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_each_error_type_maps_to_its_status(exc, code):
    assert status_for(exc) is code


def test_our_errors_keep_their_message_as_details():
    assert details_for(errors.CodecError("frame shape [2, 3] != expected [2, 4]")) == (
        "frame shape [2, 3] != expected [2, 4]"
    )


def test_unexpected_errors_say_nothing_about_internals_but_name_the_request():
    token = request_id_var.set("abc123")
    try:
        details = details_for(RuntimeError("/etc/secret path in message"))
    finally:
        request_id_var.reset(token)
    assert "secret" not in details
    assert "abc123" in details


class Deadline:
    """A grpc ServicerContext reduced to time_remaining (grpc's object, not one of ours)."""

    def __init__(self, left: float | None) -> None:
        self.left = left

    def time_remaining(self) -> float | None:
        return self.left


@pytest.mark.parametrize(
    ("left", "default", "expected"),
    [(None, 5.0, 5.0), (None, None, None), (2.0, 5.0, 2.0), (9.0, 5.0, 5.0), (-1.0, 5.0, 0.0), (3.0, None, 3.0)],
)
def test_remaining_timeout_never_outlives_the_inbound_deadline(left, default, expected):
    assert remaining_timeout(Deadline(left), default) == expected
