"""The model path on arm64 (a Jetson or Raspberry Pi decoder stage, a Pi vision node), under emulation: torch's
aarch64 build, ONNX Runtime's, our kernels built as an ARM box builds them, and transformers' generate() as the
oracle on the same CPU.

No ARM CPU here: tools/arm64_env.py builds Debian's aarch64 CPython and the aarch64 wheels (torch 2.10, the newest
CPU build on PyPI; ONNX Runtime and the ONNX exporter at this environment's versions), the working tree goes in as a
wheel, and tests/arm64_model_probe.py runs under qemu-user as a Cortex-A76 (a Pi 5's core: ARMv8.2 with dot
products, as a Jetson Orin's A78AE), with the aarch64 cross compiler as the box's `cc`. The same probe runs here
capped at AVX2: its int8/int6/int4 stages and int8 vision tower run our AVX2 kernels, whose int32 sums the NEON ones
make too. Slow (about 2 minutes, most of it torch under emulation) and skipped until the environment is built:
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

from edgeinspect.models.cpu import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("arm64_model_probe.py")
ARM_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
# qemu's model of the core, and the level our kernels build at. Not qemu's `max` CPU: it has SME, where ONNX
# Runtime 1.32's int8 matmuls take KleidiAI's SME path, which Debian bookworm's qemu 7.2 emulates wrongly (worst
# token cosine 0.34 against fp32; under qemu 10 from bookworm-backports the same path gives 0.99966, NEON 0.99975).
ARM_CPU, ARM_LEVEL = "cortex-a76", "armv8.2-a+dotprod"
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


def _emulated_box(folder: Path) -> Path:
    """qemu-user's -L prefix: the environment's aarch64 root, plus what the box's kernel would report about its
    CPU. qemu passes the host's x86 /proc/cpuinfo through; ONNX Runtime's CPU probe finds no ARM core there and
    crashes on import, and oneDNN reads the core's MIDR from /sys. qemu opens a prefix file in their place."""
    (folder / "proc").mkdir(parents=True)
    for part in ("etc", "lib", "usr"):
        (folder / part).symlink_to(ENV / "root" / part)
    cpus = os.cpu_count() or 1  # /sys/devices/system/cpu/{possible,present} still come from the host
    core = (
        "BogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid"
        " asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\n"
        "CPU part\t: 0xd0b\nCPU revision\t: 1\n\n"
    )
    (folder / "proc" / "cpuinfo").write_text("".join(f"processor\t: {i}\n{core}" for i in range(cpus)))
    for i in range(cpus):
        regs = folder / f"sys/devices/system/cpu/cpu{i}/regs/identification"
        regs.mkdir(parents=True)
        (regs / "midr_el1").write_text("0x00000000414fd0b1\n")  # Arm, r4p1, part 0xd0b (Cortex-A76)
    return folder


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

    def probe_args(side: str) -> list[str]:  # the checkpoint, the JSON to write, where the node's ONNX exports go
        return [str(tiny_checkpoint), str(tmp / f"{side}.json"), str(tmp / f"onnx-{side}" / "vision.onnx")]

    subprocess.run(
        [QEMU, "-cpu", ARM_CPU, "-L", str(_emulated_box(tmp / "box")), str(python), str(PROBE), *probe_args("arm64")],
        env=arm_env,
        check=True,
        capture_output=True,
        timeout=1200,
    )
    x86_env = os.environ | AVX2_CAP | {"EDGEINSPECT_KERNEL_DIR": str(tmp / "kernels-avx2")}
    subprocess.run([sys.executable, str(PROBE), *probe_args("x86-avx2")], env=x86_env, check=True, capture_output=True)
    return json.loads((tmp / "arm64.json").read_text()), json.loads((tmp / "x86-avx2.json").read_text())


def test_an_arm64_box_runs_our_neon_kernels_for_every_packed_format(probes):
    arm, _ = probes
    assert arm["machine"] == "aarch64" and arm["torch"].startswith("2.10")
    assert arm["cpu"] == f"Cortex-A76 x{os.cpu_count()}" and "asimddp" in arm["cpu_flags"]  # the box's, not x86's
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


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the x86 side runs capped at AVX2")
def test_a_pi_vision_node_runs_onnx_runtime_as_it_runs_here(probes):
    """The vision node's default backend on arm64: the tower exported by torch's aarch64 build on the box at first
    start, run by ONNX Runtime's aarch64 build, encodes as torch fp32 does there and as the x86 export does here;
    the int8 copy quantised there as the x86 one (cosine 1.0, 1.4e-7 of the range apart when this was written; the
    bound leaves room for an x86 box whose ONNX Runtime sums uint8 x int8 pairs in saturating int16); and a Pi's
    `backend: auto` times every backend, ONNX Runtime's included."""
    arm, x86 = probes
    tokens = arm["vision"]["shape"][0]
    _assert_within(arm["vision"]["onnxruntime-fp32"], arm["vision"]["fp32"], "onnxruntime fp32 vs torch fp32")
    _assert_within(arm["vision"]["onnxruntime-fp32"], x86["vision"]["onnxruntime-fp32"], "onnxruntime fp32")
    across = _min_row_cosine(arm["vision"]["onnxruntime-int8"], x86["vision"]["onnxruntime-int8"], tokens)
    to_fp32 = _min_row_cosine(arm["vision"]["onnxruntime-int8"], arm["vision"]["fp32"], tokens)
    assert across > 0.999 and to_fp32 > 0.99, (across, to_fp32)
    assert arm["vision_auto_candidates"] == [
        *("torch-fp32", "torch-bf16", "torch-int8", "onnxruntime-fp32", "onnxruntime-int8")
    ]
