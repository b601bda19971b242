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
- error: each build's output vs fp32 SDPA over the same stored rows (relative norm error).

The fixed variant stays off by default until a run with fast memory shows it faster from memory (see
bench/README.md, "Decode attention in fixed point").

    .venv/bin/python bench/perf_decode_attention.py [--depth 974] [--rounds 300] [--split-gbs 45]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import load_average, machine_info, skip, write_json

from edgeinspect.models import kernels
from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.quant import cpu_flags


def fixed_library(folder: Path) -> ctypes.CDLL:
    """decode_attention.c with its fixed-point int8 loops (the project's flags otherwise)."""
    return kernels.variant(kernels.SOURCE, folder / "decode_attention_fixed.so", "EI_FIXED_ATTENTION")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--depth", type=int, default=974, help="cached positions (the report's prompt length)")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split-gbs", type=float, default=45.0, help="probe speed between the slow and fast buckets")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not kernels.available():
        skip("no C compiler here to build the native kernels")
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
        builds = {"fixed": fixed_library(Path(tmp)), "float": kernels.library()}
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

    def ms(xs) -> float:
        return round(statistics.median(xs) * 1e3, 3)

    buckets = {}
    for bucket, keep in (("slow", lambda x: x < args.split_gbs), ("fast", lambda x: x >= args.split_gbs)):
        idx = [i for i, gbs in enumerate(probes) if keep(gbs)]
        if not idx:
            continue
        gbs = statistics.median(probes[i] for i in idx)
        bound = kv_bytes / (gbs * 1e9) * 1e3
        row = {"rounds": len(idx), "probe_gbs_median": round(gbs, 1), "read_bound_ms": round(bound, 3)}
        for name in builds:
            t = ms([cold[name][i] for i in idx])
            row[name] = {"ms": t, "x_read_bound": round(t / bound, 3)}
        row["fixed_vs_float"] = round(row["fixed"]["ms"] / row["float"]["ms"], 3)
        buckets[bucket] = row
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
    print(f"-> {path}")


if __name__ == "__main__":
    main()
