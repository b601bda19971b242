"""Whole int8 decode steps under two setups of one stage, in one run: which setup a default should take.

A part timed alone can win while the step it sits in does not (bench/README.md, "Decode attention in fixed point"),
so a candidate for the decode path is decided here, by whole steps of a real checkpoint at the report's depth:
one session per setup over the same cache and tokens, each step right after a read probe of the step's weight
bytes (perf_report's read bound), the setups taking turns going first; figures per memory-speed bucket (memory on
a shared box moves by +-30% within seconds), and how far the candidate's logits move from the baseline's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from common import memory_buckets
from perf_decode import step_bytes

from edgeinspect.models.stage import StageExecutor, StepInput


def whole_step_ab(
    executor: StageExecutor, setups: dict[str, Callable[[], None]], depth: int, rounds: int, split_gbs: float
) -> dict:
    """`setups`: {candidate: fn, baseline: fn} in that order, each fn putting the stage in its setup before a step.
    Returns the depth, the bytes, per-bucket rows ({name: step_ms, x_read_bound}, "<candidate>_vs_<baseline>"),
    the logits' largest relative move and the argmax agreement. The caller restores its stage's default after."""
    candidate, baseline = setups
    m, g = executor.module, torch.Generator().manual_seed(1)
    shape = (len(m.layers), 2, executor.kv_heads, depth, executor.head_dim)
    kv = executor.kv_rows(torch.randn(shape, generator=g) * 0.1)
    for name in setups:
        executor.open_from(name, kv, spare=rounds + 1)
    weight_bytes, per_position = step_bytes(m), executor.kv_bytes_per_position()
    probe = torch.ones(weight_bytes // 4)
    probe.sum()  # resident before the first probe
    probes, ratios, step_ms, moved, agree = [], {n: [] for n in setups}, {n: [] for n in setups}, [], []
    try:
        for r in range(rounds):
            logits, gbs = {}, []
            token = torch.tensor([5 + 3 * r % 90])  # the same for both sessions (ids any vocab here holds)
            for name, setup in list(setups.items())[:: 1 if r % 2 else -1]:
                setup()
                t0 = time.perf_counter()
                probe.sum()
                t1 = time.perf_counter()
                (out,) = executor.step([(name, StepInput(position=depth + r, input_ids=token))])
                t2 = time.perf_counter()
                bw = weight_bytes / (t1 - t0)
                gbs.append(bw / 1e9)
                step_ms[name].append((t2 - t1) * 1e3)
                ratios[name].append((t2 - t1) / ((weight_bytes + per_position * (depth + r)) / bw))
                logits[name] = out.logits
            probes.append(statistics.mean(gbs))
            moved.append(((logits[candidate] - logits[baseline]).norm() / logits[baseline].norm()).item())
            agree.append(bool(logits[candidate].argmax() == logits[baseline].argmax()))
    finally:
        for name in setups:
            executor.release(name)

    def row(idx: list[int], gbs: float) -> dict:
        out = {"rounds": len(idx), "probe_gbs_median": round(gbs, 1)}
        for name in setups:
            out[name] = {
                "step_ms": round(statistics.median(step_ms[name][i] for i in idx), 2),
                "x_read_bound": round(statistics.median(ratios[name][i] for i in idx), 3),
            }
        out[f"{candidate}_vs_{baseline}"] = round(out[candidate]["step_ms"] / out[baseline]["step_ms"], 3)
        return out

    return {
        "depth": depth,
        "head_dim": executor.head_dim,
        "weight_bytes": weight_bytes,
        "kv_bytes_at_depth": per_position * depth,
        "buckets": memory_buckets(probes, split_gbs, row),
        "logits_relative_change_max": float(f"{max(moved):.3g}"),
        "greedy_agreement": round(sum(agree) / len(agree), 3),
    }


def print_buckets(result: dict, candidate: str, baseline: str) -> None:
    for bucket, row in result.get("buckets", {}).items():
        c, b = row[candidate], row[baseline]
        print(f"whole steps, {bucket} memory ({row['rounds']} rounds, probe {row['probe_gbs_median']} GB/s): "
              f"{candidate} {c['step_ms']} ms ({c['x_read_bound']}x its read bound), {baseline} {b['step_ms']} ms "
              f"({b['x_read_bound']}x): {row[f'{candidate}_vs_{baseline}']}x")  # fmt: skip
    if "logits_relative_change_max" in result:
        print(f"{candidate} vs {baseline} logits: relative change <= {result['logits_relative_change_max']}, greedy "
              f"agreement {result['greedy_agreement']}")  # fmt: skip
