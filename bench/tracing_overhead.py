"""What tracing costs per decode step: real stage servers (in this process, 2 stages, tiny checkpoint) stepped by
the gateway's InferenceSession with tracing off, on for every step (decode_every=1: the worst case, 5 spans per
step: the gateway's step span, a client span per stage, a server span per stage) and on at the default
(decode_every=8), JSONL export. Arms alternate in rounds, so they see the same load; each arm starts its stages
afresh with its own setting (a stage reads it at start, as a role does at entry).

The tiny checkpoint's step is a few milliseconds, so the ratio here is the least favourable; the absolute time a
traced step adds is the figure that carries over to a 1.3B step (hundreds of milliseconds).

    .venv/bin/python bench/tracing_overhead.py          # -> bench/results/tracing_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py when run as a script
from common import load_average, machine_info, write_json  # noqa: E402

from edgeinspect.config import TracingConfig  # noqa: E402

ARMS = {"off": None, "every_step": 1, "default_every_8": 8}


async def _decode_ms(ckpt: Path, steps: int, decode_every: int | None, spans: Path) -> float:
    """Median milliseconds of one decode step over `steps`, with tracing as the arm says."""
    from edgeinspect.models.checkpoint import load_processor, open_checkpoint
    from edgeinspect.services.common.tracing import setup_tracing, tracing_var
    from edgeinspect.testing import local_stages

    tracing = None
    if decode_every is not None:
        tracing = setup_tracing(TracingConfig(exporter="jsonl", jsonl_path=spans, decode_every=decode_every), "bench")
    tracing_var.set(tracing)  # before the stages start: their handlers copy this context
    tokenizer = load_processor(open_checkpoint(ckpt)).tokenizer
    ids = tokenizer("Part 7: inspect the weld seam for porosity and cracks.")["input_ids"]
    try:
        async with local_stages(ckpt, 2) as (cluster, _):
            session = cluster.session("bench", ids, chunk_tokens=0, max_positions=len(ids) + steps + 1)
            async with session:
                await session.prefill()
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    await session.decode()
                    times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    finally:
        if tracing is not None:
            tracing.shutdown()


def span_cost_us(path: Path, n: int = 2000) -> float:
    """CPU cost of one span as the step spans make them: start with 8 attributes, end, JSONL export (median µs)."""
    from edgeinspect.services.common.tracing import setup_tracing

    tracing = setup_tracing(TracingConfig(exporter="jsonl", jsonl_path=path), "bench")
    assert tracing is not None
    attrs = {f"edgeinspect.a{k}": k for k in range(8)}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        tracing.tracer.start_span("stage step", attributes=attrs).end()
        times.append((time.perf_counter() - t0) * 1e6)
    tracing.shutdown()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    from edgeinspect.models.tiny import make_tiny

    info = machine_info(bandwidth=False)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny(Path(tmp) / "tiny")
        per_arm: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm, every in ARMS.items():
                run = contextvars.copy_context().run  # each arm's tracing setting stays in its own context
                per_arm[arm].append(run(asyncio.run, _decode_ms(ckpt, args.steps, every, Path(tmp) / f"{arm}.jsonl")))
        spans_per_step = sum(1 for _ in (Path(tmp) / "every_step.jsonl").open()) / (args.rounds * args.steps)
        one_span_us = span_cost_us(Path(tmp) / "micro.jsonl")
    median = {arm: statistics.median(v) for arm, v in per_arm.items()}
    result = {
        "what": "decode step through 2 in-process stage servers (tiny checkpoint), tracing off vs on (JSONL)",
        "command": f".venv/bin/python bench/tracing_overhead.py --rounds {args.rounds} --steps {args.steps}",
        "machine": info,
        "loadavg_end": load_average(),
        "step_ms_median": median,
        "step_ms_per_round": per_arm,
        "traced_step_added_ms": median["every_step"] - median["off"],
        "ratio_every_step_vs_off": median["every_step"] / median["off"],
        "ratio_default_vs_off": median["default_every_8"] / median["off"],
        "spans_written_per_step_every_step_arm": spans_per_step,
        # the deterministic part: a traced decode step over 2 stages makes 5 spans (and 2 trace contexts)
        "one_span_us_median": one_span_us,
        "five_spans_ms": 5 * one_span_us / 1e3,
    }
    path = write_json("tracing_overhead", result)
    print(path, {k: round(v, 3) for k, v in median.items()}, f"+{result['traced_step_added_ms']:.3f} ms/traced step")
    print(f"one span: {one_span_us:.1f} us median")


if __name__ == "__main__":
    main()
