"""The rotated down projection's decode rows in one pass (the default) vs two, by whole int8 decode steps.

down_proj reads silu(gate) * up, heavy-tailed: one unrotated 8-bit pass over it costs ~10x the error of two. On
the vnni kernel its weights and activations are rotated by block Hadamard (models/quant.py TWO_PASS_LINEARS), which
brings one pass near two unrotated ones. Prompt rows took one pass from the start (half the GEMM); decode rows kept
a second, residual pass, thought free because the GEMV reads each weight row once for both. This times whole int8
decode steps of a checkpoint at the report's depth with the native layers' down projections in one pass and in two
(bench/step_ab.py: one session each, a read probe before every step, per memory-speed bucket), and how far one pass
moves the logits from two.

On a Zen 4 EPYC with memory at 60-66 GB/s one pass took 0.964-1.003x two passes' time against the read bound (median
0.986x over 10 runs), and the same at 34-37 GB/s: so decode rows take one pass too (bench/README.md, "Decode: the
down projection in one pass").

    .venv/bin/python bench/perf_down_passes.py [--checkpoint CKPT] [--depth 974] [--steps 300] [--split-gbs 45]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, skip, write_json
from perf_decode import DEFAULT_CKPT
from step_ab import print_buckets, whole_step_ab

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import LayerRange, StageExecutor, load_stage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--depth", type=int, default=974, help="cached positions (the report's prompt length)")
    ap.add_argument("--steps", type=int, default=300, help="whole steps per setup")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split-gbs", type=float, default=45.0, help="probe speed between the slow and fast buckets")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    torch.set_num_threads(args.threads)
    ckpt = open_checkpoint(args.checkpoint)
    executor = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8"))
    layers = executor.decode_layers
    if layers is None:
        skip("this stage's decode layers do not run as one native call here (no vnni int8 kernel)")
    downs = [layer.mlp.down_proj for layer in layers.keep]
    if not all(d.rotate for d in downs):
        skip(f"down_proj's width {downs[0].in_features} has no block to rotate by: it takes two passes anyway")

    def passes(n: int | None):
        def setup() -> None:  # the native layers read each projection's flag from their ctypes structs
            for j, down in enumerate(downs):
                layers.layers[j].down.two_pass = int(down.two_pass if n is None else n == 2)

        return setup

    try:
        result = whole_step_ab(
            executor, {"one_pass": passes(1), "two_passes": passes(2)}, args.depth, args.steps, args.split_gbs
        )
    finally:
        passes(None)()  # the stage's own flags again
    payload = {
        "benchmark": "perf_down_passes",
        "checkpoint": args.checkpoint.name,
        "threads": args.threads,
        "rotation_block": downs[0].rotate,
        **result,
        "load_average": load_average(),
        "machine": machine_info(bandwidth=False),
    }
    path = write_json("perf_down_passes", payload, args.out)
    print_buckets(result, "one_pass", "two_passes")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
