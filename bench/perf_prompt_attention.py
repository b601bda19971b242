"""Prompt attention of packed stages (models/kernels/prompt_attention.c) against SDPA, as the stage would call each.

One layer's causal attention over a prompt (default: the report's 974 tokens at DeepSeek-VL 1.3B's 16 heads x 128),
the kernel and SDPA (is_causal, what the stage runs without the kernel) interleaved round by round; the figure is
the ratio of the medians, with the relative difference between their outputs. With --checkpoint, a whole int8
stage's prefill of the same number of tokens also runs with the kernel on and off, interleaved, and the time spent
attending is summed per prefill (the stage's _attend, timed from outside).

    .venv/bin/python bench/perf_prompt_attention.py [--tokens 974] [--rounds 30] [--checkpoint CKPT]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, skip, target, write_json

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kernels import bindings, ops
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage


def layer_inputs(tokens: int, heads: int, kv_heads: int, head_dim: int):
    """q [H, t, hd], k/v [H_kv, t, hd] as the stage passes them: head views of [t, heads, hd] rows."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(tokens, heads, head_dim, generator=g).transpose(0, 1)
    k = torch.randn(tokens, kv_heads, head_dim, generator=g).transpose(0, 1)
    v = torch.randn(tokens, kv_heads, head_dim, generator=g).transpose(0, 1)
    return q, k, v


def sdpa(q, k, v, scale: float) -> torch.Tensor:
    heads, t, hd = q.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        q[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=heads != k.shape[0]
    )
    return out[0].transpose(0, 1).reshape(t, heads * hd)


def one_layer(args) -> dict:
    q, k, v = layer_inputs(args.tokens, args.heads, args.kv_heads, args.head_dim)
    scale = args.head_dim**-0.5
    ours, theirs = ops.prompt_attention(q, k, v, 0, scale), sdpa(q, k, v, scale)
    times: dict[str, list[float]] = {"kernel": [], "sdpa": []}
    for r in range(args.rounds):
        for name in ("kernel", "sdpa") if r % 2 == 0 else ("sdpa", "kernel"):
            t0 = time.perf_counter()
            ops.prompt_attention(q, k, v, 0, scale) if name == "kernel" else sdpa(q, k, v, scale)
            times[name].append(time.perf_counter() - t0)
    # the causal half of q k^T and of p v, two FLOPs a product
    flops = 4 * args.heads * args.head_dim * args.tokens * (args.tokens + 1) / 2
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {
        "tokens": args.tokens,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "rounds": args.rounds,
        "ms_median": {name: round(v, 2) for name, v in ms.items()},
        "ms_min": {name: round(min(t) * 1e3, 2) for name, t in times.items()},
        "gflops_at_median": {name: round(flops / (v / 1e3) / 1e9, 1) for name, v in ms.items()},
        "relative_difference_vs_sdpa": float((ours - theirs).norm() / theirs.norm()),
        "ratio": ms["kernel"] / ms["sdpa"],
    }


def prefill(args) -> dict:
    """A whole int8 stage's prefill with the kernel on and off: seconds attending (summed over layers) and in all."""
    ckpt = open_checkpoint(args.checkpoint)
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8"))
    attending = [0.0]
    attend = ex._attend

    def timed(*a):
        t0 = time.perf_counter()
        out = attend(*a)
        attending[0] += time.perf_counter() - t0
        return out

    ex._attend = timed  # an instance attribute: this executor only
    vocab = ckpt.text_config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(min(100, vocab // 2), min(5000, vocab), (args.tokens,), generator=g)
    seconds: dict[str, list[float]] = {"kernel": [], "sdpa": []}
    total: dict[str, list[float]] = {"kernel": [], "sdpa": []}
    for r in range(args.prefill_rounds):
        for name in ("kernel", "sdpa") if r % 2 == 0 else ("sdpa", "kernel"):
            ex.prompt_kernel, attending[0] = name == "kernel", 0.0
            t0 = time.perf_counter()
            ex.step([(f"{name}{r}", StepInput(0, input_ids=ids))])
            total[name].append(time.perf_counter() - t0)
            seconds[name].append(attending[0])
            ex.release(f"{name}{r}")
    return {
        "checkpoint": str(args.checkpoint),
        "layers": ckpt.num_layers,
        "rounds": args.prefill_rounds,
        "attend_s_median": {name: round(statistics.median(t), 6) for name, t in seconds.items()},
        "prefill_s_median": {name: round(statistics.median(t), 3) for name, t in total.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=974, help="prompt length (the report's)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=30, help="interleaved rounds of one layer's attention")
    ap.add_argument("--checkpoint", type=Path, default=None, help="also time a whole int8 stage's prefill")
    ap.add_argument("--prefill-rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="JSON (default bench/results/perf_prompt_attention.json)")
    args = ap.parse_args()
    if args.checkpoint is not None:
        require_checkpoint(args.checkpoint)
    torch.set_num_threads(args.threads)
    if not bindings.prompt_attention_fast():
        skip("the prompt attention kernel does not run here (no C compiler, or neither AVX512-BF16 nor AVX2 + FMA)")
    payload = {
        "benchmark": "perf_prompt_attention",
        "machine": machine_info(),
        "kernel": "bf16 dot products" if bindings.prompt_attention_bf16() else "fp32",
    }
    with torch.inference_mode():
        layer = one_layer(args)
        payload["layer"] = layer
        if args.checkpoint is not None:
            payload["prefill"] = prefill(args)
    payload["machine"]["loadavg_end"] = load_average()
    payload["targets"] = {"layer_kernel_vs_sdpa": target(layer["ratio"], 1.0, higher_is_better=False)}
    path = write_json("perf_prompt_attention", payload, args.out)
    print(
        f"one layer ({args.tokens} x {args.heads} x {args.head_dim}, {payload['kernel']}): "
        f"{layer['ms_median']['kernel']} ms vs SDPA {layer['ms_median']['sdpa']} ms = {layer['ratio']:.3f}x, "
        f"relative difference {layer['relative_difference_vs_sdpa']:.1e}"
    )
    if "prefill" in payload:
        p = payload["prefill"]
        print(f"prefill: attending {p['attend_s_median']['kernel']} s vs {p['attend_s_median']['sdpa']} s with SDPA")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
