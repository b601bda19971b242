"""What the NEON loops save an ARM box, counted where no ARM box exists: instructions per multiply-add.

Our kernels are built with Debian's aarch64 cross compiler (the product's flags) and called under qemu-aarch64 in
single-step mode; the instructions one call executes (half the difference between 3 calls and 1) are divided by its
multiply-adds (for one decode row: by the weights it read). These are emulated instruction counts, not time: an ARM
core's speed also depends on its memory (a decode row streams every weight once) and its issue width. The kernels'
correctness on ARM is tests/test_kernels_arm64.py's.

- int4/int6 GEMM (models/kernels/int4_gemm.c, bench/native/int4_calls.c), one decode row (R = 1), built three ways:
  armv8-a+nosimd, the plain C loop every ARM box ran before the NEON loop (GCC 12 does not vectorize it: built at
  armv8-a with NEON allowed it counted 25.9 / 35.9 instructions per int4 / int6 weight against 26.1 / 36.1 here);
  armv8-a, the NEON loop with widening multiplies and pairwise adds (a Raspberry Pi 4); armv8.2-a+dotprod, the NEON
  loop with sdot (a Jetson Orin, a Raspberry Pi 5).
- int8 linear (models/kernels/int8_vnni.c, bench/native/q8_calls.c): one decode row in one pass and in two (a row
  and its rounding residual over one read of the weights), and a 16-row prompt GEMM. GCC does vectorize its plain
  loops, so the baseline is that: the file built with -DEI_Q8_PLAIN at the same level as the NEON build it is set
  against (armv8-a, and armv8.2-a+dotprod, where GCC emits sdot itself).

    .venv/bin/python bench/arm64_instructions.py [--rows 64] [--width 2048] [--prompt-rows 16] [--out F]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from common import machine_info, skip, write_json

from edgeinspect.models.kernels import build as kernel_build

NATIVE = Path(__file__).with_name("native")
ARM_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
INT4_LEVELS = {
    "plain C (armv8-a+nosimd)": "armv8-a+nosimd",
    "NEON (armv8-a)": "armv8-a",
    "NEON sdot (armv8.2-a+dotprod)": "armv8.2-a+dotprod",
}
PLAIN, NEON, SDOT = INT4_LEVELS  # the baseline first
# int8: each NEON build against the plain loops as GCC vectorizes them at the same level
INT8_PAIRS = {
    "armv8-a": ("plain C, GCC-vectorized (armv8-a)", "NEON (armv8-a)"),
    "armv8.2-a+dotprod": ("plain C, GCC-vectorized (armv8.2-a+dotprod)", "NEON sdot (armv8.2-a+dotprod)"),
}
INT8_CASES = {"decode row, one pass": "gemv", "decode row, two passes": "two_pass", "prompt GEMM": "mm"}


def _cross(source: Path, out: Path, march: str, *extra: str) -> Path:
    subprocess.run(
        [ARM_CC, *kernel_build.BASE_FLAGS, f"-march={march}", *extra, str(source), "-o", str(out), "-lm"], check=True
    )
    return out


def build(folder: Path) -> tuple[dict[str, Path], dict[str, Path], dict[str, Path]]:
    """The two drivers, the int4 builds by label and the int8 builds by label."""
    if not (shutil.which(ARM_CC) and shutil.which(QEMU)):
        skip("needs gcc-aarch64-linux-gnu and qemu-user (apt install gcc-aarch64-linux-gnu qemu-user)")
    drivers = {}
    for name in ("int4_calls", "q8_calls"):
        drivers[name] = folder / name
        subprocess.run(
            [ARM_CC, "-O2", "-march=armv8-a", str(NATIVE / f"{name}.c"), "-o", str(drivers[name])], check=True
        )
    int4 = {name: _cross(kernel_build.INT4_SOURCE, folder / f"int4_{m}.so", m) for name, m in INT4_LEVELS.items()}
    int8 = {}
    for march, (plain, neon) in INT8_PAIRS.items():
        int8[plain] = _cross(kernel_build.Q8_SOURCE, folder / f"q8_plain_{march}.so", march, "-DEI_Q8_PLAIN")
        int8[neon] = _cross(kernel_build.Q8_SOURCE, folder / f"q8_{march}.so", march)
    return drivers, int4, int8


def instructions(command: list[str]) -> tuple[int, str]:
    """Instructions the whole process executed (qemu logs each single-instruction block it runs), and its output."""
    read, write = os.pipe()
    qemu = [QEMU, "-L", SYSROOT, "-singlestep", "-d", "nochain,exec", "-D", f"/dev/fd/{write}"]
    proc = subprocess.Popen([*qemu, *command], stdout=subprocess.PIPE, pass_fds=(write,))
    os.close(write)
    count = 0
    with os.fdopen(read, "rb") as log:
        while chunk := log.read(1 << 22):
            count += chunk.count(b"Trace ")
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{Path(command[0]).name} failed under qemu ({proc.returncode})")
    return count, out.decode().strip()


def per_call(command: list[str], macs: int) -> dict:
    """One call's instructions (half the difference between 3 calls and 1) and their count per multiply-add."""
    one, y1 = instructions([*command, "1"])
    three, y3 = instructions([*command, "3"])
    assert y1 == y3, (y1, y3)
    count = (three - one) / 2
    return {"instructions_per_call": int(count), "per_multiply_add": round(count / macs, 4), "output": y1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64, help="weight rows (outputs) per call")
    ap.add_argument("--width", type=int, default=2048, help="K, a multiple of 64 (the 1.3B hidden size: 2048)")
    ap.add_argument("--prompt-rows", type=int, default=16, help="activation rows of the int8 prompt GEMM")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    n, k = args.rows, args.width
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        drivers, int4, int8 = build(Path(tmp))
        for bits in (4, 6):
            rows = figures[f"int{bits} decode row"] = {}
            for name, lib in int4.items():
                rows[name] = per_call([str(drivers["int4_calls"]), str(lib), str(bits), str(n), str(k)], n * k)
            for name in (NEON, SDOT):
                rows[name]["fewer_than_baseline"] = round(
                    rows[PLAIN]["per_multiply_add"] / rows[name]["per_multiply_add"], 2
                )
        for case, mode in INT8_CASES.items():
            r = args.prompt_rows if mode == "mm" else 1
            macs = (2 if mode == "two_pass" else 1) * r * n * k
            rows = figures[f"int8 {case}"] = {}
            for plain, neon in INT8_PAIRS.values():
                for name in (plain, neon):
                    cmd = [str(drivers["q8_calls"]), str(int8[name]), mode, str(r), str(n), str(k)]
                    rows[name] = per_call(cmd, macs)
                rows[neon]["fewer_than_baseline"] = round(
                    rows[plain]["per_multiply_add"] / rows[neon]["per_multiply_add"], 2
                )
    for case, rows in figures.items():
        agree = "outputs agree" if len({row["output"] for row in rows.values()}) == 1 else "outputs DIFFER"
        print(f"{case}: {agree}")
        for name, row in rows.items():
            fewer = f"  ({row['fewer_than_baseline']}x fewer)" if "fewer_than_baseline" in row else ""
            print(f"  {name:44s} {row['per_multiply_add']:8.4f} instructions per multiply-add{fewer}")
    qemu = subprocess.run([QEMU, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    gcc = subprocess.run([ARM_CC, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    payload = {
        "what": "instructions per multiply-add of our int4/int6 GEMM and int8 linear on arm64 (one thread), counted "
        "under qemu-aarch64; for a decode row (R = 1) that is per weight read",
        "shape": {"rows": n, "width": k, "int8_prompt_rows": args.prompt_rows},
        "baselines": "int4/int6: the plain loop built without SIMD (GCC does not vectorize it); int8: the plain "
        "loops (-DEI_Q8_PLAIN) as GCC vectorizes them at the NEON build's own level",
        "emulator": qemu,
        "compiler": gcc,
        "host": machine_info(bandwidth=False),
        "cases": figures,
    }
    print(write_json("arm64_instructions", payload, args.out))


if __name__ == "__main__":
    main()
