"""Our C kernels as an ARM box builds and runs them (a Raspberry Pi vision node, a Jetson decoder stage).

No ARM CPU here: each kernel source is built with Debian's aarch64 cross compiler and the same flags the product
uses, and tests/kernel_probe.c calls them under qemu-user as an ARM box runs them. Its printout must
match the same probe over the x86-64-v2 build (the `generic` level, whose paths tools/test.sh's capped run checks
against torch) to float rounding: the ARM build fuses multiply-adds where x86-64-v2 cannot, and its int4/int6 GEMM
runs the NEON loop (the x86-64-v2 build the plain one), which adds the same int32 group sums in another order. The
int8 linear's int32 sums are exact on every path, so its prompt GEMM must match to the bit."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from edgeinspect.models.cpu import CPU_ISA_LEVELS
from edgeinspect.models.kernels import build

ARM_CC, ARM_NM, QEMU = "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-nm", "qemu-aarch64"
ARM_SYSROOT = "/usr/aarch64-linux-gnu"  # the cross toolchain's libc, which qemu-user loads the probe with
PROBE = Path(__file__).with_name("kernel_probe.c")
SOURCES = (build.SOURCE, build.INT4_SOURCE, build.ROWS_SOURCE, build.PROMPT_SOURCE, build.Q8_SOURCE)
# A Raspberry Pi 4 (Cortex-A72) at the base level; a Jetson Orin or a Pi 5 (A78AE / A76) with fp16 and dot products.
ARM_LEVELS = ("armv8-a", "armv8.2-a+fp16+dotprod")
GENERIC = CPU_ISA_LEVELS["generic"][0]  # x86-64-v2: what EDGEINSPECT_CPU_ISA=generic builds the kernels at

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="cross-builds from an x86-64 host"),
    pytest.mark.skipif(
        not all(map(shutil.which, (ARM_CC, ARM_NM, QEMU, "gcc", "nm"))),
        reason="no aarch64 cross compiler or qemu-user (apt install gcc-aarch64-linux-gnu qemu-user)",
    ),
]


def _build(cc: str, march: str, source: Path, out: Path, *extra: str) -> Path:
    out.parent.mkdir(exist_ok=True)
    subprocess.run([cc, *extra, f"-march={march}", str(source), "-o", str(out), "-lm"], check=True, capture_output=True)
    return out


def _library(cc: str, march: str, source: Path, folder: Path) -> Path:
    """`source` built as models/kernels builds it (its base flags), at `march` instead of native."""
    return _build(cc, march, source, folder / f"{source.stem}.so", *build.BASE_FLAGS)


def _exports(nm: str, library: Path) -> set[str]:
    listed = subprocess.run([nm, "-D", "--defined-only", str(library)], check=True, capture_output=True, text=True)
    return {line.split()[-1] for line in listed.stdout.splitlines() if line.split()[-1].startswith("ei_")}


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_each_kernel_builds_for_arm64_with_every_function_the_python_side_binds(tmp_path, source):
    """An x86 intrinsic outside its #if would fail the build on ARM, and the box would quietly run torch's kernels."""
    arm = _library(ARM_CC, "armv8-a", source, tmp_path / "arm")
    assert "AArch64" in subprocess.run(["readelf", "-h", str(arm)], capture_output=True, text=True).stdout
    here = _exports("nm", _library("gcc", GENERIC, source, tmp_path / "x86"))
    assert _exports(ARM_NM, arm) == here and here  # what _bind / _bind_int4 / ... look up


def _probe(cc: str, march: str, folder: Path, run: list[str]) -> dict[str, list[float]]:
    """The probe's printout, name#n -> values, run by `run` (qemu-user for arm64) over `march` builds."""
    order = (build.SOURCE, build.INT4_SOURCE, build.ROWS_SOURCE, build.PROMPT_SOURCE, build.Q8_SOURCE)
    libs = [_library(cc, march, source, folder) for source in order]
    exe = _build(cc, march, PROBE, folder / "probe", "-O2", "-std=gnu11")  # dlopen is in glibc itself since 2.34
    out = subprocess.run([*run, str(exe), *map(str, libs)], check=True, capture_output=True, text=True, timeout=120)
    printed: dict[str, list[float]] = {}
    name = ""
    for line in out.stdout.splitlines():
        head = line.split()[0]  # a value, or a "name count" line that starts the next printout
        if head.startswith(("0x", "-0x")):
            printed[name].append(float.fromhex(head))
        else:  # a name printed again (the cache rows) gets the next number
            name = f"{head}#{sum(k.startswith(head + '#') for k in printed)}"
            printed[name] = []
    return printed


@pytest.mark.parametrize("march", ARM_LEVELS)
def test_the_kernels_compute_on_arm64_what_the_plain_x86_build_computes(tmp_path, march):
    arm = _probe(ARM_CC, march, tmp_path / "arm", [QEMU, "-L", ARM_SYSROOT])
    x86 = _probe("gcc", GENERIC, tmp_path / "x86", [])
    assert arm.keys() == x86.keys()
    assert len(x86) == 28 and all(len(v) for v in x86.values())  # every probe printed
    # The int4/int6 and int8 sums came from the NEON loops on ARM (NEON is part of every armv8-a) and the plain loops
    # on x86-64-v2.
    assert arm.pop("int4_simd#0") == [1.0] and x86.pop("int4_simd#0") == [0.0]
    assert arm.pop("q8_simd#0") == [1.0] and x86.pop("q8_simd#0") == [0.0]
    assert arm["q8_mm#0"] == x86["q8_mm#0"] and len(x86["q8_mm#0"]) == 7 * 50  # exact int32 sums, tails included
    for name, here in x86.items():
        there = arm[name]
        assert len(there) == len(here), name
        scale = max(map(abs, here)) or 1.0
        worst = max(abs(a - b) for a, b in zip(there, here, strict=True))
        assert worst <= 1e-5 * scale, f"{name}: off by {worst:.3g} (largest value {scale:.3g})"
    # Both builds' prompt attention has no SIMD path (0) and declines the call (-2): stages then run SDPA.
    assert arm["prompt_attention#0"] == x86["prompt_attention#0"] == [0.0, -2.0]


def test_the_neon_loops_sum_alike_with_and_without_dot_products(tmp_path):
    """sdot (armv8.2-a dotprod) and the widening multiplies with pairwise adds (armv8-a) make the same int32 sums, and
    everything after them is the same code: the int4/int6 and int8 outputs agree to the bit."""
    base, dotprod = (_probe(ARM_CC, march, tmp_path / march, [QEMU, "-L", ARM_SYSROOT]) for march in ARM_LEVELS)
    shapes = {"int4_gemm#0": 5 * 24, "int6_gemm#0": 5 * 24, "q8_gemv#0": 3 * 50, "q8_gemv_two_pass#0": 3 * 50}
    for name, count in shapes.items():
        assert base[name] == dotprod[name] and len(base[name]) == count, name
