"""Continuous batching keeps concurrent sessions in one batch: the sessions of a pass get a short window to queue
their next steps (their answers make a round trip through the client first)."""

from __future__ import annotations

import asyncio

import torch

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import StepInput
from edgeinspect.services.stage.backend import SessionWork, StageBackend
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.testing import decode_concurrently

SESSIONS = 4
DECODE_STEPS = 8


def test_concurrent_decodes_stay_one_batch(tiny_checkpoint):
    """Without the window the batch splits (here 10 passes on the tiny model; 1.3B: halves that never merge)."""
    _, (stats,), _ = asyncio.run(
        decode_concurrently(tiny_checkpoint, 1, SESSIONS, DECODE_STEPS, per_stage=[{"batch_window_ms": 500}])
    )
    assert stats.session_steps == SESSIONS * DECODE_STEPS
    # One pass per step for all four; only the first step may catch them in two groups.
    assert stats.passes <= DECODE_STEPS + 1


def test_a_backend_serves_concurrent_steps_across_event_loops(tiny_checkpoint):
    """Benchmarks and tools drive one backend from several asyncio.run calls: two sessions, then one alone in a
    new loop (which must not wait for a partner that will never come, nor hang on the last loop's state)."""
    ckpt = open_checkpoint(tiny_checkpoint)
    cfg = StageSettings(checkpoint=tiny_checkpoint, layer_start=0, layer_end=ckpt.num_layers, batch_window_ms=200)
    backend = StageBackend(cfg, ckpt)
    eos = ckpt.text_config.eos_token_id

    async def sessions(round_: int, n: int) -> list[int]:
        async def one(k: int) -> int:
            sid = f"r{round_}s{k}"
            (out,) = await backend.run([SessionWork(sid, StepInput(0, input_ids=torch.full((3 + k,), eos)))])
            for _ in range(3):
                await asyncio.sleep(0.02 * k)  # a late partner: the backend waits for it within the window
                (out,) = await backend.run([SessionWork(sid, StepInput(out.length, input_ids=torch.tensor([eos])))])
            return out.length

        return await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(n))), timeout=20)

    for r, n in enumerate([2, 1, 2, 1]):
        assert asyncio.run(sessions(r, n)) == [6, 7][:n]
