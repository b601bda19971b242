"""Keeping a pipeline full: the gateway spreads sessions over S micro-batch groups and each stage pass runs one
group, so groups occupy different stages at once instead of moving through the pipeline as one batch."""

from __future__ import annotations

import asyncio

from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.services.gateway.upstream import StagePipeline
from edgeinspect.testing import local_stages
from edgeinspect.v1 import stage_pb2

SESSIONS = 4
DECODE_STEPS = 6


def test_groups_stay_balanced_as_sessions_come_and_go():
    pipeline = StagePipeline(["127.0.0.1:1", "127.0.0.1:2"], None, False, False, 4)
    groups = [pipeline.join_group() for _ in range(4)]
    assert sorted(groups) == [0, 0, 1, 1]
    pipeline.leave_group(1)
    pipeline.leave_group(1)
    assert pipeline.join_group() == 1 and pipeline.join_group() == 1  # refills the emptied group first
    lockstep = StagePipeline(["127.0.0.1:1", "127.0.0.1:2"], None, False, False, 4, micro_batches=1)
    assert {lockstep.join_group() for _ in range(4)} == {0}  # micro_batches=1: every session batches together


async def _decode(path) -> tuple[list[int], list[stage_pb2.StageStats]]:
    ckpt = open_checkpoint(path)
    tokenizer = load_processor(ckpt).tokenizer
    # a long window: without groups, all four sessions would be gathered into every pass
    async with local_stages(path, 2, per_stage=[{"batch_window_ms": 300}] * 2) as (pipeline, _):
        sessions = [pipeline.session(f"s{k}") for k in range(SESSIONS)]
        tokens = {}
        for k, s in enumerate(sessions):
            await s.__aenter__()
            ids = tokenizer(f"Part {k}: inspect the weld seam.")["input_ids"]
            tokens[k] = (await s.prefill(ids, None, stage_pb2.SamplingParams(), 0, ckpt.config.image_token_id)).token_id
        before = [await stub.Stats(stage_pb2.StatsRequest()) for stub in pipeline.stubs]

        async def decode(k: int) -> None:
            for _ in range(DECODE_STEPS):
                tokens[k] = (await sessions[k].step([tokens[k]], None, stage_pb2.SamplingParams())).token_id

        await asyncio.gather(*(decode(k) for k in range(SESSIONS)))
        after = [await stub.Stats(stage_pb2.StatsRequest()) for stub in pipeline.stubs]
        groups = [s.group for s in sessions]
        for s in sessions:
            await s.__aexit__(None, None, None)
        assert pipeline.group_sessions == [0, 0]
    stats = [
        stage_pb2.StageStats(passes=a.passes - b.passes, session_steps=a.session_steps - b.session_steps)
        for a, b in zip(after, before, strict=True)
    ]
    return groups, stats


def test_each_stage_pass_runs_one_micro_batch_group(tiny_checkpoint):
    groups, stats = asyncio.run(_decode(tiny_checkpoint))
    assert sorted(groups) == [0, 0, 1, 1]
    for s in stats:
        assert s.session_steps == SESSIONS * DECODE_STEPS
        # two groups of two: never all four in one pass, and the window still keeps each group together
        assert s.passes >= s.session_steps / 2
        assert s.passes <= 2 * DECODE_STEPS + 2
