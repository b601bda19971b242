"""bench/int8_peak.py end to end on the tiny checkpoint: the AVX2 int8 routes' rates from registers (and vpdpbusd's
where the CPU has AVX512-VNNI), our prompt GEMM at the checkpoint's shapes, and the prefill floor they imply."""

from __future__ import annotations

import platform

import pytest
from bench_scripts import run_bench

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.cpu import cpu_flags
from edgeinspect.models.kernels import bindings

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


@pytest.mark.skipif(
    platform.machine() != "x86_64" or "avx2" not in cpu_flags() or bindings.q8_library() is None,
    reason="the routes are AVX2 assembly; needs the int8 kernel built",
)
def test_int8_peak_measures_each_route_and_our_gemm_against_the_exact_ceiling(tiny_checkpoint, tmp_path):
    data = run_bench(
        "int8_peak",
        *("--checkpoint", str(tiny_checkpoint), "--rounds", "2", "--route-seconds", "0.05", "--prompt-tokens", "64"),
        out=tmp_path / "int8_peak.json",
    )
    routes = data["routes_g_products_per_s_per_core"]
    vnni = "avx512_vnni" in cpu_flags()
    assert set(routes) == {"madd", "maddubs", "signed"} | ({"vnni"} if vnni else set())
    for rec in routes.values():
        assert len(rec["rounds"]) == 2 and rec["median"] > 1  # > 1 G products/s: the loops really ran
    ceiling = data["exact_ceiling"]
    # maddubs alone is not exact for 8-bit activations; vpdpbusd (64 products an instruction) is the ceiling where it is
    assert ceiling["route"] == "vnni" if vnni else ceiling["route"] in ("madd", "signed")
    assert ceiling["g_products_per_s"] == pytest.approx(routes[ceiling["route"]]["median"] * 2, rel=0.01)
    t = open_checkpoint(tiny_checkpoint).text_config
    head_dim = t.hidden_size // t.num_attention_heads
    kv = getattr(t, "num_key_value_heads", None) or t.num_attention_heads
    per_token = t.hidden_size * ((t.num_attention_heads + 2 * kv) * head_dim + t.hidden_size + 3 * t.intermediate_size)
    assert data["prefill_linear_products"] == 64 * per_token * t.num_hidden_layers
    assert data["prefill_linears_floor_s"] == pytest.approx(
        data["prefill_linear_products"] / (ceiling["g_products_per_s"] * 1e9), rel=0.02, abs=0.01
    )
    rounding = 0.005 / ceiling["g_products_per_s"] + 5e-5  # both figures are rounded: to 0.01 G/s, to 4 places
    fraction = data["ours_fraction_of_exact_ceiling"]
    assert fraction > 0
    assert fraction == pytest.approx(data["ours_g_products_per_s"] / ceiling["g_products_per_s"], abs=rounding)
    assert data["prefill_linears_ours_s"] >= data["prefill_linears_floor_s"] * 0.5  # nobody beats the ceiling by 2x
