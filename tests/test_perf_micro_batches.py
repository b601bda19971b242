"""Keeping a pipeline full: the gateway spreads sessions over S micro-batch groups and each stage pass runs one
group, so groups occupy different stages at once instead of moving through the pipeline as one batch."""

from __future__ import annotations

import asyncio

from edgeinspect.services.gateway.decode.pipeline import MicroBatchGroups
from edgeinspect.testing import decode_concurrently

SESSIONS = 4
DECODE_STEPS = 6


def test_groups_stay_balanced_as_sessions_come_and_go():
    groups, lockstep = MicroBatchGroups(2), MicroBatchGroups(1)
    joined = [groups.join() for _ in range(4)]
    assert sorted(joined) == [0, 0, 1, 1]
    groups.leave(1)
    groups.leave(1)
    assert groups.join() == 1 and groups.join() == 1  # refills the emptied group first
    assert {lockstep.join() for _ in range(4)} == {0}  # micro_batches=1: all batch together


def test_each_stage_pass_runs_one_micro_batch_group(tiny_checkpoint):
    # a long window: without groups, all four sessions would be gathered into every pass
    window = [{"batch_window_ms": 1000}] * 2  # ends as soon as a group is back: only bounds a stalled session
    groups, stats, open_after = asyncio.run(decode_concurrently(tiny_checkpoint, 2, SESSIONS, DECODE_STEPS, window))
    assert sorted(groups) == [0, 0, 1, 1] and open_after == [0, 0]
    for s in stats:
        assert s.session_steps == SESSIONS * DECODE_STEPS
        # two groups of two: never all four in one pass, and the window still keeps each group together
        assert s.passes >= s.session_steps / 2
        assert s.passes <= 2 * DECODE_STEPS + 2
