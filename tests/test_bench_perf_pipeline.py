"""bench/perf_pipeline.py end to end on the tiny checkpoint: real pinned stage processes on both sides, every record."""

from __future__ import annotations

import os
import shutil

import pytest
from bench_scripts import run_bench


@pytest.mark.slow  # four configurations, each starting real stage processes: ~70 s on the shared 2-core box
@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_perf_pipeline_writes_ttft_and_decode_records_against_the_monolith(tiny_checkpoint, tmp_path):
    out = tmp_path / "perf_pipeline.json"
    data = run_bench(
        "perf_pipeline",
        "--checkpoint",
        str(tiny_checkpoint),
        "--weights",
        "fp32",
        "--decode-weights",
        "bf16",
        "--chunks",
        "16,32",
        "--monolith-chunk",
        "32",
        "--context-tokens",
        "40",
        "--decode-tokens",
        "3",
        "--concurrency",
        "2",
        "--no-bandwidth",
        out=out,
    )
    ttft = data["ttft"]
    assert ttft["weights"] == "fp32" and ttft["image_tokens"] > 0
    assert set(ttft["monolith"]["runs"]) == {"whole", "32"} and set(ttft["split"]["runs"]) == {"16", "32"}
    assert ttft["split"]["cores"] != ttft["monolith"]["cores"] or len(os.sched_getaffinity(0)) == 1
    for run in [*ttft["monolith"]["runs"].values(), *ttft["split"]["runs"].values()]:
        assert run["ttft_ms"] > 0 and run["busiest_stage_compute_ms"] > 0
    bf16 = data["throughput"]["formats"]["bf16"]
    for side in ("monolith", "split"):
        assert bf16[side]["runs"]["2"]["decode_tokens"] == 6 and bf16[side]["runs"]["2"]["tokens_per_s"] > 0
    targets = data["targets"]
    assert set(targets) == {"ttft_split_vs_monolith", "decode_split_vs_S_x_monolith_bf16_C2"}
    assert targets["ttft_split_vs_monolith"]["target"] == 0.65
    assert targets["decode_split_vs_S_x_monolith_bf16_C2"]["value"] == pytest.approx(
        bf16["split_vs_S_x_monolith"]["2"], abs=1e-3
    )
    assert "loadavg_end" in data["machine"]
