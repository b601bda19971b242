"""Where an int8 decode step's time goes: each part of the layers against the bytes it reads, at the report's depth.

The int8 read-bound target compares a whole step with its bytes at a probe's speed. This splits the step: the int8
kernel is built once more with -DEI_PART_TIMES (models/kernels/int8_vnni.c: ei_q8_decode_layer then adds each
part's wall time to a running total), a 1.3B int8 stage runs its decode steps on that build, each step right after
a read probe of the step's weight bytes (as bench/perf_report.py's read bound), and each part's time is set against
its own bytes at that probe's speed:

- qkv / o / gate_up / down: the four linears of all layers (weights, their scales and row sums);
- attention: every cached key and value row of every layer (the KV cache at that depth);
- elementwise: norms, rotary, silu * up, the residual adds (no bytes to speak of: absolute time only);
- lm_head: the vocabulary projection (timed around its call);
- rest: the step's Python around them (embedding, rotary rows, checks, outputs).

Figures are medians per memory-speed bucket (probe below or above --split-gbs): memory on a shared box moves by
+-30% within seconds, and what a part loses to the bound depends on it.

    .venv/bin/python bench/decode_parts.py [--checkpoint CKPT] [--depth 974] [--steps 80] [--split-gbs 45]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import load_average, machine_info, memory_buckets, require_checkpoint, skip, write_json
from perf_decode import DEFAULT_CKPT, linear_bytes, step_bytes

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kernels import bindings, build
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

PARTS = ("elementwise", "qkv", "attention", "o", "gate_up", "down")  # int8_vnni.c's PART_* order
SID = "parts"


def timed_library(folder: Path) -> ctypes.CDLL:
    """The int8 kernel with its part clocks on (the project's flags otherwise)."""
    return bindings.variant(build.Q8_SOURCE, folder / "int8_vnni_part_times.so", "EI_PART_TIMES")


def part_bytes(executor: StageExecutor, depth: int) -> dict[str, int]:
    """Bytes each part reads per step: the linears' weights with their scales and row sums; the cache at depth."""
    layers = executor.module.layers
    return {
        "qkv": sum(linear_bytes(layer.self_attn.qkv_proj) for layer in layers),
        "o": sum(linear_bytes(layer.self_attn.o_proj) for layer in layers),
        "gate_up": sum(linear_bytes(layer.mlp.gate_up_proj) for layer in layers),
        "down": sum(linear_bytes(layer.mlp.down_proj) for layer in layers),
        "attention": executor.kv_bytes_per_position() * depth,
        "lm_head": linear_bytes(executor.module.lm_head),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--depth", type=int, default=974, help="cached positions (the report's prompt length)")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split-gbs", type=float, default=45.0, help="probe speed between the slow and fast buckets")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    if build.compiler() is None or bindings.q8_library() is None:
        skip("no C compiler (set CC or install gcc): the int8 kernel cannot be built with its part clocks")
    torch.set_num_threads(args.threads)
    ckpt = open_checkpoint(args.checkpoint)
    executor = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8"))
    if executor.decode_layers is None:
        skip("this stage's decode layers do not run as one native call (no vnni int8 kernel here)")
    with tempfile.TemporaryDirectory(prefix="decode-parts-") as folder:
        lib = executor.decode_layers.lib = timed_library(Path(folder))
    module = executor.module
    weight_bytes, nbytes = step_bytes(module), part_bytes(executor, args.depth)
    lm_head, lm_seconds = module.lm_head, []
    lm_forward = lm_head.forward

    def timed_lm_head(x):
        t0 = time.perf_counter()
        out = lm_forward(x)
        lm_seconds.append(time.perf_counter() - t0)
        return out

    lm_head.forward = timed_lm_head
    kv = executor.kv_rows(torch.randn(len(module.layers), 2, executor.kv_heads, args.depth, executor.head_dim) * 0.1)
    executor.open_from(SID, kv, spare=args.steps + 1)
    probe = torch.ones(weight_bytes // 4)
    probe.sum()  # resident before the first probe
    clocks = (ctypes.c_double * len(PARTS))()
    samples = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        probe.sum()
        t1 = time.perf_counter()
        executor.step([(SID, StepInput(position=args.depth + i, input_ids=torch.tensor([5])))])
        t2 = time.perf_counter()
        if lib.ei_q8_part_times(ctypes.addressof(clocks)) != len(PARTS):
            raise RuntimeError("the part clocks are not in this build")
        ms = {p: clocks[j] * 1e3 for j, p in enumerate(PARTS)}
        ms["lm_head"] = lm_seconds[-1] * 1e3
        ms["rest"] = (t2 - t1) * 1e3 - sum(ms.values())
        if i >= 2:  # the first steps fault in buffers
            samples.append((weight_bytes / (t1 - t0) / 1e9, (t2 - t1) * 1e3, ms))
    executor.release(SID)

    def bucket(chosen) -> dict:
        gbs = statistics.median(s[0] for s in chosen)
        step = statistics.median(s[1] for s in chosen)
        parts = {}
        for name in (*PARTS, "lm_head", "rest"):
            ms = statistics.median(s[2][name] for s in chosen)
            row = {"ms": round(ms, 3)}
            if name in nbytes:
                bound = nbytes[name] / (gbs * 1e9) * 1e3
                row |= {"bytes": nbytes[name], "read_bound_ms": round(bound, 3), "x_read_bound": round(ms / bound, 3)}
            parts[name] = row
        bound = (weight_bytes + executor.kv_bytes_per_position() * args.depth) / (gbs * 1e9) * 1e3
        return {"steps": len(chosen), "probe_gbs_median": round(gbs, 1), "step_ms_median": round(step, 2),
                "x_read_bound": round(step / bound, 3), "parts": parts}  # fmt: skip

    buckets = memory_buckets([s[0] for s in samples], args.split_gbs, lambda idx, _: bucket([samples[i] for i in idx]))
    payload = {
        "benchmark": "decode_parts",
        "checkpoint": str(args.checkpoint),
        "weights": "int8",
        "depth": args.depth,
        "threads": args.threads,
        "split_gbs": args.split_gbs,
        "buckets": buckets,
        "load_average": load_average(),
        "machine": machine_info(bandwidth=False),
    }
    path = write_json("decode_parts", payload, args.out)
    for name, b in buckets.items():
        print(f"{name}: probe {b['probe_gbs_median']} GB/s, {b['steps']} steps, step {b['step_ms_median']} ms "
              f"({b['x_read_bound']:.3f}x its read bound)")  # fmt: skip
        for part, row in b["parts"].items():
            against = ""
            if "bytes" in row:
                against = f" = {row['x_read_bound']:.2f}x its bytes' {row['read_bound_ms']:.2f} ms"
            print(f"  {part:>11}: {row['ms']:7.2f} ms{against}")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
