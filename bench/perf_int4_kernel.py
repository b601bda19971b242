"""The int4 and int6 decode kernels against the int8 ones (vnni, fbgemm) and torch's int4 CPU matmul, 1.3B shapes.

Each round times every subject once per shape, interleaved, so load from other jobs falls on all alike. On a
shared box the minimum over rounds is the figure least disturbed by preemption (the median is recorded too);
bytes read per call over that time is the achieved read bandwidth.

    .venv/bin/python bench/perf_int4_kernel.py [--rounds 30] [--rows 1] [--threads 2] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, target, write_json
from torch import nn

from edgeinspect.models.int4 import Int4Linear, Int6Linear
from edgeinspect.models.kernels import bindings
from edgeinspect.models.quant import Int8Linear, vnni_available

# DeepSeek-VL 1.3B: fused qkv, o_proj, fused gate_up, down_proj, lm_head ([N, K])
SHAPES = {"qkv": (6144, 2048), "o": (2048, 2048), "gate_up": (11264, 2048), "down": (2048, 5632)}
SPEEDUP_TARGET = 1.5  # int4 over int8 per byte-halving: a read-bound kernel would approach 1.78 (1.0 / 0.5625)


def torch_int4(linear: nn.Linear):
    """torch's _weight_int4pack_mm_for_cpu (bf16 activations, group 32), or None where this build lacks it."""
    try:
        n, k = linear.weight.shape
        w = linear.weight.detach().reshape(n, k // 32, 32)
        lo, hi = w.amin(-1), w.amax(-1)
        s = ((hi - lo) / 15).clamp(min=1e-8)
        q = torch.round((w - lo[..., None]) / s[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
        sz = torch.stack([s, lo + 8 * s], -1).transpose(0, 1).contiguous().bfloat16()  # [K/32, N, 2]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, 32, sz)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch (and so the int4 kernel's OpenMP) threads")
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON to write (default bench/results/perf_int4_kernel.json)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()
    g = torch.Generator().manual_seed(0)
    subjects, nbytes = {}, {}
    for name, (n, k) in SHAPES.items():
        lin = nn.Linear(k, n, bias=False)
        with torch.no_grad():
            lin.weight.normal_(0, 0.02, generator=g)
        q4, q6 = Int4Linear(lin, prefill=False, kernel="ours"), Int6Linear(lin, prefill=False, kernel="ours")
        q8 = Int8Linear.from_linear(lin, "fbgemm")
        subjects[name] = {"int4_ours": q4, "int6_ours": q6, "int8_fbgemm": q8}
        nbytes[name] = {
            "int4_ours": q4.weight_bytes(),
            "int6_ours": q6.weight_bytes(),
            "int8_fbgemm": q8.weight_bytes(),
        }
        if vnni_available():
            subjects[name]["int8_vnni"] = Int8Linear.from_linear(lin, "vnni")
            nbytes[name]["int8_vnni"] = q8.weight_bytes()
        t4 = torch_int4(lin)
        if t4 is not None:
            subjects[name]["int4_torch"] = t4
            nbytes[name]["int4_torch"] = n * k // 2 + 4 * n * k // 32
    x = torch.randn(args.rows, 2048, generator=g)
    xd = torch.randn(args.rows, 5632, generator=g)
    times = {s: {f: [] for f in subj} for s, subj in subjects.items()}
    for _ in range(args.rounds + 1):  # round 0 warms up
        for shape, subj in subjects.items():
            inp = xd if shape == "down" else x
            for fmt, fn in subj.items():
                t0 = time.perf_counter()
                fn(inp)
                times[shape][fmt].append(time.perf_counter() - t0)
    rows = {}
    for shape, per in times.items():
        rows[shape] = {}
        for fmt, t in per.items():
            best, med = min(t[1:]), statistics.median(t[1:])
            rows[shape][fmt] = {
                "min_ms": round(best * 1e3, 3),
                "median_ms": round(med * 1e3, 3),
                "bytes": nbytes[shape][fmt],
                "gbs_at_min": round(nbytes[shape][fmt] / best / 1e9, 2),
            }
        print(shape, rows[shape], flush=True)
    total = {f: sum(rows[s][f]["min_ms"] for s in rows) for f in next(iter(rows.values()))}
    int8 = min(total[f] for f in total if f.startswith("int8"))  # against the faster int8 kernel here
    speedup = int8 / total["int4_ours"]
    payload = {
        "benchmark": "perf_int4_kernel",
        "machine": machine | {"loadavg_end": load_average(), "int4_simd": bindings.int4_fast()},
        "rows_per_call": args.rows,
        "threads": args.threads,
        "rounds": args.rounds,
        "shapes": rows,
        "layer_min_ms": {f: round(v, 3) for f, v in total.items()},
        "int6_vs_int8_layer_speedup": round(int8 / total["int6_ours"], 3),  # recorded: 1 / 0.8125 if read-bound
        "targets": {"int4_vs_int8_layer_speedup": target(speedup, SPEEDUP_TARGET)},
    }
    print(f"one layer's linears (min over rounds): {total}; int4 speedup {speedup:.2f}")
    print(f"-> {write_json('perf_int4_kernel', payload, args.out)}")


if __name__ == "__main__":
    main()
