"""Bounded: admission control with pushback, the inspection's deadline on every hop, input limits from the model.

Real processes (vision, 2 stages, gateway) on loopback; overload is 64 concurrent callers, a stopped stage is
SIGSTOP, each bad input is followed by a good request that succeeds.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, stage_pb2, stage_pb2_grpc

LIMITS = {"EDGEINSPECT_MAX_INFLIGHT": "8", "EDGEINSPECT_MAX_QUEUED": "8", "EDGEINSPECT_TOKEN_BURST": "500"}


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory):
    opts = StackOptions(
        workdir=tmp_path_factory.mktemp("limits"),
        checkpoint=tiny_checkpoint,
        stages=2,
        extra_env=LIMITS | {"EDGEINSPECT_STRUCTURED_OUTPUT": "false", "EDGEINSPECT_REPLAN": "false"},
    )
    with LocalStack(opts) as s:
        yield s


@pytest.fixture(scope="module")
def stub(stack):
    with grpc.insecure_channel(stack.gateway_address) as channel:
        yield inspection_pb2_grpc.InspectionServiceStub(channel)


def md(stack):
    return [("authorization", f"Bearer {stack.api_token}")]


def request(**kw) -> inspection_pb2.InspectRequest:
    kw.setdefault("image", asset_path("part_ok.jpg").read_bytes())
    kw.setdefault("idempotency_key", uuid.uuid4().hex)
    return inspection_pb2.InspectRequest(**kw)


def good(stack, stub) -> None:
    assert stub.Inspect(request(max_new_tokens=4), metadata=md(stack), timeout=120).report_id


def test_overload_is_refused_at_once_with_pushback_and_every_admitted_one_finishes(stack, stub):
    outcomes: list = []
    lock = threading.Lock()

    def call() -> None:
        t0 = time.monotonic()
        try:
            report = stub.Inspect(request(max_new_tokens=24), metadata=md(stack), timeout=300)
            outcome = ("ok", report, time.monotonic() - t0, ())
        except grpc.RpcError as err:
            outcome = (err.code(), err.details(), time.monotonic() - t0, err.trailing_metadata() or ())
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=call) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(outcomes) == 64
    refused = [o for o in outcomes if o[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    admitted = [o for o in outcomes if o[0] == "ok"]
    assert len(refused) + len(admitted) == 64, [o[:2] for o in outcomes if o not in refused and o not in admitted]
    assert len(refused) >= 16 and len(admitted) >= 16  # 8 running + 8 waiting at the peak, the rest refused
    for _, details, seconds, trailing in refused:
        assert "at capacity" in details and seconds < 5.0
        assert any(k == "grpc-retry-pushback-ms" and int(v) > 0 for k, v in trailing)
    # No stage dropped a live session to make room.
    for k in range(2):
        with grpc.insecure_channel(stack.address_of(f"stage{k}")) as ch:
            stats = stage_pb2_grpc.DecoderStageStub(ch).Stats(stage_pb2.StatsRequest(), timeout=10)
        assert stats.evicted_budget == 0
    good(stack, stub)


def test_a_prompt_beyond_the_model_context_is_refused_naming_both_numbers(stack, stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.Inspect(request(prompt="\U0001f600" * 2000), metadata=md(stack), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "context holds 4096" in err.value.details() and "positions" in err.value.details()
    good(stack, stub)


@pytest.mark.parametrize(("seconds", "nanos"), [(2**62, 0), (-(2**62), 0), (0, -1)])
def test_a_capture_time_out_of_range_is_refused(stack, stub, seconds, nanos):
    req = request()
    req.capture_time.seconds, req.capture_time.nanos = seconds, nanos
    with pytest.raises(grpc.RpcError) as err:
        stub.Inspect(req, metadata=md(stack), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "capture_time" in err.value.details()
    good(stack, stub)


def test_a_stopped_stage_releases_the_caller_by_the_deadline(stack, stub):
    stage = stack.role("stage1")
    good(stack, stub)
    os.kill(stage.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Inspect(request(max_new_tokens=16), metadata=md(stack), timeout=4.0)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(stage.pid, signal.SIGCONT)
    assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    assert elapsed < 4.5  # never held past its deadline
    deadline = time.monotonic() + 30
    while True:  # the stage is banned after the stall and readmitted once it answers again
        try:
            good(stack, stub)
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline
            time.sleep(0.5)
