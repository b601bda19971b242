"""Runs a bench/ script as a user would (its own process, offline) for the benchmark smoke tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinspect.models import quant
from edgeinspect.models.kernels import bindings

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"

# Benches that time an int8 stage's decode layers as one native call: that needs the C kernels and the vnni kernel
# (elsewhere int8 stages take fbgemm, whose layers run one torch call at a time).
native_decode_layers = pytest.mark.skipif(
    not bindings.available() or quant.default_kernel() != "vnni",
    reason="int8 decode layers are not one native call here (no C compiler, or int8 stages take fbgemm)",
)


def run_bench(name: str, *args: str, out: Path, timeout: float = 300) -> dict:
    """bench/<name>.py with `args` and `--out out`; asserts it succeeded and returns the JSON it wrote."""
    proc = subprocess.run(
        [sys.executable, str(BENCH_DIR / f"{name}.py"), *args, "--out", str(out)],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())
