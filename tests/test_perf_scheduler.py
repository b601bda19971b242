"""The stage's continuous-batching policy (pure: no processes, no tensors)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeinspect.services.stage.scheduler import BatchLimits, Pending, plan_step


def _ids(plan):
    return [p.seq for p in plan]


def test_ready_sessions_run_together_in_arrival_order():
    pending = [Pending(3, "c", 1), Pending(1, "a", 1), Pending(2, "b", 1)]
    assert _ids(plan_step(pending, BatchLimits())) == [1, 2, 3]


def test_batch_limit_leaves_the_newest_for_the_next_step():
    pending = [Pending(i, f"s{i}", 1) for i in range(10)]
    plan = plan_step(pending, BatchLimits(max_sessions=4))
    assert _ids(plan) == [0, 1, 2, 3]


def test_a_long_prompt_is_chunked_and_decodes_still_join():
    pending = [Pending(1, "long", 1500), Pending(2, "d1", 1), Pending(3, "d2", 1)]
    plan = plan_step(pending, BatchLimits(max_tokens=512))
    assert [(p.seq, p.tokens) for p in plan] == [(1, 512)]  # the oldest fills the step...
    # ...but decode steps that arrived first are never stuck behind a long prompt that came later:
    pending = [Pending(1, "d1", 1), Pending(2, "d2", 1), Pending(3, "long", 1500)]
    plan = plan_step(pending, BatchLimits(max_tokens=512))
    assert [(p.seq, p.tokens) for p in plan] == [(1, 1), (2, 1), (3, 510)]


def test_the_oldest_always_runs_even_beyond_the_kv_budget():
    limits = BatchLimits(kv_budget_bytes=1000, kv_bytes_per_position=10)
    plan = plan_step([Pending(1, "big", 300), Pending(2, "small", 5)], limits, kv_in_use=900)
    assert _ids(plan) == [1]  # the second would overflow the budget: it waits


def test_kv_budget_admits_what_fits():
    limits = BatchLimits(kv_budget_bytes=1000, kv_bytes_per_position=10)
    plan = plan_step([Pending(1, "a", 5), Pending(2, "b", 50), Pending(3, "c", 3)], limits, kv_in_use=800)
    assert _ids(plan) == [1, 3]  # 50 and 3 positions would need 530 bytes of the 150 free


def test_a_session_runs_at_most_once_per_step():
    plan = plan_step([Pending(1, "a", 1), Pending(2, "a", 1), Pending(3, "b", 1)], BatchLimits())
    assert _ids(plan) == [1, 3]


def test_limits_must_allow_progress():
    with pytest.raises(ValueError):
        BatchLimits(max_tokens=0)


@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 900)), min_size=1, max_size=20),
    st.integers(1, 8),
    st.integers(1, 600),
)
def test_every_plan_respects_the_limits_and_progresses(items, max_sessions, max_tokens):
    pending = [Pending(i, sid, n) for i, (sid, n) in enumerate(items)]
    plan = plan_step(pending, BatchLimits(max_sessions=max_sessions, max_tokens=max_tokens))
    assert plan and plan[0].seq == 0  # the oldest runs: nothing starves
    assert len(plan) <= max_sessions
    assert sum(p.tokens for p in plan) <= max_tokens
    by_seq = {p.seq: p for p in pending}
    assert len({by_seq[p.seq].session_id for p in plan}) == len(plan)
    assert all(1 <= p.tokens <= by_seq[p.seq].remaining for p in plan)


def test_a_pass_holds_only_the_oldest_steps_micro_batch_group():
    pending = [Pending(1, "a", 1, group=1), Pending(2, "b", 1, group=0), Pending(3, "c", 1, group=1)]
    assert _ids(plan_step(pending, BatchLimits())) == [1, 3]  # b waits: its group runs on the next pass
    assert _ids(plan_step(pending[1:2], BatchLimits())) == [2]
