"""How far ahead the decode kernels should prefetch their weights: one build per distance, against a read probe.

A decode step streams every weight once from memory, so its kernels prefetch into L2 a fixed number of bytes ahead
of the stream (models/kernels/int8_vnni.c PREFETCH; int4_gemm.c PREFETCH_INT4 / PREFETCH_INT6 on AVX-512). The
best distance depends on the CPU, on the format (int6's loop does more work per byte than int8's) and on how fast
the memory reads at the time: on the Zen 4 EPYC here the read probe moved between ~30 and ~60 GB/s within a
minute. This builds the format's kernel once per distance (the sources take the distance as a -D override),
lays out one 1.3B decode step's weights (24 layers of fused qkv, o_proj, fused gate_up, down_proj, and the
lm_head; random values, on 2 MiB pages as a stage's are, models/weight_arena.py) and, round by round, runs the
step's linears with each build right after a probe summing as many bytes (as bench/perf_report.py's read bound
does). Each figure is a build's time over its probe's, median per memory-speed bucket (the probe below or above
--split-gbs), so builds are compared at the same memory speed.

int8 runs the vnni GEMV (down_proj with its residual pass, rotated, as an int8 stage runs it); int4 and int6 run
int4_gemm.c on every linear (an int4 stage keeps down_proj and the lm_head in int8: the loop's streaming is what
this measures). Skips without a C compiler, and for int4/int6 on CPUs without AVX512-VNNI (their AVX2 loop's
distance is fixed; the int8 sweep there moves the AVX2 GEMV's).

    .venv/bin/python bench/prefetch_sweep.py [--format int8|int4|int6] [--distances 2048,4096,8192]
        [--rounds 80] [--layers 24] [--split-gbs 38] [--out F]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import cpu_flags, load_average, machine_info, memory_buckets, skip, write_json

from edgeinspect.models.kernels import bindings
from edgeinspect.models.kernels import build as kernel_build
from edgeinspect.models.weight_arena import huge_page_buffer

D, INTERMEDIATE, VOCAB = 2048, 5632, 102400
DOWN_ROTATION = 512  # the int8 down_proj's Hadamard block at the 1.3B width (models/quant.py)
MACRO = {"int8": "PREFETCH", "int4": "PREFETCH_INT4", "int6": "PREFETCH_INT6"}  # each format's distance


def shapes(layers: int) -> list[tuple[int, int, bool]]:
    """(out, in, down) of one decode step's linears in the order a step runs them."""
    per_layer = [(3 * D, D, False), (D, D, False), (2 * INTERMEDIATE, D, False), (D, INTERMEDIATE, True)]
    return per_layer * layers + [(VOCAB, D, False)]


def weight_bytes(fmt: str, n: int, k: int) -> int:
    """Streamed bytes of one [n, k] linear's weights: int8 row-major; int4/int6 packed 64-weight blocks (32 / 48
    bytes; their fp16 scales, one per 32 weights, are counted apart)."""
    return n * k if fmt == "int8" else n * k // 64 * (32 if fmt == "int4" else 48)


def build(fmt: str, distance: int, folder: Path) -> ctypes.CDLL:
    """The format's kernel source compiled with its distance macro set (the project's flags, an uncached file)."""
    source = kernel_build.Q8_SOURCE if fmt == "int8" else kernel_build.INT4_SOURCE
    return bindings.variant(source, folder / f"{fmt}-{distance}.so", f"{MACRO[fmt]}={distance}")


def step_linears(fmt: str, layers: int):
    """One step's weights as random bytes in one huge-page mapping (as a stage's, models/weight_arena.py), and per
    linear (n, k, down, weight address, scale address); the tensors to keep alive; the bytes a step reads."""
    plan = shapes(layers)
    sizes = [weight_bytes(fmt, n, k) for n, k, _ in plan]
    data, _ = huge_page_buffer(sum(sizes))
    chunk = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for i in range(0, data.numel(), chunk.numel()):
        data[i : i + chunk.numel()] = chunk[: data.numel() - i]
    scales, linears, offset = [], [], 0
    for (n, k, down), size in zip(plan, sizes, strict=True):
        # fp32 per row (int8), fp16 per 32 weights (int4/int6): finite values (random bytes could be NaNs)
        s = torch.full((n,), 1e-3) if fmt == "int8" else torch.full((n * k // 32,), 1e-3, dtype=torch.float16)
        scales.append(s)
        linears.append((n, k, down, data.data_ptr() + offset, s.data_ptr()))
        offset += size
    return (data, scales), linears, sum(sizes) + sum(s.numel() * s.element_size() for s in scales)


def runner(fmt: str, lib: ctypes.CDLL, linears, threads: int):
    """A function that runs the step's linears once with `lib` and returns seconds."""
    x = torch.randn(2 * INTERMEDIATE)
    y = torch.empty(VOCAB)
    row_sums = torch.zeros(VOCAB, dtype=torch.int32)

    def run_int8() -> float:
        t0 = time.perf_counter()
        for n, k, down, w, s in linears:
            rc = lib.ei_q8_gemv_rows(
                1, n, k, int(down), DOWN_ROTATION if down else 0, x.data_ptr(), k, w, s, row_sums.data_ptr(),
                y.data_ptr(), threads,
            )  # fmt: skip
            if rc:
                raise RuntimeError(f"int8 GEMV failed ({rc})")
        return time.perf_counter() - t0

    if fmt == "int8":
        return run_int8
    gemm = lib.ei_int4_gemm if fmt == "int4" else lib.ei_int6_gemm

    def run_packed() -> float:
        t0 = time.perf_counter()
        for n, k, _, w, s in linears:
            if gemm(1, n, k, x.data_ptr(), k, w, s, y.data_ptr(), n, threads):
                raise RuntimeError(f"{fmt} kernel failed")
        return time.perf_counter() - t0

    return run_packed


def summarise(samples: list[tuple[float, float, float]], split: float) -> dict:
    """(probe GB/s, step ms, step / probe time) samples -> medians per memory-speed bucket."""

    def row(idx: list[int], gbs: float) -> dict:
        return {
            "rounds": len(idx),
            "probe_gbs_median": round(gbs, 1),
            "step_ms_median": round(statistics.median(samples[i][1] for i in idx), 2),
            "x_probe_median": round(statistics.median(samples[i][2] for i in idx), 3),
        }

    return memory_buckets([s[0] for s in samples], split, row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", choices=sorted(MACRO), default="int8")
    ap.add_argument("--distances", default="2048,4096,8192", help="bytes ahead, comma-separated")
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split-gbs", type=float, default=38.0, help="probe speed between the slow and fast buckets")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if kernel_build.compiler() is None:
        skip("no C compiler (set CC or install gcc): the kernels cannot be built per distance")
    if args.format != "int8" and not {"avx512f", "avx512bw", "avx512_vnni"} <= set(cpu_flags()):
        skip(f"the {args.format} distance is the AVX512-VNNI loop's ({MACRO[args.format]}): not this CPU's")
    distances = [int(d) for d in args.distances.split(",")]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="prefetch-sweep-") as folder:
        libs = {d: build(args.format, d, Path(folder)) for d in distances}
        keep, linears, total = step_linears(args.format, args.layers)
        runs = {d: runner(args.format, lib, linears, args.threads) for d, lib in libs.items()}
        probe = torch.ones(total // 4)
        probe.sum()  # resident before the first probe
        for run in runs.values():
            run()  # each build's first pass (page mapping, lazy binding) left out
        samples: dict[int, list] = {d: [] for d in distances}
        for _ in range(args.rounds):
            for d, run in runs.items():
                t0 = time.perf_counter()
                probe.sum()
                probe_s = time.perf_counter() - t0
                step_s = run()
                samples[d].append((total / probe_s / 1e9, step_s * 1e3, step_s / probe_s))
        del keep
    per_distance = {str(d): summarise(samples[d], args.split_gbs) for d in distances}
    best = {}
    for bucket in ("slow", "fast"):
        have = {d: v[bucket]["x_probe_median"] for d, v in per_distance.items() if bucket in v}
        if have:
            best[bucket] = min(have, key=have.get)
    payload = {
        "benchmark": "prefetch_sweep",
        "format": args.format,
        "layers": args.layers,
        "threads": args.threads,
        "rounds": args.rounds,
        "bytes_per_step": total,
        "split_gbs": args.split_gbs,
        "per_distance": per_distance,
        "best_distance": best,
        "load_average": load_average(),
        "machine": machine_info(bandwidth=False),
    }
    path = write_json(f"prefetch_sweep_{args.format}", payload, args.out)
    for d, v in per_distance.items():
        parts = [f"{b}: {r['x_probe_median']:.3f}x the probe ({r['rounds']} rounds, {r['probe_gbs_median']} GB/s)"
                 for b, r in v.items()]  # fmt: skip
        print(f"{args.format} prefetch {d:>6} B  " + "; ".join(parts))
    print(f"best per bucket: {best} -> {path}")


if __name__ == "__main__":
    main()
