"""Continuous batching on one stage at 1.3B dimensions: aggregate decode tokens/s of C concurrent inspections vs one.

The stage is the last of a 2-stage split (layers [12, 24) + norm + lm_head), served by the real StageBackend
(queue, scheduler, one compute thread) in-process: C asyncio tasks each drive their own session step by step, as
C gateway streams would, and the backend gathers their steps into shared forward passes. Each session continues a
synthetic cache of `--context` positions. Per weight format, the single-inspection baseline runs in the same run.

    .venv/bin/python bench/perf_batching.py [--weights int8,bf16,fp32] [--concurrent 4] [--contexts 256,600]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import StepInput
from edgeinspect.services.stage.backend import SessionWork, StageBackend
from edgeinspect.services.stage.settings import StageSettings

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
TARGET = 3.0  # aggregate tokens/s of 4 concurrent inspections over one


async def _decode(backend: StageBackend, sid: str, start: int, steps: int, hidden_size: int) -> None:
    pos = start
    for _ in range(steps):
        h = torch.randn(1, hidden_size)  # [1, D]: the previous stage's hidden state for this token
        (out,) = await backend.run([SessionWork(sid, StepInput(pos, hidden=h))])
        pos = out.length


def tokens_per_s(backend: StageBackend, n: int, steps: int, context: int) -> float:
    """Aggregate decode tokens/s of n concurrent sessions, each `steps` tokens after `context` cached ones."""
    cfg = backend.ckpt.text_config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = [(torch.randn(1, cfg.num_key_value_heads, context, head_dim),) * 2 for _ in range(cfg.num_hidden_layers)]
    sids = [f"s{i}" for i in range(n)]
    for sid in sids:
        backend.executor.install(sid, kv, spare=steps + 1)

    async def main():
        await asyncio.gather(*(_decode(backend, sid, context, steps, cfg.hidden_size) for sid in sids))

    t0 = time.perf_counter()
    asyncio.run(main())
    elapsed = time.perf_counter() - t0
    for sid in sids:
        backend.executor.release(sid)
    return n * steps / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--weights", default="int8,bf16,fp32")
    ap.add_argument("--concurrent", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="decode tokens per inspection per run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved single/concurrent runs per context")
    ap.add_argument("--contexts", default="256,600", help="cached positions per session (600: a real inspection)")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    machine = machine_info()
    ckpt = open_checkpoint(args.checkpoint)
    n_layers = ckpt.num_layers
    results, targets = {}, {}
    for weights in args.weights.split(","):
        print(f"[{weights}] loading layers [{n_layers // 2}, {n_layers}) + lm_head", flush=True)
        cfg = StageSettings.load(
            None,
            checkpoint=args.checkpoint,
            layer_start=n_layers // 2,
            layer_end=n_layers,
            weights=weights,
            max_batch_sessions=max(8, args.concurrent),
        )
        backend = StageBackend(cfg, ckpt)
        tokens_per_s(backend, 1, 1, 64)  # warm-up
        for context in (int(c) for c in args.contexts.split(",")):
            ones, manys, batch = [], [], []
            for _ in range(args.rounds):  # interleaved: load drifts on a shared box, both sides see it
                ones.append(tokens_per_s(backend, 1, args.steps, context))
                passes, stepped = backend.steps_run, backend.sessions_stepped
                manys.append(tokens_per_s(backend, args.concurrent, args.steps, context))
                batch.append((backend.sessions_stepped - stepped) / max(backend.steps_run - passes, 1))
            ones.append(tokens_per_s(backend, 1, args.steps, context))
            # Each concurrent run against the mean of the single runs just before and after it.
            ratios = [m / ((a + b) / 2) for m, a, b in zip(manys, ones, ones[1:], strict=False)]
            ratio = statistics.median(ratios)
            key = f"{weights}_ctx{context}"
            results[key] = {
                "one_tok_s": [round(x, 3) for x in ones],
                f"{args.concurrent}_concurrent_tok_s": [round(x, 3) for x in manys],
                "ratios": [round(x, 3) for x in ratios],
                "ratio_median": round(ratio, 3),
                "mean_sessions_per_pass_concurrent": round(statistics.mean(batch), 2),
            }
            targets[f"{key}_{args.concurrent}_concurrent_vs_one"] = target(ratio, TARGET)
            print(
                f"[{weights}, context {context}] one {statistics.median(ones):.3f} tok/s, {args.concurrent} "
                f"concurrent {statistics.median(manys):.3f} tok/s: x{ratio:.2f} (target >= {TARGET}; rounds "
                f"{', '.join(f'{r:.2f}' for r in ratios)}); sessions per pass {statistics.mean(batch):.2f}",
                flush=True,
            )
        del backend
        gc.collect()
    payload = {
        "benchmark": "perf_batching",
        "machine": machine | {"loadavg_end": load_average()},
        "stage": f"[{n_layers // 2}, {n_layers}) + norm + lm_head",
        "contexts": args.contexts,
        "steps": args.steps,
        "results": results,
        "targets": targets,
    }
    print(f"-> {write_json('perf_batching', payload)}")


if __name__ == "__main__":
    main()
