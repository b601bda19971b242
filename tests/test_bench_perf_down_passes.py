"""bench/perf_down_passes.py: whole int8 decode steps with the rotated down projection in one pass and in two."""

from __future__ import annotations

from bench_scripts import native_decode_layers, run_bench

from edgeinspect.models import quant


@native_decode_layers
def test_the_bench_times_whole_steps_in_one_pass_and_in_two_and_each_really_ran(tiny_checkpoint, tmp_path):
    data = run_bench(
        "perf_down_passes", "--checkpoint", str(tiny_checkpoint), "--depth", "40", "--steps", "5",
        "--split-gbs", "0", out=tmp_path / "down.json",
    )  # fmt: skip
    assert data["rotation_block"] == quant.rotation_block(176)  # the tiny model's intermediate width
    assert data["depth"] == 40 and data["weight_bytes"] > 0 and data["kv_bytes_at_depth"] > 0
    fast = data["buckets"]["fast"]  # a split at 0 GB/s puts every round in one bucket
    assert fast["rounds"] == 5 and fast["one_pass_vs_two_passes"] > 0
    for name in ("one_pass", "two_passes"):
        assert fast[name]["step_ms"] > 0 and fast[name]["x_read_bound"] > 0
    # one session really ran without the residual pass (other bits), which moved the logits only by rounding
    assert 0 < data["logits_relative_change_max"] < 0.05
