"""Prefix cache: time to first token of a frame whose part's prompt prefix (system prompt + ~300 tokens of spec
context) is cached on the stage, against the same frame prefilled whole, in one run on one stage holding all
layers (StageBackend: the code path a served stage runs, prefix lookup and copy included).

The prompt is the gateway's: chat template, spec context from the shipped sample KB, 576 image placeholders (1.3B:
SigLIP at 384x384) with random visual tokens (prefill cost does not depend on their values), the instruction.

    .venv/bin/python bench/perf_prefix.py [--checkpoint PATH] [--weights bf16] [--context-tokens 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import torch
from common import inspection_prompt, load_average, machine_info, require_checkpoint, target, write_json

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import StepInput
from edgeinspect.services.gateway.decode.pipeline import prefix_key
from edgeinspect.services.stage.backend import SessionWork, StageBackend
from edgeinspect.services.stage.settings import StageSettings

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
# Skipping the prefix must at least pay for its copy: the cached frame's TTFT over the whole prompt's.
TARGET = 0.8


async def first_token_ms(backend: StageBackend, sid: str, ids: list[int], visual, prefix: int, cached: bool) -> float:
    """Prefill to the first token's logits; `cached` starts from the stage's prefix cache and sends the rest."""
    start = prefix if cached else 0
    inputs = StepInput(position=start, input_ids=torch.tensor(ids[start:]), visual_tokens=visual)
    work = SessionWork(sid, inputs, prefix_key=prefix_key(ids[:prefix]), prefix_length=prefix)
    t0 = time.perf_counter()
    (out,) = await backend.run([work])
    elapsed = (time.perf_counter() - t0) * 1e3
    if out.token_id < 0:
        raise RuntimeError("the prefill sampled no token")
    await backend.release([sid])
    return elapsed


async def measure(backend: StageBackend, ids: list[int], visual, prefix: int, rounds: int) -> dict:
    whole, cached = [], []
    await first_token_ms(backend, "warmup", ids, visual, prefix, cached=False)  # also stores the prefix
    if prefix_key(ids[:prefix]) not in backend.prefixes:
        raise RuntimeError("the stage did not keep the prefix (prefix_cache_mb too small?)")
    for r in range(rounds):  # interleaved, so load changes hit both alike
        whole.append(await first_token_ms(backend, f"whole{r}", ids, visual, prefix, cached=False))
        cached.append(await first_token_ms(backend, f"cached{r}", ids, visual, prefix, cached=True))
        print(f"round {r}: whole {whole[-1]:.0f} ms, from cached prefix {cached[-1]:.0f} ms", flush=True)
    return {
        "whole_ms": statistics.median(whole),
        "cached_ms": statistics.median(cached),
        "whole": whole,
        "cached": cached,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="checkpoint folder (1.3B-shaped)")
    ap.add_argument("--weights", default="bf16", help="stage weight format: fp32 | bf16 | int8")
    ap.add_argument("--context-tokens", type=int, default=300, help="spec-context tokens in the prompt")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median reported)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/perf_prefix.json)")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    torch.set_num_threads(args.threads)
    ckpt = open_checkpoint(args.checkpoint)
    ids, visual = inspection_prompt(ckpt, args.context_tokens)
    prefix = ids.index(ckpt.config.image_token_id)
    n_visual = visual.shape[0]
    print(f"prompt {len(ids)} tokens: prefix {prefix}, visual {n_visual}, rest {len(ids) - prefix - n_visual}")
    cfg = StageSettings(
        checkpoint=args.checkpoint, layer_start=0, layer_end=ckpt.num_layers, weights=args.weights, threads=args.threads
    )
    load_before = load_average()
    backend = StageBackend(cfg, ckpt)
    result = asyncio.run(measure(backend, ids, visual, prefix, args.rounds))
    ratio = result["cached_ms"] / result["whole_ms"]
    print(f"first token: whole {result['whole_ms']:.0f} ms, cached prefix {result['cached_ms']:.0f} ms ({ratio:.3f}x)")
    write_json(
        "perf_prefix",
        {
            "machine": machine_info(bandwidth=False),
            "load_average_before": load_before,
            "load_average_after": load_average(),
            "checkpoint": str(args.checkpoint),
            "weights": args.weights,
            "threads": args.threads,
            "prompt_tokens": len(ids),
            "prefix_tokens": prefix,
            "visual_tokens": n_visual,
            "prefix_kv_bytes": backend.prefixes.nbytes,
            **result,
            "targets": {"cached_prefix_ttft_over_whole": target(ratio, TARGET, higher_is_better=False)},
        },
        args.out,
    )


if __name__ == "__main__":
    main()
