"""bench/prefetch_sweep.py end to end on a small step: one int8 library built per prefetch distance, each run
against a read probe, the rounds split by the probe's speed."""

from __future__ import annotations

import pytest
from bench_scripts import run_bench

from edgeinspect.models.cpu import cpu_flags, cpu_isa
from edgeinspect.models.kernels import bindings


@pytest.mark.skipif(bindings.q8_library() is None, reason="needs a C compiler and the int8 kernel built")
def test_prefetch_sweep_times_one_build_per_distance_against_the_probe(tmp_path):
    data = run_bench(
        "prefetch_sweep",
        *("--format", "int8", "--layers", "1", "--rounds", "3", "--distances", "2048,8192", "--split-gbs", "1000"),
        out=tmp_path / "sweep.json",
    )
    # one layer (qkv 6144x2048, o 2048x2048, gate_up 11264x2048, down 2048x5632) and the lm_head, int8 + fp32 scales
    weights = 6144 * 2048 + 2048 * 2048 + 11264 * 2048 + 2048 * 5632 + 102400 * 2048
    assert data["bytes_per_step"] == weights + 4 * (6144 + 2048 + 11264 + 2048 + 102400)
    assert set(data["per_distance"]) == {"2048", "8192"}
    for buckets in data["per_distance"].values():
        assert set(buckets) == {"slow"}  # every probe below 1000 GB/s
        rec = buckets["slow"]
        assert rec["rounds"] == 3 and rec["probe_gbs_median"] > 0.5
        # the step reads its ~240 MB once: within a broad factor of the probe summing as many bytes
        assert 0.2 < rec["x_probe_median"] < 20 and rec["step_ms_median"] > 1
    assert data["best_distance"]["slow"] in ("2048", "8192")
    # the SIMD flags that pick the kernels, less those EDGEINSPECT_CPU_ISA hides where a run caps it (an ARM box: none)
    assert data["machine"]["cpu_flags"] == sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma", "f16c")))
    assert data["machine"]["cpu_isa"] == cpu_isa()
