"""bench/perf_report.py end to end on the tiny checkpoint: both sides run and the JSON carries every record."""

from __future__ import annotations

import pytest
from bench_scripts import run_bench


@pytest.mark.slow  # ~1 min on the shared 2 cores: ONNX export + quantization, two stages, the baseline
def test_perf_report_writes_baseline_ours_phases_and_the_ratio_target(tiny_checkpoint, tmp_path):
    out = tmp_path / "perf_report.json"
    data = run_bench(
        "perf_report",
        "--checkpoint",
        str(tiny_checkpoint),
        "--tokens",
        "4",
        "--context-tokens",
        "40",
        "--formats",
        "fp32,bf16",
        "--onnx-dir",
        str(tmp_path / "onnx"),
        out=out,
    )
    rec = data["targets"]["report_time_ours_vs_transformers_bf16"]
    assert set(rec) == {"value", "target", "met"} and rec["target"] == 0.4 and rec["value"] > 0
    assert data["ours"]["format"] in {"fp32", "bf16"}
    for row in (data["baseline"], data["candidates"]["fp32"], data["candidates"]["bf16"]):
        assert row["generated"] == 4  # EOS ignored on both sides
        assert row["prompt_tokens"] == data["baseline"]["prompt_tokens"]  # the same prompt on both sides
        for phase in ("preprocess_s", "vision_s", "prefill_s", "decode_ms_per_token", "read_bound_ms"):
            assert row[phase] > 0
    assert data["candidates"]["fp32"]["first_logits_cosine_vs_baseline"] >= 0.99
    assert data["candidates"]["fp32"]["first_logits_cosine_vs_fp32"] == 1.0  # fp32 is the formats' reference
    assert "loadavg_end" in data["machine"] and "read_bandwidth_gbs_2_threads" in data["machine"]
    # decode against a bandwidth probe taken just before each step, at the report's depth (not fp32: the reference)
    bound = data["candidates"]["bf16"]["at_read_bound"]
    assert bound["depth"] == data["baseline"]["prompt_tokens"] and bound["steps"] == 32
    assert bound["x_read_bound"] > 0 and bound["probe_gbs_median"] > 0
    # the bound counts the cache the step reads at that depth, so it is the tighter of the two ratios' bounds
    assert bound["kv_bytes_at_depth"] > 0 and bound["x_weight_read_bound"] > bound["x_read_bound"]
    assert "at_read_bound" not in data["candidates"]["fp32"]
