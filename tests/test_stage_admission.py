"""KV admission: a stage reserves each new session's KV to the end of its budget of positions and refuses a new
session the budget cannot hold (RESOURCE_EXHAUSTED, what is full, retry pushback) instead of evicting live
sessions mid-inspection. The stage's own gRPC server on 127.0.0.1:0, driven through real Forward streams."""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

from edgeinspect.config import ServerConfig
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.errors import RETRY_PUSHBACK_KEY
from edgeinspect.services.stage.admission import human_bytes, refusal, reservation_bytes
from edgeinspect.services.stage.server import start
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.v1 import stage_pb2, stage_pb2_grpc

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]


def test_a_reservation_is_the_whole_budget_of_positions_as_the_buffer_allocates_it():
    assert reservation_bytes(256, 8, 10) == 256 * 10
    assert reservation_bytes(200, 8, 10) == 256 * 10  # rounded up to the buffer's 64-position steps
    assert reservation_bytes(0, 8, 10) == 64 * 10  # unknown budget: the first step only
    assert reservation_bytes(10, 100, 10) == 128 * 10  # a first step longer than the budget claims counts


def test_refusal_says_what_is_full_and_what_the_session_needs():
    assert refusal(400, {"a": 300, "b": 300}, 1000) is None
    why = refusal(500, {"a": 300, "b": 300}, 1000)
    assert why == "KV budget full: 600 B of 1000 B reserved by 2 live sessions; this session needs 500 B"
    assert "more than the whole budget" in refusal(2 << 20, {}, 1 << 20)
    assert human_bytes(int(1.9 * (1 << 30))) == "1.9 GB" and human_bytes(40 << 20) == "40.0 MB"


@pytest.fixture
async def stage(tiny_checkpoint):
    cfg = StageSettings(
        checkpoint=tiny_checkpoint,
        layer_start=0,
        layer_end=5,
        kv_budget_mb=1,
        batch_window_ms=0,
        server=ServerConfig(host="127.0.0.1", port=0),
        log_json=False,
    )
    running, backend = await start(cfg)
    channel = make_channel(f"127.0.0.1:{running.port}")
    yield stage_pb2_grpc.DecoderStageStub(channel), backend
    await channel.close()
    await running.stop(0)


def _first(session_id: str, max_positions: int) -> stage_pb2.StepRequest:
    step = stage_pb2.SessionStep(session_id=session_id, position=0, input_ids=PROMPT, max_positions=max_positions)
    return stage_pb2.StepRequest(steps=[step])


def _next(session_id: str, position: int, token: int) -> stage_pb2.StepRequest:
    return stage_pb2.StepRequest(
        steps=[stage_pb2.SessionStep(session_id=session_id, position=position, input_ids=[token])]
    )


async def test_a_full_kv_budget_refuses_new_sessions_while_every_live_one_runs_to_its_end(stage):
    stub, backend = stage
    bpp = backend.limits.kv_bytes_per_position
    budget = 1 << 20
    positions = 256  # three sessions of 256 positions fit 1 MB at this stage's bytes per position, four do not
    need = positions * bpp
    assert 3 * need <= budget < 4 * need

    live = [stub.Forward(timeout=120) for _ in range(3)]
    tokens = []
    for k, call in enumerate(live):
        await call.write(_first(f"live-{k}", positions))
        tokens.append((await call.read()).results[0].token_id)
    stats = await stub.Stats(stage_pb2.StatsRequest(), timeout=10)
    assert stats.sessions == 3 and stats.kv_reserved_bytes == 3 * need

    # A fourth session is refused at once, saying what is full; nothing of it is kept.
    refused = stub.Forward(timeout=30)
    await refused.write(_first("late", positions))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await refused.read()
    err = info.value
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert re.fullmatch(
        r"KV budget full: 9\d\d\.\d KB of 1\.0 MB reserved by 3 live sessions; this session needs \d+\.\d KB",
        err.details(),
    ), err.details()
    assert int(dict(err.trailing_metadata())[RETRY_PUSHBACK_KEY]) > 0

    # Every live session decodes to the very end of its budget of positions: none is evicted for room.
    async def decode(k: int, call, token: int) -> int:
        position = len(PROMPT)
        while position < positions:
            await call.write(_next(f"live-{k}", position, token))
            result = (await call.read()).results[0]
            position, token = result.cached_length, result.token_id
        await call.done_writing()
        return position

    ends = await asyncio.gather(*(decode(k, call, t) for k, (call, t) in enumerate(zip(live, tokens, strict=True))))
    assert ends == [positions] * 3
    stats = await stub.Stats(stage_pb2.StatsRequest(), timeout=10)
    assert stats.evicted_budget == 0 and stats.evicted_ttl == 0 and stats.refused_sessions == 1
    assert stats.kv_bytes <= budget  # the reservation was allocated once: no buffer grew past it

    # Once the streams end their sessions are released, and the refused session is admitted on retry.
    for _ in range(100):
        stats = await stub.Stats(stage_pb2.StatsRequest(), timeout=10)
        if stats.sessions == 0:
            break
        await asyncio.sleep(0.05)
    assert stats.sessions == 0 and stats.kv_reserved_bytes == 0
    retry = stub.Forward(timeout=30)
    await retry.write(_first("late", positions))
    assert (await retry.read()).results[0].cached_length == len(PROMPT)
    retry.cancel()


async def test_a_session_of_unknown_budget_reserves_its_first_step_only(stage):
    stub, backend = stage
    call = stub.Forward(timeout=30)
    await call.write(_first("unknown", 0))
    await call.read()
    stats = await stub.Stats(stage_pb2.StatsRequest(), timeout=10)
    assert stats.kv_reserved_bytes == 64 * backend.limits.kv_bytes_per_position
    call.cancel()


async def test_a_budget_of_positions_beyond_any_context_is_invalid_argument(stage):
    stub, _ = stage
    call = stub.Forward(timeout=30)
    await call.write(_first("huge", 1 << 40))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "max_positions must lie in [0, 1048576]" in info.value.details()
