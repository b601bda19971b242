"""The int8 vision copies are built for the CPU that runs them (models/vision_int8): on a CPU whose int8 GEMM
saturates with 8-bit weights (AVX2 / AVX-512 without VNNI) a copy with 7-bit weights, elsewhere the full 8 bits, and
refused with the figures where no width keeps the visual tokens close to fp32.

EDGEINSPECT_CPU_ISA cannot show the AVX2 case: it caps our kernels and torch's, but ONNX Runtime's MLAS reads the CPU
itself (cpuid) and keeps its VNNI kernels. So the AVX2 test runs the build under qemu-x86_64 with the EPYC-Rome CPU
model (AVX2, FMA, no AVX-512, no VNNI), where cpuid answers as an AVX2-only EPYC does: the full-range copies lose
accuracy there exactly as on that machine (static 0.956, the figure CI printed on a real AVX2-only EPYC), which shows
the emulated run reaches the saturating kernels."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinspect.errors import CheckpointError
from edgeinspect.models import cpu, vision_int8
from edgeinspect.models.onnx_export import META_WEIGHT_BITS, export_vision_onnx, onnx_metadata, restamp
from edgeinspect.models.vision_int8 import (
    INT8_MIN_COSINE,
    META_CHECKED_ON,
    Int8Unfit,
    build_int8_copy,
    checked_int8_copy,
    measure_copy,
    sample_frames,
)

AVX2_ONLY_MODEL = "EPYC-Rome"
SATURATED = 0.98  # full-range 8-bit copies on that model measure 0.956 (static) and 0.907 (dynamic) worst


@pytest.fixture(scope="module")
def fp32(tiny_checkpoint, tmp_path_factory) -> Path:
    return export_vision_onnx(tiny_checkpoint, tmp_path_factory.mktemp("int8") / "vision.onnx")


@pytest.fixture(scope="module")
def frames(tiny_checkpoint) -> vision_int8.Int8Frames:
    return sample_frames(tiny_checkpoint, static=True)


@pytest.mark.parametrize("static", [True, False], ids=["qdq", "dynamic"])
def test_the_int8_copy_keeps_the_bound_with_the_widest_weights_this_cpu_allows(fp32, frames, static, tmp_path):
    path = build_int8_copy(fp32, tmp_path / "int8.onnx", frames, static)
    meta = onnx_metadata(path)
    assert measure_copy(path, fp32, frames.check) >= INT8_MIN_COSINE
    assert meta[META_CHECKED_ON] == cpu.int8_gemm_class()
    if cpu.int8_gemm_class() != "x86-avx2":  # no pair sums in 16 bits: the full 8 bits keep the bound
        assert meta[META_WEIGHT_BITS] == "8"


def test_no_width_that_keeps_the_bound_is_refused_with_the_figures_and_what_to_use(fp32, frames, tmp_path, monkeypatch):
    monkeypatch.setattr(vision_int8, "int8_gemm_class", lambda: "x86-avx2")
    with pytest.raises(Int8Unfit) as refused:
        build_int8_copy(fp32, tmp_path / "int8.onnx", frames, static=False, min_cosine=0.999999)
    text = str(refused.value)
    assert "8-bit weights" in text and "7-bit weights" in text and "below 0.999999" in text
    assert "no AVX512-VNNI or AVX-VNNI" in text and "Use weights fp32 or bf16" in text
    assert isinstance(refused.value, CheckpointError) and not (tmp_path / "int8.onnx").exists()
    assert not list(tmp_path.glob(".*"))  # no trial copies left behind


def test_a_copy_checked_on_another_kind_of_cpu_is_measured_again_before_it_serves(fp32, frames, tmp_path):
    path = build_int8_copy(fp32, tmp_path / "vision-int8.onnx", frames, static=False)
    restamp(path, path, {META_CHECKED_ON: "x86-elsewhere"})
    calls = []

    def frames_once():
        calls.append(1)
        return frames

    assert checked_int8_copy(fp32, path, frames_once, static=False) == path
    assert calls and onnx_metadata(path)[META_CHECKED_ON] == cpu.int8_gemm_class()
    calls.clear()
    checked_int8_copy(fp32, path, frames_once, static=False)
    assert not calls  # checked on this kind: served as it is, nothing measured


@pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("qemu-x86_64") is None,
    reason="needs qemu-x86_64 (Debian's qemu-user) on an x86_64 host",
)
def test_on_an_avx2_cpu_without_vnni_8bit_weights_saturate_and_the_copy_takes_7bit(fp32, frames, tmp_path):
    shutil.copy(fp32, tmp_path / "vision.onnx")
    np.save(tmp_path / "calibration.npy", np.concatenate(frames.calibration))
    np.save(tmp_path / "check.npy", frames.check)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        ["qemu-x86_64", "-cpu", AVX2_ONLY_MODEL, sys.executable, "-m", "edgeinspect.models.vision_int8", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    for kind in ("qdq", "dynamic"):
        got = figures[kind]
        assert got["full_range_cosine"] < SATURATED, f"{kind}: the emulated CPU did not reach the saturating kernel"
        assert got["chosen_bits"] == 7 and got["chosen_cosine"] >= INT8_MIN_COSINE, got
