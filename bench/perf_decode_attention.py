"""int8 decode attention in 16-bit fixed point vs the float loops the kernel runs, at the report's depth.

decode_attention.c built with -DEI_FIXED_ATTENTION runs int8 heads of 128 or 256 dims in fixed point on AVX-512
VNNI (Q8_FIXED: q and the softmax weights rounded to int16, exact int32 sums by vpdpwssd); the default build runs
float loops (sign-extend, convert, FMA per value). This builds the fixed variant, and times it against the default
build in one run, alternating which goes first, on a 1.3B-shaped cache (--layers x 2 x --heads x --depth rows of
--head-dim int8 values):

- hot: one layer's rows attended --layers times (they stay in L3): the arithmetic's own speed, what bounds the
  attention when memory is fast;
- cold: every layer once per step, each step right after a read probe of the cache's bytes, per memory-speed
  bucket (memory on a shared box moves by +-30% within seconds);
- error: each build's output vs fp32 SDPA over the same stored rows (relative norm error);
- steps (with --checkpoint): whole int8 decode steps of that checkpoint at --depth, one session per build over the
  same cache and tokens, each step right after a read probe of the step's weight bytes (as bench/perf_report.py's
  read bound), the builds alternating which goes first: each build's step against its read bound per memory-speed
  bucket, and how far the fixed build's logits move from the float build's. Whole steps are what the default
  must win.

The fixed variant stays off by default: whole 1.3B steps gained 0.5-1% with it at 65-67 GB/s and nothing at 37 GB/s
(bench/README.md, "Decode attention in fixed point").

    .venv/bin/python bench/perf_decode_attention.py [--depth 974] [--rounds 300] [--split-gbs 45]
        [--checkpoint /work/ckpt-1.3b --steps 300]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import load_average, machine_info, memory_buckets, require_checkpoint, skip, write_json
from step_ab import print_buckets, whole_step_ab

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.cpu import cpu_flags
from edgeinspect.models.kernels import bindings, build
from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.stage import LayerRange, StageExecutor, load_stage


def fixed_library(folder: Path) -> ctypes.CDLL:
    """decode_attention.c with its fixed-point int8 loops (the project's flags otherwise)."""
    return bindings.variant(build.SOURCE, folder / "decode_attention_fixed.so", "EI_FIXED_ATTENTION")


def whole_steps(checkpoint: Path, builds: dict[str, ctypes.CDLL], depth: int, rounds: int, split_gbs: float) -> dict:
    """Whole int8 decode steps with each build's attention (see the module's doc and step_ab); {"skipped": why}
    where the checkpoint's int8 layers do not run as one native call here."""
    ckpt = open_checkpoint(checkpoint)
    executor = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8"))
    layers = executor.decode_layers
    if layers is None:
        return {"skipped": "this stage's decode layers do not run as one native call here (no vnni int8 kernel)"}
    setups = {name: functools.partial(layers.use_attention, builds[name]) for name in ("fixed", "float")}
    try:
        return {"checkpoint": checkpoint.name, **whole_step_ab(executor, setups, depth, rounds, split_gbs)}
    finally:
        layers.use_attention(bindings.library())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--depth", type=int, default=974, help="cached positions (the report's prompt length)")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split-gbs", type=float, default=45.0, help="probe speed between the slow and fast buckets")
    ap.add_argument("--checkpoint", type=Path, default=None, help="also time whole int8 decode steps of this model")
    ap.add_argument("--steps", type=int, default=200, help="whole steps per build (with --checkpoint)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not bindings.available():
        skip("no C compiler here to build the native kernels")
    if args.checkpoint is not None:
        require_checkpoint(args.checkpoint)
    torch.set_num_threads(args.threads)
    L, H, hd, past = args.layers, args.heads, args.head_dim, args.depth - 1
    g = torch.Generator().manual_seed(0)
    kv = KVBuffer(L, H, hd, torch.int8, capacity=past + 1)
    for layer in range(L):
        kv.write(layer, *(torch.randn(H, past, hd, generator=g) for _ in range(2)), 0)
    q = torch.randn(1, H, hd, generator=g) * 2
    k, v = (torch.randn(1, H, hd, generator=g) for _ in range(2))
    scale = hd**-0.5
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"fixed": fixed_library(Path(tmp)), "float": bindings.library()}
        cache = (ctypes.c_void_p * 1)(kv.data.data_ptr())
        capacity, pasts = (ctypes.c_int64 * 1)(kv.capacity), (ctypes.c_int * 1)(past)
        out = torch.empty(1, H * hd)

        def attend(lib, layers) -> None:
            for layer in layers:
                rc = lib.ei_decode_attention_q8(
                    1, layer, q.data_ptr(), 0, k.data_ptr(), 0, v.data_ptr(), 0, cache, capacity, pasts,
                    out.data_ptr(), H, H, hd, scale, args.threads,
                )  # fmt: skip
                if rc:
                    raise MemoryError("decode attention could not allocate its score buffers")

        errors = {}
        for name, lib in builds.items():
            attend(lib, [0])  # stores the new row at `past` too: the same bytes from either build
            want = torch.cat([
                torch.nn.functional.scaled_dot_product_attention(
                    q[0, h][None, None], *(x[h][None, None].float() for x in kv.view(0, past + 1)), scale=scale)[0, 0]
                for h in range(H)
            ], dim=-1)  # fmt: skip
            errors[name] = ((out[0] - want).norm() / want.norm()).item()
        kv_bytes = L * 2 * H * (past + 1) * (hd + 4)
        probe = torch.ones(kv_bytes // 4)
        probe.sum()
        hot, cold, probes = {n: [] for n in builds}, {n: [] for n in builds}, []
        for r in range(args.rounds):
            order = list(builds.items())[:: 1 if r % 2 else -1]  # each build first after the probe in turn
            for name, lib in order:
                t0 = time.perf_counter()
                attend(lib, [0] * L)
                hot[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            probe.sum()
            probes.append(kv_bytes / (time.perf_counter() - t0) / 1e9)
            for name, lib in order:
                t0 = time.perf_counter()
                attend(lib, range(L))
                cold[name].append(time.perf_counter() - t0)
        steps = None
        if args.checkpoint is not None:
            steps = whole_steps(args.checkpoint, builds, args.depth, args.steps, args.split_gbs)

    def ms(xs) -> float:
        return round(statistics.median(xs) * 1e3, 3)

    def cold_row(idx: list[int], gbs: float) -> dict:
        bound = kv_bytes / (gbs * 1e9) * 1e3
        row = {"rounds": len(idx), "probe_gbs_median": round(gbs, 1), "read_bound_ms": round(bound, 3)}
        for name in builds:
            t = ms([cold[name][i] for i in idx])
            row[name] = {"ms": t, "x_read_bound": round(t / bound, 3)}
        row["fixed_vs_float"] = round(row["fixed"]["ms"] / row["float"]["ms"], 3)
        return row

    buckets = memory_buckets(probes, args.split_gbs, cold_row)
    payload = {
        "benchmark": "perf_decode_attention",
        "shape": {"layers": L, "heads": H, "head_dim": hd, "depth": args.depth},
        "kv_bytes": kv_bytes,
        "fixed_point_here": "avx512_vnni" in cpu_flags() and hd in (128, 256),  # else both builds run the float loops
        "threads": args.threads,
        "hot_ms": {name: ms(xs) for name, xs in hot.items()},
        "hot_fixed_vs_float": round(ms(hot["fixed"]) / ms(hot["float"]), 3),
        "cold_buckets": buckets,
        "relative_error_vs_sdpa": {name: float(f"{e:.3g}") for name, e in errors.items()},
        "steps": steps if steps is not None else {"skipped": "no --checkpoint given"},
        "load_average": load_average(),
        "machine": machine_info(bandwidth=False),
    }
    path = write_json("perf_decode_attention", payload, args.out)
    print(f"hot (rows in L3): fixed {payload['hot_ms']['fixed']} ms, float {payload['hot_ms']['float']} ms "
          f"({payload['hot_fixed_vs_float']}x)")  # fmt: skip
    for bucket, row in buckets.items():
        print(f"cold, {bucket} memory ({row['rounds']} rounds, probe {row['probe_gbs_median']} GB/s, bound "
              f"{row['read_bound_ms']} ms): fixed {row['fixed']['ms']} ms ({row['fixed']['x_read_bound']}x), "
              f"float {row['float']['ms']} ms ({row['float']['x_read_bound']}x)")  # fmt: skip
    print(f"relative error vs fp32 SDPA: {payload['relative_error_vs_sdpa']}")
    print_buckets(payload["steps"], "fixed", "float")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
