"""bench/perf_int4_gptq.py: GPTQ on the q4_0 grid, checked on its own terms, and the bench end to end on tiny."""

from __future__ import annotations

import sys

import torch
from bench_scripts import BENCH_DIR, run_bench


def gptq_module():
    sys.path.insert(0, str(BENCH_DIR))
    import perf_int4_gptq

    return perf_int4_gptq


def test_gptq_with_an_isotropic_gram_is_plain_q4_0_rounding():
    """With X^T X = c I no error has anywhere better to go: GPTQ must give the q4_0 round trip bit for bit (same
    grid, same fp16 scales), which pins its grid and scale rule to the int4 format's."""
    bench = gptq_module()
    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(0)) * 0.02
    w[3, 32:64] = 0  # an all-zero group: scale 0, values 0, as quantize_q4 stores it
    got = bench.gptq_q4(w, 7.0 * torch.eye(256, dtype=torch.float64), damp=0.01)
    assert torch.equal(got, bench.round_trip_q4(w))


def test_gptq_lowers_the_output_error_on_the_inputs_it_saw():
    """On correlated inputs, GPTQ's output error tr(dW G dW^T) must come out below plain rounding's, the more so the
    less it is damped; its weight error may grow (it trades weight error for output error)."""
    bench = gptq_module()
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=gen) * 0.02
    x = torch.randn(512, 16, generator=gen) @ torch.randn(16, 256, generator=gen) + 0.1 * torch.randn(512, 256)
    gram = (x.T @ x).double()
    plain = bench.output_error([("l.q_proj", w, bench.round_trip_q4(w))], {"l.q_proj": gram})
    errors = [
        bench.output_error([("l.q_proj", w, bench.gptq_q4(w, gram, damp))], {"l.q_proj": gram}) for damp in (0.01, 1.0)
    ]
    assert errors[0] < errors[1] < plain
    assert errors[0] < 0.5 * plain


def test_int4_gptq_bench_calibrates_on_the_knowledge_base_and_records_each_damping(tiny_checkpoint, tmp_path):
    args = ("--checkpoint", str(tiny_checkpoint), "--damp", "0.1,10")
    data = run_bench("perf_int4_gptq", *args, out=tmp_path / "g.json")
    assert data["calibration_tokens"] == 2048  # the sample KB holds more than that
    assert set(data["inputs"]) == {"attention", "o_proj", "mlp"}
    assert all(row["am_gm_median"] >= 1 and 0 < row["top10_share_median"] <= 1 for row in data["inputs"].values())
    plain = data["q4_0_round_trip"]
    assert 0.07 < plain["rho"] < 0.10  # the q4_0 grid on i.i.d. Gaussian weights, as perf_int4_bound measures
    assert set(data["gptq"]) == {"0.1", "10"}
    for row in data["gptq"].values():  # what GPTQ minimises, on the inputs it minimised it for
        assert row["calibration_output_error"] < plain["calibration_output_error"]
        assert -1 <= row["min_cosine"] <= 1
    assert data["best_gptq_min_cosine"] == max(row["min_cosine"] for row in data["gptq"].values())
    assert data["targets"]["best_gptq_min_cosine"]["met"] == (data["best_gptq_min_cosine"] >= data["cosine_target"])
