"""The model path on arm64 (a Jetson or Raspberry Pi decoder stage), under emulation: torch's aarch64 build, our
kernels built as an ARM box builds them, and transformers' generate() as the oracle on the same CPU.

No ARM CPU here: tools/arm64_env.py builds Debian's aarch64 CPython and the aarch64 wheels (torch 2.10, the newest
CPU build on PyPI), the working tree goes in as a wheel, and tests/arm64_model_probe.py runs under qemu-user with
the aarch64 cross compiler as the box's `cc` (at armv8.2-a with dot products, a Jetson Orin or a Pi 5). The same
probe runs here capped at AVX2: its int8/int6/int4 stages and int8 vision tower run our AVX2 kernels, whose int32
sums the NEON ones make too. ONNX Runtime is not covered: its aarch64 wheel segfaults on import under qemu-user
(its CPU probe parses the host's x86 /sys/devices/system/cpu). Slow (about 2 minutes, most of it torch under
emulation) and skipped until the environment is built:
    .venv/bin/python tools/arm64_env.py"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from edgeinspect.models.quant import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("arm64_model_probe.py")
ARM_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
ARM_LEVEL = "armv8.2-a+dotprod"
ENV = Path(os.environ.get("EDGEINSPECT_ARM64_ENV", Path.home() / ".cache" / "edgeinspect" / "arm64-env"))
AVX2_CAP = {"EDGEINSPECT_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates arm64 on an x86-64 host"),
    pytest.mark.skipif(
        not all(map(shutil.which, (ARM_CC, QEMU))),
        reason="no aarch64 cross compiler or qemu-user (apt install gcc-aarch64-linux-gnu qemu-user)",
    ),
    pytest.mark.skipif(
        not all((ENV / part / ".complete").exists() for part in ("root", "site")),
        reason=f"no emulated arm64 Python at {ENV} (.venv/bin/python tools/arm64_env.py)",
    ),
]


def _min_row_cosine(a: list[float], b: list[float], rows: int) -> float:
    """The least cosine between matching rows of a and b (flat lists of `rows` equal rows)."""
    a_rows, b_rows = (torch.tensor(v, dtype=torch.float64).view(rows, -1) for v in (a, b))
    return torch.nn.functional.cosine_similarity(a_rows, b_rows, dim=-1).min().item()


def _assert_within(there: list[float], here: list[float], what: str, rel: float = 1e-4) -> None:
    scale = max(map(abs, here))
    worst = max(abs(a - b) for a, b in zip(there, here, strict=True))
    assert worst <= rel * scale, f"{what}: arm64 off the AVX2 build by {worst:.3g} (largest {scale:.3g})"


def _working_tree(folder: Path) -> Path:
    """The checkout's files (tracked, and untracked ones git does not ignore) copied into folder: a wheel built in
    the checkout itself would leave build/ there, and a later build would ship the stale modules it keeps."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted from the working tree is listed too
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def probes(tmp_path_factory, tiny_checkpoint):
    tmp = tmp_path_factory.mktemp("arm64")
    wheels, package = tmp / "wheels", tmp / "package"  # the working tree as pip installs it
    source = _working_tree(tmp / "source")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(package), *wheels.iterdir()],
        check=True,
        capture_output=True,
    )
    cc = tmp / "cc"  # the cross compiler as the ARM box's own cc: -march=native is the emulated CPU's level
    cc.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do shift; [ "$a" = "-march=native" ] && a="-march={ARM_LEVEL}"; set -- "$@" "$a"; done\n'
        f'exec {ARM_CC} "$@"\n'
    )
    cc.chmod(0o755)
    arm_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp),
        "PYTHONPATH": f"{package}:{ENV / 'site'}",
        "CC": str(cc),
        "EDGEINSPECT_KERNEL_DIR": str(tmp / "kernels-arm64"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "2",
    }
    python = ENV / "root" / "usr" / "bin" / "python3.11"
    arm_out = tmp / "arm64.json"
    subprocess.run(
        [QEMU, "-L", str(ENV / "root"), str(python), str(PROBE), str(tiny_checkpoint), str(arm_out)],
        env=arm_env,
        check=True,
        capture_output=True,
        timeout=1200,
    )
    x86_out = tmp / "x86-avx2.json"
    x86_env = os.environ | AVX2_CAP | {"EDGEINSPECT_KERNEL_DIR": str(tmp / "kernels-avx2")}
    subprocess.run(
        [sys.executable, str(PROBE), str(tiny_checkpoint), str(x86_out)], env=x86_env, check=True, capture_output=True
    )
    return json.loads(arm_out.read_text()), json.loads(x86_out.read_text())


def test_an_arm64_box_runs_our_neon_kernels_for_every_packed_format(probes):
    arm, _ = probes
    assert arm["machine"] == "aarch64" and arm["torch"].startswith("2.10")
    assert arm["int8_kernel"] == "vnni" and arm["int8_simd"] == 1  # our int8 layer, NEON GEMV and prompt GEMM
    assert arm["int4_simd"] == 1  # the NEON int4/int6 loop


def test_split_fp32_stages_on_arm64_reproduce_transformers_generate_there(probes):
    ref = probes[0]["reference"]
    assert ref["same_prompt_ids"]
    assert ref["split_tokens"] == ref["generate_tokens"]
    assert len(set(ref["generate_tokens"])) >= 4, ref["generate_tokens"]  # not a repeated token proving nothing
    assert ref["logits_max_diff"] <= 1e-5


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the x86 side runs capped at AVX2")
@pytest.mark.parametrize("weights", ["int8", "int6", "int4"])
def test_packed_stages_on_arm64_compute_what_the_avx2_build_computes(probes, weights):
    """Both sum the same int32 dots (NEON and AVX2 alike are exact) and finish them in the same order: the logits
    agree to float rounding across the architectures and torch builds (2.10 aarch64, this one); on this suite's
    first run they were bit-identical. int8 is also near fp32 on the ARM box, as the x86 vnni test asks."""
    arm, x86 = probes
    _assert_within(arm["logits"][weights], x86["logits"][weights], weights)
    if weights == "int8":  # rows: the prompt's last position and four decode steps
        assert _min_row_cosine(arm["logits"]["int8"], arm["logits"]["fp32"], rows=5) > 0.99


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the x86 side runs capped at AVX2")
def test_the_vision_tower_on_arm64_encodes_as_the_avx2_build_does(probes):
    """A Raspberry Pi vision node's torch backends: fp32 to float rounding; int8 (our int8 layer, NEON there) to the
    rounding of its activations: the MLP's GELU takes e^x from libm on ARM and from an AVX2 polynomial here, and a
    last-bit difference can move an activation to the next int8 step in the linear after it."""
    arm, x86 = probes
    tokens = arm["vision"]["shape"][0]
    _assert_within(arm["vision"]["fp32"], x86["vision"]["fp32"], "vision fp32")
    across = _min_row_cosine(arm["vision"]["int8"], x86["vision"]["int8"], tokens)
    to_fp32 = _min_row_cosine(arm["vision"]["int8"], arm["vision"]["fp32"], tokens)
    assert across > 0.99999 and to_fp32 > 0.999, (across, to_fp32)
