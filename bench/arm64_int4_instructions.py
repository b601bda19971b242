"""What the NEON int4/int6 loop saves an ARM box, counted where no ARM box exists: instructions per weight.

models/kernels/int4_gemm.c is built with Debian's aarch64 cross compiler (the product's flags) three ways:
  - armv8-a+nosimd: the plain C loop, what every ARM box ran before the NEON loop (GCC 12 does not vectorize it:
    the loop as it was, built at armv8-a with NEON allowed, counted 25.9 / 35.9 instructions per int4 / int6 weight
    against 26.1 / 36.1 here);
  - armv8-a: the NEON loop with widening multiplies and pairwise adds (a Raspberry Pi 4);
  - armv8.2-a+dotprod: the NEON loop with sdot (a Jetson Orin, a Raspberry Pi 5).
bench/native/int4_calls.c calls ei_int4_gemm / ei_int6_gemm on one decode row of a 1.3B layer's width under
qemu-aarch64 in single-step mode, and the instructions one call executes (half the difference between 3 calls and 1)
are divided by the weights it read. These are emulated instruction counts, not time: an ARM core's speed also
depends on its memory (a decode row streams every weight once) and its issue width. The kernels' correctness on
ARM is tests/test_kernels_arm64.py's.

    .venv/bin/python bench/arm64_int4_instructions.py [--rows 64] [--width 2048] [--out F]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from common import machine_info, skip, write_json

from edgeinspect.models import kernels

DRIVER = Path(__file__).with_name("native") / "int4_calls.c"
ARM_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
LEVELS = {
    "plain C (armv8-a+nosimd)": "armv8-a+nosimd",
    "NEON (armv8-a)": "armv8-a",
    "NEON sdot (armv8.2-a+dotprod)": "armv8.2-a+dotprod",
}
PLAIN, NEON, SDOT = LEVELS  # the baseline first


def build(folder: Path) -> tuple[Path, dict[str, Path]]:
    if not (shutil.which(ARM_CC) and shutil.which(QEMU)):
        skip("needs gcc-aarch64-linux-gnu and qemu-user (apt install gcc-aarch64-linux-gnu qemu-user)")
    driver = folder / "int4_calls"
    subprocess.run([ARM_CC, "-O2", "-march=armv8-a", str(DRIVER), "-o", str(driver)], check=True)
    libs = {}
    for name, march in LEVELS.items():
        libs[name] = folder / f"int4_{march}.so"
        subprocess.run(
            [ARM_CC, *kernels.BASE_FLAGS, f"-march={march}", str(kernels.INT4_SOURCE), "-o", str(libs[name]), "-lm"],
            check=True,
        )
    return driver, libs


def instructions(driver: Path, lib: Path, bits: int, rows: int, width: int, calls: int) -> tuple[int, str]:
    """Instructions the whole process executed (qemu logs each single-instruction block it runs), and its output."""
    read, write = os.pipe()
    cmd = [QEMU, "-L", SYSROOT, "-singlestep", "-d", "nochain,exec", "-D", f"/dev/fd/{write}"]
    proc = subprocess.Popen(
        [*cmd, str(driver), str(lib), str(bits), str(rows), str(width), str(calls)],
        stdout=subprocess.PIPE,
        pass_fds=(write,),
    )
    os.close(write)
    count = 0
    with os.fdopen(read, "rb") as log:
        while chunk := log.read(1 << 22):
            count += chunk.count(b"Trace ")
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{driver.name} failed under qemu ({proc.returncode})")
    return count, out.decode().strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64, help="weight rows (outputs) per call")
    ap.add_argument("--width", type=int, default=2048, help="K, a multiple of 64 (the 1.3B hidden size: 2048)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    weights = args.rows * args.width
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        driver, libs = build(Path(tmp))
        for bits in (4, 6):
            for name, lib in libs.items():
                one, y1 = instructions(driver, lib, bits, args.rows, args.width, 1)
                three, y3 = instructions(driver, lib, bits, args.rows, args.width, 3)
                assert y1 == y3, (y1, y3)
                per_call = (three - one) / 2
                figures.setdefault(f"int{bits}", {})[name] = {
                    "instructions_per_call": int(per_call),
                    "per_weight": round(per_call / weights, 4),
                    "y0": y1,
                }
                print(f"int{bits} {name:32s} {per_call / weights:8.3f} instructions per weight  (y[0] {y1})")
    for fmt, rows in figures.items():
        plain = rows[PLAIN]["per_weight"]
        for row in rows.values():
            row["fewer_than_plain"] = round(plain / row["per_weight"], 1)
        agree = "agrees" if len({row["y0"] for row in rows.values()}) == 1 else "DIFFERS"
        neon, sdot = rows[NEON]["fewer_than_plain"], rows[SDOT]["fewer_than_plain"]
        print(f"{fmt}: NEON {neon}x, sdot {sdot}x fewer instructions than the plain loop; y[0] {agree}")
    qemu = subprocess.run([QEMU, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    gcc = subprocess.run([ARM_CC, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    payload = {
        "what": "instructions per weight of one int4/int6 decode row (R = 1, one thread), counted under qemu-aarch64",
        "shape": {"rows": args.rows, "width": args.width},
        "emulator": qemu,
        "compiler": gcc,
        "host": machine_info(bandwidth=False),
        "formats": figures,
    }
    print(write_json("arm64_int4_instructions", payload, args.out))


if __name__ == "__main__":
    main()
