"""The int8 linear kernels on a whole 1.3B step's weights: our VNNI GEMV ("vnni") vs fbgemm, against a read probe.

A decode step reads every weight once: 24 layers x (fused qkv, o_proj, fused gate_up, down_proj with its residual
pass) + the lm_head, 1.45 GB in int8, far beyond any cache. Each round reads a probe of the same bytes (a torch
sum, same threads), then runs one decode step's linears with each kernel, interleaved, so the box's moving memory
speed (+-30% from minute to minute here) falls on all alike; each figure is bytes / time, and the ratios are per
round. A second part times the prompt path at 256-row blocks (what a packed stage's prefill runs): fbgemm's GEMM
against torch._int_mm (oneDNN) on the vnni kernel's row-major weights. A third times decode attention over the
report's 974 cached positions x 24 layers (16 heads x 128) with the KV cache in fp16 rows and in int8 rows
(models/kv.py), interleaved.

    .venv/bin/python bench/perf_int8_kernel.py [--rounds 12] [--threads 2] [--layers 24] [--depth 974]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import load_average, machine_info, skip, write_json
from torch import nn

from edgeinspect.models.kernels import ops
from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.quant import TWO_PASS_LINEARS, Int8Linear, fbgemm_available, vnni_available

SHAPES = {"qkv_proj": (6144, 2048), "o_proj": (2048, 2048), "gate_up_proj": (11264, 2048), "down_proj": (2048, 5632)}
LM_HEAD = (102400, 2048)
PROMPT_ROWS = 256


def build(layers: int, kernels: list[str]) -> dict[str, list[tuple[Int8Linear, torch.Tensor]]]:
    """Per kernel, one step's linears (same random weights for every kernel) with an input row each."""
    g = torch.Generator().manual_seed(0)
    out: dict[str, list] = {k: [] for k in kernels}
    shapes = [(name, n, k) for _ in range(layers) for name, (n, k) in SHAPES.items()] + [("lm_head", *LM_HEAD)]
    for name, n, k in shapes:
        lin = nn.Linear(k, n, bias=False).requires_grad_(False)
        lin.weight.normal_(0, 0.02, generator=g)
        x = torch.randn(1, k, generator=g)
        for kernel in kernels:
            out[kernel].append((Int8Linear.from_linear(lin, kernel, two_pass=name in TWO_PASS_LINEARS), x))
        del lin
    return out


def attention_by_cache(depth: int, rounds: int, layers: int = 24, heads: int = 16, head_dim: int = 128) -> dict:
    """One decode step's attention (all layers) over `depth` positions, fp16 rows vs int8 rows, interleaved."""
    g = torch.Generator().manual_seed(2)
    caches = {}
    for name, dtype in (("fp16", torch.float16), ("int8", torch.int8)):
        kv = KVBuffer(layers, heads, head_dim, dtype, capacity=depth + rounds + 2)
        for layer in range(layers):
            kv.write(layer, *(torch.randn(heads, depth, head_dim, generator=g) * 0.3 for _ in range(2)), 0)
        kv.length = depth
        caches[name] = kv
    q, k, v = (torch.randn(1, heads, head_dim, generator=g) for _ in range(3))
    times: dict[str, list[float]] = {name: [] for name in caches}
    for _ in range(rounds + 1):
        for name, kv in caches.items():
            step = ops.DecodeAttention([kv], [depth])  # rewrites row `depth` each round: the same work
            t0 = time.perf_counter()
            for layer in range(layers):
                step(layer, q, k, v, head_dim**-0.5)
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, t in times.items():
        out[name] = {
            "min_ms": round(min(t[1:]) * 1e3, 2),
            "median_ms": round(statistics.median(t[1:]) * 1e3, 2),
            "cache_mb": round(
                caches[name].data[:, :, :, : depth + 1].numel() * caches[name].data.element_size() / 1e6, 1
            ),
        }
    out["int8_vs_fp16_median"] = round(out["int8"]["median_ms"] / out["fp16"]["median_ms"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--depth", type=int, default=974, help="cached positions for the attention part")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kernels = [k for k, ok in (("vnni", vnni_available()), ("fbgemm", fbgemm_available())) if ok]
    if len(kernels) < 2:
        skip(f"needs both the vnni and fbgemm int8 kernels here (have: {', '.join(kernels) or 'neither'})")
    machine = machine_info()
    step = build(args.layers, kernels)
    nbytes = sum(lin.weight_bytes() for lin, _ in step[kernels[0]])
    probe = torch.ones(nbytes // 4)
    probe.sum()
    gbs: dict[str, list[float]] = {k: [] for k in ["probe", *kernels]}
    with torch.inference_mode():
        for r in range(args.rounds + 1):  # round 0 warms up
            t0 = time.perf_counter()
            probe.sum()
            times = {"probe": time.perf_counter() - t0}
            for kernel in kernels:
                t0 = time.perf_counter()
                for lin, x in step[kernel]:
                    lin(x)
                times[kernel] = time.perf_counter() - t0
            if r:
                for k, t in times.items():
                    gbs[k].append(nbytes / t / 1e9)
            print(f"round {r}: " + ", ".join(f"{k} {nbytes / t / 1e9:.1f} GB/s" for k, t in times.items()), flush=True)
    med = {k: round(statistics.median(v), 2) for k, v in gbs.items()}
    per_round = {
        f"{k}_vs_probe": round(statistics.median(a / p for a, p in zip(gbs[k], gbs["probe"], strict=True)), 3)
        for k in kernels
    }
    per_round["vnni_vs_fbgemm"] = round(
        statistics.median(a / b for a, b in zip(gbs["vnni"], gbs["fbgemm"], strict=True)), 3
    )
    del step
    # prompt blocks: one layer's shapes, 256 rows, min over rounds (compute-bound: memory speed matters less)
    g = torch.Generator().manual_seed(1)
    prompt = {}
    for name, (n, k) in SHAPES.items():
        lin = nn.Linear(k, n, bias=False).requires_grad_(False)
        lin.weight.normal_(0, 0.02, generator=g)
        x = torch.randn(PROMPT_ROWS, k, generator=g)
        subjects = {kn: Int8Linear.from_linear(lin, kn, two_pass=name in TWO_PASS_LINEARS) for kn in kernels}
        best = {kn: float("inf") for kn in kernels}
        with torch.inference_mode():
            for _ in range(max(args.rounds // 2, 3)):
                for kn, sub in subjects.items():
                    t0 = time.perf_counter()
                    sub(x)
                    best[kn] = min(best[kn], time.perf_counter() - t0)
        passes = 2 if name in TWO_PASS_LINEARS else 1
        flop = 2 * PROMPT_ROWS * passes * n * k
        prompt[name] = {kn: {"min_ms": round(t * 1e3, 3), "gflops": round(flop / t / 1e9)} for kn, t in best.items()}
        print(name, prompt[name], flush=True)
    layer_ms = {kn: round(sum(prompt[s][kn]["min_ms"] for s in prompt), 3) for kn in kernels}
    attention = attention_by_cache(args.depth, args.rounds)
    print(f"decode attention, {args.depth} positions x 24 layers: {attention}", flush=True)
    payload = {
        "benchmark": "perf_int8_kernel",
        "machine": machine | {"loadavg_end": load_average()},
        "threads": args.threads,
        "rounds": args.rounds,
        "decode_step": {
            "layers": args.layers,
            "weight_bytes": nbytes,
            "gbs_median": med,
            "ratios_median_per_round": per_round,
        },
        "prompt_block": {"rows": PROMPT_ROWS, "per_shape": prompt, "layer_min_ms": layer_ms},
        "decode_attention": attention,
    }
    print(f"decode step GB/s (median): {med}; per round: {per_round}")
    print(f"prompt block of {PROMPT_ROWS} rows, one layer (min): {layer_ms}")
    print(f"-> {write_json('perf_int8_kernel', payload)}")


if __name__ == "__main__":
    main()
