"""The int8 vision copies on each kind of x86 CPU: what models/vision_int8 builds there (7- or 8-bit weights) and how
close its visual tokens stay to fp32, beside the full-range 8-bit copies, for the static QDQ and the dynamic copy.

    .venv/bin/python bench/vision_int8_cpus.py [--ckpt DIR] [--out bench/results/vision_int8_cpus.json]

Kinds: this CPU natively, and under qemu-x86_64 (Debian's qemu-user) the EPYC-Rome model (AVX2 and FMA, no AVX-512,
no VNNI: an AVX2-only EPYC, whose int8 GEMM sums u8 x s8 pairs in int16) and the Nehalem model (SSE4.2). ONNX
Runtime reads cpuid itself, so the emulated CPU model is what picks its kernels. The default checkpoint is the tiny
one the tests use (its large random weights are harsh on int8); timings are native only (emulation says nothing of
speed), with fp32 in the same run as the baseline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402

from edgeinspect.models.onnx_export import export_vision_onnx  # noqa: E402
from edgeinspect.models.vision_int8 import INT8_MIN_COSINE, _tokens, sample_frames  # noqa: E402

EMULATED = {"EPYC-Rome": "AVX2 + FMA, no AVX-512, no VNNI", "Nehalem": "SSE4.2, no AVX"}


def qualify(work: Path, qemu_model: str | None) -> dict:
    cmd = [sys.executable, "-m", "edgeinspect.models.vision_int8", str(work)]
    if qemu_model:
        cmd = ["qemu-x86_64", "-cpu", qemu_model, *cmd]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=True)
    return {"command": " ".join(cmd[:3] if qemu_model else cmd[:1]), **json.loads(run.stdout.splitlines()[-1])}


def ms_per_image(path: Path, check: np.ndarray, repeats: int = 5) -> float:
    _tokens(path, check[:1])  # warm-up (session build)
    t0 = time.perf_counter()
    for _ in range(repeats):
        _tokens(path, check[:1])
    return round((time.perf_counter() - t0) / repeats * 1e3, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, help="checkpoint folder (default: a generated tiny one)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        ckpt = args.ckpt
        if ckpt is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from conftest import TINY

            from edgeinspect.models.tiny import make_tiny

            ckpt = make_tiny(Path(tmp) / "tiny", TINY)
        export_vision_onnx(ckpt, base / "vision.onnx")
        frames = sample_frames(ckpt, static=True)
        np.save(base / "calibration.npy", np.concatenate(frames.calibration))
        np.save(base / "check.npy", frames.check)
        kinds = {}
        for model in [None, *EMULATED]:
            if model and shutil.which("qemu-x86_64") is None:
                continue
            work = Path(tmp) / (model or "native")
            shutil.copytree(base, work)
            kinds[model or "native"] = {"cpu_features": EMULATED.get(model, "this CPU"), **qualify(work, model)}
        native = Path(tmp) / "native"
        timing = {name: ms_per_image(native / f"{name}.onnx", frames.check) for name in ("vision", "qdq", "dynamic")}
    payload = {
        "what": "worst visual-token cosine vs fp32 ONNX of the int8 vision copies, per CPU kind (8 check frames)",
        "command": "python bench/vision_int8_cpus.py" + (f" --ckpt {args.ckpt}" if args.ckpt else ""),
        "checkpoint": str(args.ckpt or "tiny (tests/conftest.TINY)"),
        "bound": INT8_MIN_COSINE,
        "kinds": kinds,
        "native_ms_per_image": {"fp32": timing["vision"], "qdq": timing["qdq"], "dynamic": timing["dynamic"]},
        "machine": machine_info(bandwidth=False),
    }
    print(json.dumps({k: payload[k] for k in ("kinds", "native_ms_per_image")}, indent=1))
    write_json("vision_int8_cpus", payload, args.out)


if __name__ == "__main__":
    main()
