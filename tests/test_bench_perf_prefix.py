"""bench/perf_prefix.py end to end on the tiny checkpoint: the cached-prefix first token against the whole prompt."""

from __future__ import annotations

from bench_scripts import run_bench


def test_perf_prefix_records_both_first_token_times_and_the_ratio_target(tiny_checkpoint, tmp_path):
    data = run_bench(
        "perf_prefix",
        "--checkpoint",
        str(tiny_checkpoint),
        "--weights",
        "fp32",
        "--context-tokens",
        "60",
        "--rounds",
        "1",
        out=tmp_path / "perf_prefix.json",
    )
    assert 0 < data["prefix_tokens"] < data["prompt_tokens"] and data["visual_tokens"] > 0
    assert data["prefix_kv_bytes"] > 0  # the stage kept the prefix
    assert data["whole_ms"] > 0 and data["cached_ms"] > 0
    rec = data["targets"]["cached_prefix_ttft_over_whole"]
    assert set(rec) == {"value", "target", "met"} and rec["value"] == round(data["cached_ms"] / data["whole_ms"], 4)
