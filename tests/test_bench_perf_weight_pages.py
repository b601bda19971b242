"""bench/perf_weight_pages.py end to end on the tiny checkpoint: both stages decode the same logits, the ratio is
recorded as a target."""

from __future__ import annotations

from bench_scripts import run_bench


def test_perf_weight_pages_compares_the_two_placements_of_one_stage(tiny_checkpoint, tmp_path):
    data = run_bench(
        "perf_weight_pages",
        *("--checkpoint", str(tiny_checkpoint), "--steps", "14", "--depth", "16"),
        out=tmp_path / "perf_weight_pages.json",
    )
    assert data["logits_identical"] is True
    assert data["steps_counted"] == 4
    assert set(data["decode_ms"]) == {"4k_pages", "huge_pages"} and min(data["decode_ms"].values()) > 0
    rec = data["targets"]["decode_huge_vs_4k_pages"]
    assert rec["value"] > 0 and rec["met"] == (rec["value"] <= 1.0)
    assert data["machine"]["thp"]
    assert data["weights"] == "int8"  # (the tiny stage is below weight_arena.MIN_BYTES: both stay on 4 KiB pages)
