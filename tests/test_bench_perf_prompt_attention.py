"""bench/perf_prompt_attention.py end to end: one layer's kernel against SDPA at small shapes, and a tiny stage's
prefill with the kernel on and off."""

from __future__ import annotations

import pytest
from bench_scripts import run_bench

from edgeinspect.models.kernels import bindings

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


def test_perf_prompt_attention_times_the_kernel_against_sdpa(tiny_checkpoint, tmp_path):
    if not bindings.prompt_attention_fast():
        pytest.skip("the prompt attention kernel does not run on this CPU (the script prints SKIPPED and exits 0)")
    shape = ("--tokens", "40", "--heads", "4", "--kv-heads", "2", "--head-dim", "32")
    data = run_bench(
        "perf_prompt_attention",
        *shape,
        *("--rounds", "3", "--checkpoint", str(tiny_checkpoint), "--prefill-rounds", "2"),
        out=tmp_path / "perf_prompt_attention.json",
    )
    layer = data["layer"]
    assert (layer["tokens"], layer["heads"], layer["kv_heads"], layer["head_dim"]) == (40, 4, 2, 32)
    assert set(layer["ms_median"]) == {"kernel", "sdpa"} and min(layer["ms_median"].values()) > 0
    bound = 1e-2 if data["kernel"] == "bf16 dot products" else 1e-5  # what each path promises
    assert 0 <= layer["relative_difference_vs_sdpa"] < bound
    rec = data["targets"]["layer_kernel_vs_sdpa"]
    assert rec["value"] == round(layer["ratio"], 4) and rec["met"] == (layer["ratio"] <= 1.0)
    prefill = data["prefill"]
    assert prefill["rounds"] == 2 and prefill["layers"] >= 1
    for name in ("kernel", "sdpa"):  # attending is part of the prefill, never more
        assert 0 < prefill["attend_s_median"][name] < prefill["prefill_s_median"][name]
    assert data["machine"]["loadavg_end"]
