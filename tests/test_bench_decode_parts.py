"""bench/decode_parts.py: an int8 decode step split into its parts, each against the bytes it reads."""

from __future__ import annotations

import pytest
from bench_scripts import native_decode_layers, run_bench


@native_decode_layers
def test_decode_parts_times_every_part_of_real_steps(tiny_checkpoint, tmp_path):
    data = run_bench(
        "decode_parts", "--checkpoint", str(tiny_checkpoint), "--depth", "40", "--steps", "8",
        "--split-gbs", "0", out=tmp_path / "parts.json",
    )  # fmt: skip
    fast = data["buckets"]["fast"]  # a split at 0 GB/s puts every step in one bucket
    assert fast["steps"] == 6  # the first two steps are left out
    parts = fast["parts"]
    assert set(parts) == {"elementwise", "qkv", "attention", "o", "gate_up", "down", "lm_head", "rest"}
    for name in ("qkv", "attention", "o", "gate_up", "down", "lm_head"):
        assert parts[name]["ms"] > 0 and parts[name]["bytes"] > 0 and parts[name]["x_read_bound"] > 0, name
    assert parts["elementwise"]["ms"] > 0
    timed = sum(p["ms"] for p in parts.values())
    assert timed == pytest.approx(fast["step_ms_median"], rel=0.5)  # medians of parts vs median of steps
