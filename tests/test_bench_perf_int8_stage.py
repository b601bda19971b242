"""bench/perf_int8_stage.py end to end on the tiny checkpoint: both int8 kernels over a whole stage, the default's
report estimate against the other's."""

from __future__ import annotations

import statistics

import pytest
from bench_scripts import run_bench

from edgeinspect.models.quant import default_kernel, fbgemm_available, vnni_available

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


@pytest.mark.skipif(not (vnni_available() and fbgemm_available()), reason="needs both int8 kernels on this CPU")
def test_perf_int8_stage_times_both_kernels_and_records_whether_the_default_is_the_faster(tiny_checkpoint, tmp_path):
    data = run_bench(
        "perf_int8_stage",
        *("--checkpoint", str(tiny_checkpoint), "--rounds", "2", "--steps", "3", "--tokens", "10"),
        *("--context-tokens", "40"),
        out=tmp_path / "perf_int8_stage.json",
    )
    assert set(data["kernels"]) == {"vnni", "fbgemm"}
    for row in data["kernels"].values():
        assert row["prefill_s"] > 0 and row["decode_ms"] > 0
        assert row["report_text_s"] == pytest.approx(row["prefill_s"] + 10 * row["decode_ms"] / 1e3, abs=2e-3)
        assert 0.9 < row["first_logits_cosine_vs_fp32"] <= 1.0  # int8 of the real model, not noise
    assert data["default_kernel"] == default_kernel()
    assert len(data["default_vs_other_per_round"]) == 2
    rec = data["targets"]["default_kernel_report_vs_other"]
    assert rec["value"] == pytest.approx(statistics.median(data["default_vs_other_per_round"]), abs=2e-3)
    assert rec["met"] == (rec["value"] <= 1.0)
    assert "avx2" in data["machine"]["cpu_flags"] or "avx512f" in data["machine"]["cpu_flags"]
