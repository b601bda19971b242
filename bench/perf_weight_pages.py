"""Decode with the weights on huge pages (models/weight_arena.py) vs left on 4 KiB pages, one stage each, interleaved.

Both stages are the same checkpoint's int8 (or int4) stage, loaded by load_stage; one keeps its weights where
quantization put them (weight_arena.MIN_BYTES raised past them), the other moves them into the arena as load_stage
does. Each decodes at the report's depth (a KV cache of `--depth` positions, the same values for both), step by step
in alternating order; the figure is the median per-step time ratio, and the logits must agree bit for bit.

    .venv/bin/python bench/perf_weight_pages.py [--checkpoint CKPT] [--weights int8] [--steps 120] [--depth 974]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json

from edgeinspect.models import weight_arena
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def anon_huge_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="DeepSeek-VL checkpoint folder")
    ap.add_argument("--weights", default="int8", choices=["int8", "int6", "int4"])
    ap.add_argument("--steps", type=int, default=120, help="decode steps per stage (the first 10 are not counted)")
    ap.add_argument("--depth", type=int, default=974, help="cached positions before the first step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="JSON (default bench/results/perf_weight_pages.json)")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    torch.set_num_threads(args.threads)
    machine = machine_info()
    ckpt = open_checkpoint(args.checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    huge_before = anon_huge_kib()
    minimum = weight_arena.MIN_BYTES
    executors = {}
    with torch.inference_mode():
        weight_arena.MIN_BYTES = 1 << 62  # this one keeps its weights where quantization left them
        executors["4k_pages"] = StageExecutor(load_stage(ckpt, whole, args.weights))
        weight_arena.MIN_BYTES = minimum
        executors["huge_pages"] = StageExecutor(load_stage(ckpt, whole, args.weights))
        huge_kib = anon_huge_kib() - huge_before
        first = executors["4k_pages"]
        shape = (ckpt.num_layers, 2, first.kv_heads, args.depth, first.head_dim)
        kv = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 0.1
        for ex in executors.values():
            ex.open_from("s", ex.kv_rows(kv), spare=args.steps + 8)
        times: dict[str, list[float]] = {name: [] for name in executors}
        identical = True
        for i in range(args.steps):
            step = StepInput(position=args.depth + i, input_ids=torch.tensor([5 + i % 50]))
            logits = {}
            for name in list(executors) if i % 2 else list(executors)[::-1]:
                t0 = time.perf_counter()
                logits[name] = executors[name].step([("s", step)])[0].logits
                times[name].append(time.perf_counter() - t0)
            identical &= torch.equal(logits["4k_pages"], logits["huge_pages"])
    ratios = [h / f for h, f in zip(times["huge_pages"][10:], times["4k_pages"][10:], strict=True)]
    payload = {
        "benchmark": "perf_weight_pages",
        "machine": machine
        | {"loadavg_end": load_average(), "thp": THP.read_text().strip() if THP.exists() else "absent"},
        "checkpoint": str(args.checkpoint),
        "weights": args.weights,
        "depth": args.depth,
        "steps_counted": len(ratios),
        "anon_huge_pages_mib_added": round(huge_kib / 1024, 1),
        "decode_ms": {name: round(statistics.median(t[10:]) * 1e3, 2) for name, t in times.items()},
        "logits_identical": identical,
        "targets": {"decode_huge_vs_4k_pages": target(statistics.median(ratios), 1.0, higher_is_better=False)},
    }
    path = write_json("perf_weight_pages", payload, args.out)
    print(
        f"decode {payload['decode_ms']['huge_pages']} ms on huge pages vs {payload['decode_ms']['4k_pages']} ms: "
        f"{statistics.median(ratios):.3f}x per step (median of {len(ratios)}), logits identical: {identical}, "
        f"huge pages +{payload['anon_huge_pages_mib_added']} MiB -> {path}"
    )
    if not identical:
        raise SystemExit("the two stages' logits differ: the arena changed the weights")


if __name__ == "__main__":
    main()
