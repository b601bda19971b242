"""bench/perf_report.py end to end on the tiny checkpoint: both sides run and the JSON carries every record."""

from __future__ import annotations

import pytest
from bench_scripts import BENCH_DIR, run_bench


@pytest.mark.slow  # ~1 min on the shared 2 cores: ONNX export + quantization, two stages, the baseline
def test_perf_report_writes_baseline_ours_phases_and_the_ratio_target(tiny_checkpoint, tmp_path):
    out = tmp_path / "perf_report.json"
    data = run_bench(
        "perf_report",
        "--checkpoint",
        str(tiny_checkpoint),
        "--tokens",
        "4",
        "--context-tokens",
        "40",
        "--formats",
        "fp32,bf16,int6",
        "--onnx-dir",
        str(tmp_path / "onnx"),
        out=out,
    )
    rec = data["targets"]["report_time_ours_vs_transformers_bf16"]
    assert set(rec) == {"value", "target", "met"} and rec["target"] == 0.4 and rec["value"] > 0
    assert data["ours"]["format"] in {"fp32", "bf16", "int6"}
    assert data["candidates"]["int6"]["kernel"].startswith("int6 ") and data["format_gates"]["int6"]["allowed"]
    # the vision tower as the vision node's backend: auto picks it, measured in the same run
    vision = data["vision"]
    assert vision["backend"] in vision["eligible"] and data["ours"]["vision"] == vision["backend"]
    assert {"torch-fp32", "onnxruntime-int8"} <= set(vision["ms_per_image"])
    assert vision["ms_per_image"][vision["backend"]] == min(vision["ms_per_image"][n] for n in vision["eligible"])
    for row in (data["baseline"], data["candidates"]["fp32"], data["candidates"]["bf16"]):
        assert row["generated"] == 4  # EOS ignored on both sides
        assert row["prompt_tokens"] == data["baseline"]["prompt_tokens"]  # the same prompt on both sides
        for phase in ("preprocess_s", "vision_s", "prefill_s", "decode_ms_per_token", "read_bound_ms"):
            assert row[phase] > 0
    assert data["candidates"]["fp32"]["first_logits_cosine_vs_baseline"] >= 0.99
    assert data["candidates"]["fp32"]["first_logits_cosine_vs_fp32"] == 1.0  # fp32 is the formats' reference
    assert "loadavg_end" in data["machine"] and "read_bandwidth_gbs_2_threads" in data["machine"]
    # decode against a bandwidth probe taken just before each step, at the report's depth (not fp32: the reference)
    bound = data["candidates"]["bf16"]["at_read_bound"]
    assert bound["depth"] == data["baseline"]["prompt_tokens"] and bound["steps"] == 32
    assert bound["x_read_bound"] > 0 and bound["probe_gbs_median"] > 0
    # the bound counts the cache the step reads at that depth, so it is the tighter of the two ratios' bounds
    assert bound["kv_bytes_at_depth"] > 0 and bound["x_weight_read_bound"] > bound["x_read_bound"]
    assert "at_read_bound" not in data["candidates"]["fp32"]


def test_interleaved_rounds_pair_each_of_our_reports_with_llamacpp_runs_and_take_medians(monkeypatch):
    """The aggregation only: llama.cpp (not ours) is replaced by canned llama-bench figures that drift per round."""
    import sys
    from types import SimpleNamespace

    sys.path.insert(0, str(BENCH_DIR))
    import perf_report

    calls: list[str] = []
    theirs = iter([8.0, 10.0, 9.0])

    def measure(ckpt, prompt_tokens, tokens, threads, reps, quants):
        assert reps == 1 and prompt_tokens == 974
        calls.append("llama")
        t = next(theirs)
        rows = {q: {"report_text_only_s": t * (1.5 if q == "q8_0" else 1.0), "loadavg_before": [1.0]} for q in quants}
        return {"what": "llama-bench", "quants": rows}

    ours = iter([99.0, 5.0, 99.0, 4.0, 99.0, 6.0])  # each timed report follows an untimed warm-up one

    def report():
        calls.append("ours")
        return {"total_s": next(ours), "preprocess_s": 0.0, "vision_s": 0.5, "decode_ms_per_token": 30.0}

    monkeypatch.setattr(perf_report.anchor_llamacpp, "measure", measure)
    args = SimpleNamespace(rounds=3, tokens=80, threads=2, warmup=1)
    llamacpp, interleaved = perf_report.interleaved_rounds(report, None, 974, args)
    # alternating, ours first in each round, warmed up as llama-bench warms itself up before its timed rep
    assert calls == ["ours", "ours", "llama"] * 3
    assert llamacpp["quants"]["q4_0"]["report_text_only_s"] == 9.0  # medians over rounds
    assert llamacpp["quants"]["q8_0"]["report_text_only_s"] == 13.5
    assert interleaved["ours_total_s_median"] == 5.0 and interleaved["ours_text_only_s_median"] == 4.5
    assert [r["ours_total_s"] for r in interleaved["rounds"]] == [5.0, 4.0, 6.0]
    assert [r["q4_0_text_only_s"] for r in interleaved["rounds"]] == [8.0, 10.0, 9.0]
