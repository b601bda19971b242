"""bench/perf_report.py end to end on the tiny checkpoint: both sides run and the JSON carries every record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "perf_report.py"


@pytest.mark.slow  # ~1 min on the shared 2 cores: ONNX export + quantization, two stages, the baseline
def test_perf_report_writes_baseline_ours_phases_and_the_ratio_target(tiny_checkpoint, tmp_path):
    out = tmp_path / "perf_report.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--checkpoint",
            str(tiny_checkpoint),
            "--tokens",
            "4",
            "--context-tokens",
            "40",
            "--formats",
            "fp32,bf16",
            "--onnx-dir",
            str(tmp_path / "onnx"),
            "--out",
            str(out),
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rec = data["targets"]["report_time_ours_vs_transformers_bf16"]
    assert set(rec) == {"value", "target", "met"} and rec["target"] == 0.4 and rec["value"] > 0
    assert data["ours"]["format"] in {"fp32", "bf16"}
    for row in (data["baseline"], data["candidates"]["fp32"], data["candidates"]["bf16"]):
        assert row["generated"] == 4  # EOS ignored on both sides
        assert row["prompt_tokens"] == data["baseline"]["prompt_tokens"]  # the same prompt on both sides
        for phase in ("preprocess_s", "vision_s", "prefill_s", "decode_ms_per_token", "read_bound_ms"):
            assert row[phase] > 0
    assert data["candidates"]["fp32"]["first_logits_cosine_vs_baseline"] >= 0.99
    assert "loadavg_end" in data["machine"] and "read_bandwidth_gbs_2_threads" in data["machine"]
