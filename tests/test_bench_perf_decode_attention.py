"""bench/perf_decode_attention.py: int8 decode attention in fixed point vs the default float loops, one run."""

from __future__ import annotations

import pytest
from bench_scripts import native_decode_layers, run_bench

from edgeinspect.models.cpu import cpu_flags
from edgeinspect.models.kernels import bindings

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


@pytest.mark.skipif(not bindings.available(), reason="no C compiler here to build the native kernels")
def test_the_bench_times_both_builds_hot_and_cold_and_reports_their_error(tmp_path):
    data = run_bench(
        "perf_decode_attention", "--layers", "2", "--heads", "4", "--depth", "40", "--rounds", "4",
        "--split-gbs", "0", out=tmp_path / "attention.json",
    )  # fmt: skip
    assert data["fixed_point_here"] == ("avx512_vnni" in cpu_flags())
    assert data["kv_bytes"] == 2 * 2 * 4 * 40 * (128 + 4)
    assert set(data["hot_ms"]) == {"fixed", "float"} and all(ms > 0 for ms in data["hot_ms"].values())
    fast = data["cold_buckets"]["fast"]  # a split at 0 GB/s puts every round in one bucket
    assert fast["rounds"] == 4 and fast["fixed"]["ms"] > 0 and fast["float"]["ms"] > 0
    error = data["relative_error_vs_sdpa"]
    assert error["float"] < 1e-5
    if data["fixed_point_here"]:
        assert 1e-6 < error["fixed"] < 3e-4  # the fixed-point loops really ran, within their rounding
    else:
        assert error["fixed"] == error["float"]  # without VNNI both builds run the float loops


@native_decode_layers
def test_the_bench_times_whole_steps_of_a_checkpoint_with_each_build(tiny_checkpoint, tmp_path):
    data = run_bench(
        "perf_decode_attention", "--layers", "1", "--heads", "2", "--depth", "40", "--rounds", "2",
        "--checkpoint", str(tiny_checkpoint), "--steps", "5", "--split-gbs", "0", out=tmp_path / "attention.json",
    )  # fmt: skip
    steps = data["steps"]
    assert steps["depth"] == 40 and steps["kv_bytes_at_depth"] > 0 and steps["weight_bytes"] > 0
    fast = steps["buckets"]["fast"]  # a split at 0 GB/s puts every round in one bucket
    assert fast["rounds"] == 5
    for name in ("fixed", "float"):
        assert fast[name]["step_ms"] > 0 and fast[name]["x_read_bound"] > 0
    assert steps["head_dim"] == 16  # the tiny model's heads: both builds run the float loops, so the same logits
    assert steps["logits_relative_change_max"] == 0 and steps["greedy_agreement"] == 1.0
