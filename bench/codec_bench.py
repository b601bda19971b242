"""Tensor codec benchmark: size, error and encode/decode time of every codec (with and without zstd) on
hidden-state-like data. The baseline for ratios is raw fp32, measured in the same run.

    .venv/bin/python bench/codec_bench.py [--repeats 20] [--out bench/results/codec.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from edgeinspect.codec import Codec, decode, encode

# the tensors that cross the wire: one decode step's hidden state, the visual tokens, a prefill's hidden states
SHAPES = {
    "decode hop [1, 2048]": (1, 2048),
    "visual tokens [576, 1024]": (576, 1024),
    "prefill [606, 2048]": (606, 2048),
}


def hidden_like(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Normal values with LLaMA-style outliers: a few channels ~30x larger everywhere, and rare spikes ~50x."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)  # [T, D]
    channels = torch.randperm(shape[-1], generator=g)[:4]
    x[..., channels] *= 30.0
    spikes = torch.rand(shape, generator=g) < 5e-4
    x[spikes] *= 50.0
    return x


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(x: torch.Tensor, codec: Codec, zstd: bool, repeats: int) -> dict:
    e = encode(x, codec, zstd)
    y = decode(e, expect_shape=tuple(x.shape))
    err = (y - x).abs()
    raw_fp32 = 4 * x.numel()
    return {
        "codec": codec.value,
        "zstd": zstd,
        "wire_bytes": len(e.payload),
        "ratio_vs_fp32": round(len(e.payload) / raw_fp32, 4),
        "max_abs_err": float(err.max()),
        "max_rel_err": float(err.max() / x.abs().max()),  # relative to the tensor's largest value
        "rms_rel_err": float(err.pow(2).mean().sqrt() / x.pow(2).mean().sqrt()),
        "encode_ms": round(_median_ms(lambda: encode(x, codec, zstd), repeats), 4),
        "decode_ms": round(_median_ms(lambda: decode(e, expect_shape=tuple(x.shape)), repeats), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20, help="timed runs per measurement (median reported)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results") / "codec.json")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the codec itself is numpy; one thread keeps the timings comparable
    results = {}
    for label, shape in SHAPES.items():
        x = hidden_like(shape)
        repeats = args.repeats * (50 if x.numel() < 10_000 else 1)
        rows = [measure(x, c, z, repeats) for c in Codec for z in (False, True)]
        results[label] = rows
        print(f"\n{label}")
        print(
            f"{'codec':>6} {'zstd':>5} {'bytes':>9} {'x fp32':>7} {'max abs':>9} {'max rel':>9} "
            f"{'rms rel':>9} {'enc ms':>8} {'dec ms':>8}"
        )
        for r in rows:
            print(
                f"{r['codec']:>6} {str(r['zstd']):>5} {r['wire_bytes']:>9} {r['ratio_vs_fp32']:>7.3f} "
                f"{r['max_abs_err']:>9.2e} {r['max_rel_err']:>9.2e} {r['rms_rel_err']:>9.2e} "
                f"{r['encode_ms']:>8.3f} {r['decode_ms']:>8.3f}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "data": hidden_like.__doc__,
    }
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
