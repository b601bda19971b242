"""Continuous batching policy for a stage: which waiting session steps run together in the next forward pass.

Pure functions over plain records, so the policy is tested without processes or tensors. The backend keeps a
queue of pending steps (one per session and request, from any number of concurrent streams); whenever the model
is free it asks plan_step() for the next batch, runs it as one forward pass, and asks again. Steps that arrive
while a step runs are gathered into the next one.

Fairness: the oldest pending step always runs (nothing starves), then others of its micro-batch group join in
arrival order while they fit the session limit, the rows-per-step limit and the KV byte budget. Groups are how a
pipeline stays full (vLLM's micro-batches for pipeline parallelism): the gateway puts each session in one of S
groups, and since a pass holds one group, group A runs on stage 1 while group B runs on stage 0 instead of every
session moving through the stages together, one stage working while the others wait.
A long prompt is cut into chunks of at most the rows still free in the step, so decode steps of other sessions
keep flowing between its chunks instead of waiting for the whole prefill; a prompt's chunks stay in order because
a session appears at most once per step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    """A waiting step: `remaining` positions of session `session_id` still to run (arrival order in `seq`)."""

    seq: int
    session_id: str
    remaining: int
    group: int = 0  # pipeline micro-batch group


@dataclass(frozen=True)
class BatchLimits:
    max_sessions: int = 8  # sessions per forward pass
    max_tokens: int = 512  # rows per forward pass: bounds how long one step keeps decode steps waiting
    kv_budget_bytes: int = 2 << 30
    kv_bytes_per_position: int = 0

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.max_tokens < 1:
            raise ValueError("a step must allow at least one session and one row")


@dataclass(frozen=True)
class Planned:
    seq: int
    tokens: int  # positions of this pending step to run now (a chunk when < remaining)


def plan_step(pending: list[Pending], limits: BatchLimits, kv_in_use: int = 0) -> list[Planned]:
    """The next batch: the oldest step always, then others of its group in arrival order while they fit."""
    if not pending:
        return []
    queue = sorted(pending, key=lambda p: p.seq)
    queue = [p for p in queue if p.group == queue[0].group]
    planned: list[Planned] = []
    sessions: set[str] = set()
    rows = 0
    kv_free = limits.kv_budget_bytes - kv_in_use
    for p in queue:
        if len(planned) >= limits.max_sessions or rows >= limits.max_tokens:
            break
        if p.session_id in sessions:  # a later step of the same session waits for this one
            continue
        take = min(p.remaining, limits.max_tokens - rows)
        growth = take * limits.kv_bytes_per_position
        if planned and growth > kv_free:
            continue  # would overflow the KV budget: wait (eviction or releases make room); the oldest runs anyway
        planned.append(Planned(p.seq, take))
        sessions.add(p.session_id)
        rows += take
        kv_free -= growth
    return planned
