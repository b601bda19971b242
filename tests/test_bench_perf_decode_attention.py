"""bench/perf_decode_attention.py: int8 decode attention in fixed point vs the default float loops, one run."""

from __future__ import annotations

import pytest
from bench_scripts import run_bench

from edgeinspect.models import kernels
from edgeinspect.models.quant import cpu_flags


@pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the native kernels")
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
