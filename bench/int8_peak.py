"""The exact int8 multiply ceiling of this CPU (AVX2, and AVX512-VNNI where it has it), and how close our prompt GEMM
comes to it.

Why the report target (<= 0.5x llama.cpp q4_0) is out of reach on a CPU without VNNI is a question of arithmetic: a
974-token prefill of the 1.3B model multiplies ~1.2 T int8 pairs in its linears, and AVX2 can only multiply int8
exactly through vpmaddwd (int16 pairs, what our ei_q8_mm does) or vpmaddubsw (u8 x s8, fbgemm's route). This
measures each route's rate from registers (bench/native/int8_peak.c, inline assembly, every thread at once), then
our GEMM (ops.q8_int_mm, the prompt rows in the row blocks the linear uses) at the checkpoint's shapes,
interleaved round by round, and reports:
  - products/s per core of each route, and ours as a fraction of the exact symmetric-int8 ceiling (the best of
    "madd", "signed" and, where measured, "vnni"; "maddubs" alone is exact only for 7-bit activations, so it is
    shown, not counted);
  - the floor this puts under the prefill's linears (their products at that ceiling) and our GEMM's time for them.
On an AVX512-VNNI CPU vpdpbusd is measured too (u8 x s8 into int32, exact for symmetric activations shifted by 128,
oneDNN's s8s8 route) and is the ceiling there; the prompt GEMM there is torch._int_mm (oneDNN).

    .venv/bin/python bench/int8_peak.py [--checkpoint CKPT] [--rounds 5] [--prompt-tokens 974] [--threads 2] [--out F]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, skip, write_json

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kernels import bindings, ops

SOURCE = Path(__file__).with_name("native") / "int8_peak.c"
DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
ROUTES = {"madd": 12 * 16, "maddubs": 12 * 32, "signed": 11 * 32}  # products per loop of the C file
VNNI_ROUTE = {"vnni": 12 * 64}  # run only where the CPU has AVX512-VNNI (elsewhere it is an illegal instruction)
EXACT_ROUTES = ("madd", "signed", "vnni")  # exact for any int8 activation row


def build(out_dir: Path) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        skip("no C compiler (cc) to build bench/native/int8_peak.c")
    binary = out_dir / "int8_peak"
    done = subprocess.run([cc, "-O2", "-fopenmp", str(SOURCE), "-o", str(binary)], capture_output=True, text=True)
    if done.returncode != 0:
        skip(f"bench/native/int8_peak.c did not build: {done.stderr.strip()[-300:]}")
    return binary


def route_rate(binary: Path, route: str, seconds: float, threads: int) -> float:
    """products/s per core of `route` with every thread busy, run for about `seconds`."""
    iters = 1_000_000
    while True:  # grow the loop until it runs long enough to time
        cmd = [str(binary), route, str(iters), str(threads)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rec = json.loads(done.stdout)
        if rec["seconds"] >= seconds:
            return rec["products_per_s_per_core"]
        iters = int(iters * max(2.0, 1.2 * seconds / max(rec["seconds"], 1e-6)))


def linear_shapes(ckpt) -> dict[str, tuple[int, int]]:
    """The language model's per-layer linears as (N, K), q/k/v and gate/up fused as the stage runs them."""
    t = ckpt.text_config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    kv = getattr(t, "num_key_value_heads", None) or t.num_attention_heads
    qkv = (t.num_attention_heads + 2 * kv) * head_dim
    return {
        "qkv": (qkv, t.hidden_size),
        "o": (t.hidden_size, t.num_attention_heads * head_dim),
        "gate_up": (2 * t.intermediate_size, t.hidden_size),
        "down": (t.hidden_size, t.intermediate_size),
    }


def gemm_seconds(rows: int, n: int, k: int, xq: torch.Tensor, w: torch.Tensor) -> float:
    """q8_int_mm over `rows` prompt rows in the row blocks ops.q8_linear uses (its int32 output bounded)."""
    block = max(ops.Q8_GEMV_ROWS, ops.Q8_OUTPUT_BYTES // (4 * n))
    t0 = time.perf_counter()
    for r0 in range(0, rows, block):
        ops.q8_int_mm(xq[r0 : r0 + block], w)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="DeepSeek-VL checkpoint folder (its shapes)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (routes, then our GEMM)")
    ap.add_argument("--prompt-tokens", type=int, default=974, help="prompt rows (the report's prompt)")
    ap.add_argument("--route-seconds", type=float, default=0.5, help="seconds each route runs per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default bench/results/int8_peak.json)")
    args = ap.parse_args()
    if platform.machine() not in ("x86_64", "AMD64"):
        skip(f"the routes are x86 AVX2 assembly; this machine is {platform.machine()}")
    machine = machine_info(bandwidth=False)
    if "avx2" not in machine["cpu_flags"]:
        skip("no AVX2 on this CPU")
    require_checkpoint(args.checkpoint)
    if bindings.q8_library() is None:
        skip("the int8 kernel (models/kernels/int8_vnni.c) cannot be built here")
    torch.set_num_threads(args.threads)
    ckpt = open_checkpoint(args.checkpoint)
    shapes = linear_shapes(ckpt)
    layers = ckpt.text_config.num_hidden_layers
    g = torch.Generator().manual_seed(0)
    data = {
        name: (
            torch.randint(-127, 128, (args.prompt_tokens, k), dtype=torch.int8, generator=g),
            torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g),
        )
        for name, (n, k) in shapes.items()
    }
    routes = ROUTES | (VNNI_ROUTE if "avx512_vnni" in machine["cpu_flags"] else {})
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(Path(tmp))
        rates: dict[str, list[float]] = {r: [] for r in routes}
        ours: dict[str, list[float]] = {s: [] for s in shapes}
        for r in range(args.rounds + 1):  # round 0 warms up
            round_rates = {route: route_rate(binary, route, args.route_seconds, args.threads) for route in routes}
            round_ours = {
                s: gemm_seconds(args.prompt_tokens, n, k, *data[s]) for s, (n, k) in shapes.items()
            }  # fmt: skip
            if r:
                for route, v in round_rates.items():
                    rates[route].append(v)
                for s, v in round_ours.items():
                    ours[s].append(v)
            print(
                f"round {r}: "
                + ", ".join(f"{route} {v / 1e9:.1f}" for route, v in round_rates.items())
                + " G products/s per core; ours "
                + ", ".join(f"{s} {v * 1e3:.1f} ms" for s, v in round_ours.items()),
                flush=True,
            )
    per_core = {route: statistics.median(v) for route, v in rates.items()}
    ceiling_route = max((r for r in EXACT_ROUTES if r in per_core), key=per_core.get)
    ceiling = per_core[ceiling_route] * args.threads
    products = {s: args.prompt_tokens * n * k for s, (n, k) in shapes.items()}
    ours_s = {s: statistics.median(v) for s, v in ours.items()}
    ours_rate = sum(products.values()) / sum(ours_s.values())
    prefill_products = sum(products.values()) * layers
    payload = {
        "benchmark": "int8_peak",
        "machine": machine
        | {
            "loadavg_end": load_average(),
            "vnni": "avx512_vnni" in machine["cpu_flags"] or "avx_vnni" in machine["cpu_flags"],
        },
        "checkpoint": str(args.checkpoint),
        "prompt_tokens": args.prompt_tokens,
        "layers": layers,
        "threads": args.threads,
        "rounds": args.rounds,
        "routes_g_products_per_s_per_core": {
            route: {"median": round(per_core[route] / 1e9, 2), "rounds": [round(v / 1e9, 2) for v in rates[route]]}
            for route in routes
        },
        "exact_ceiling": {"route": ceiling_route, "g_products_per_s": round(ceiling / 1e9, 1)},
        "ours": {
            s: {
                "shape_nk": list(shapes[s]),
                "ms": round(ours_s[s] * 1e3, 2),
                "g_products_per_s": round(products[s] / ours_s[s] / 1e9, 1),
            }
            for s in shapes
        },
        "ours_g_products_per_s": round(ours_rate / 1e9, 2),
        "ours_fraction_of_exact_ceiling": round(ours_rate / ceiling, 4),
        "prefill_linear_products": prefill_products,
        "prefill_linears_floor_s": round(prefill_products / ceiling, 2),
        "prefill_linears_ours_s": round(prefill_products / ours_rate, 2),
    }
    if payload["machine"]["vnni"] and "vnni" not in routes:
        payload["note"] = "this CPU has AVX-VNNI only (256-bit): its vpdpbusd is not measured here (AVX2 routes only)"
    path = write_json("int8_peak", payload, args.out)
    print(
        f"exact int8 ceiling ({ceiling_route}) {ceiling / 1e9:.0f} G products/s on {args.threads} threads; our prompt"
        f" GEMM {ours_rate / 1e9:.0f} G/s ({ours_rate / ceiling:.0%}); a {args.prompt_tokens}-token prefill's linears"
        f" >= {prefill_products / ceiling:.2f} s at the ceiling, ours {prefill_products / ours_rate:.2f} s -> {path}"
    )


if __name__ == "__main__":
    main()
