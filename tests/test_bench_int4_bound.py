"""bench/perf_int4_bound.py end to end on the tiny checkpoint: the q4_0 round trip, the noise sweep, the bound."""

from __future__ import annotations

import math

from bench_scripts import run_bench


def test_int4_bound_sweeps_noise_and_compares_with_the_rate_distortion_bound(tiny_checkpoint, tmp_path):
    data = run_bench("perf_int4_bound", "--checkpoint", str(tiny_checkpoint), "--bisect", "3", out=tmp_path / "b.json")
    # the q4_0 grid on i.i.d. Gaussian weights: ~8.6% relative RMS error (group 32, absmax / 8 scale)
    assert 0.07 < data["q4_0_round_trip"]["rho"] < 0.10
    assert data["rate_distortion_rho_at_4.5_bits"] == round(2**-4.5, 5)
    low, high = data["rho_meeting_target"], data["rho_missing_target"]
    assert 0 < low < high  # bisected: the target holds at the lower rho and fails at the higher
    sweep = {row["rho"]: row["min_cosine"] for row in data["sweep"]}
    assert sweep[round(low, 5)] >= data["cosine_target"] > sweep[round(high, 5)]
    assert data["bits_per_weight_needed"] == [round(math.log2(1 / high), 2), round(math.log2(1 / low), 2)]
    assert data["reachable_at_4.5_bits"] == (data["rate_distortion_rho_at_4.5_bits"] < high)


def test_int4_bound_skips_without_a_checkpoint(tmp_path):
    import subprocess
    import sys

    from bench_scripts import BENCH_DIR

    proc = subprocess.run(
        [sys.executable, str(BENCH_DIR / "perf_int4_bound.py"), "--checkpoint", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "SKIPPED" in proc.stdout + proc.stderr
