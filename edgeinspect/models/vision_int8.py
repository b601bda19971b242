"""The int8 vision copies of an ONNX export (dynamic for the CPU, static QDQ for a GPU), each built for the CPU it
runs on and kept only if it measures within INT8_MIN_COSINE of the fp32 export there.

Why measure rather than trust a format: ONNX Runtime's x86 int8 GEMM on a CPU with AVX2 or AVX-512 but no VNNI sums
u8 x s8 products in pairs into int16 (VPMADDUBSW), which saturates with full-range 8-bit weights (ONNX Runtime's
quantization docs). On the tiny checkpoint under qemu's EPYC-Rome model (AVX2, no VNNI) the worst visual token fell to
cosine 0.93 (static and dynamic; 0.956 static on a real AVX2-only EPYC in CI), against 0.999 on a VNNI CPU
(bench/results/vision_int8_cpus.json). 7-bit weights (`reduce_range`) keep every pair sum below 2^15 (2 x 255 x 64):
0.998 there. VNNI sums
in int32 and SSE4.1 widens to 16-bit products first, so 8-bit weights keep their extra bit there. The kernel family is
only known on the box that runs the file, so: 8-bit first, 7-bit where 8-bit misses the bound, refused with the
figures where both miss. A copy checked on another kernel family is checked again before it serves.

No torch here: the check runs where only onnxruntime and numpy are. `python -m edgeinspect.models.vision_int8 DIR`
builds both copies from DIR/vision.onnx, DIR/calibration.npy and DIR/check.npy and prints what this CPU gets, beside
the full-range 8-bit copies' figures (tests and bench/vision_int8_cpus.py run it under qemu with other CPU models).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinspect.errors import CheckpointError
from edgeinspect.models.cpu import cpu_model, int8_gemm_class
from edgeinspect.models.onnx_export import (
    INPUT_NAME,
    META_FINGERPRINT,
    META_WEIGHT_BITS,
    onnx_metadata,
    quantize_vision_onnx,
    quantize_vision_qdq,
    restamp,
    sample_calibration,
)

log = logging.getLogger(__name__)

INT8_MIN_COSINE = 0.99  # worst visual token vs fp32: what `backend: auto` asks of every candidate too
META_CHECKED_ON = "edgeinspect.int8_checked_on"  # the int8 GEMM class (models/cpu.int8_gemm_class) it passed on
META_CHECKED_COSINE = "edgeinspect.int8_checked_cosine"
WEIGHT_BITS = (8, 7)  # tried in this order


class Int8Unfit(CheckpointError):
    """No int8 copy keeps the visual tokens within the bound on this CPU."""


@dataclass(frozen=True)
class Int8Frames:
    """pixel_values for building and checking a copy: calibration batches (static QDQ only) and check frames."""

    calibration: Sequence[np.ndarray]  # [1, 3, S, S] each; empty for the dynamic copy
    check: np.ndarray  # [B, 3, S, S], frames the calibration did not see


def sample_frames(ckpt_path: Path, static: bool) -> Int8Frames:
    """The drawn sample set through the checkpoint's preprocessing: 32 calibration frames (static only) and 8 check
    frames drawn with another seed."""
    calibration = sample_calibration(ckpt_path) if static else []
    return Int8Frames(calibration, np.concatenate(sample_calibration(ckpt_path, per_part=1, seed=7)))


def worst_token_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Worst per-token cosine of two [B, N, D] token arrays."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30)
    return float(cos.min())


def _tokens(path: Path, pixels: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {INPUT_NAME: np.ascontiguousarray(pixels, dtype=np.float32)})[0]


def measure_copy(copy: Path, fp32: Path, check: np.ndarray) -> float:
    """The copy's worst visual-token cosine against the fp32 export on this CPU."""
    return worst_token_cosine(_tokens(copy, check), _tokens(fp32, check))


def build_int8_copy(
    fp32: Path, out: Path, frames: Int8Frames, static: bool, min_cosine: float = INT8_MIN_COSINE
) -> Path:
    """`out`: the int8 copy of `fp32` (static QDQ or dynamic) with the widest weights that keep the bound here."""
    out = Path(out)
    misses: dict[int, float] = {}
    for bits in WEIGHT_BITS:
        trial = out.with_name(f".{out.stem}-{bits}bit.onnx")
        try:
            if static:
                quantize_vision_qdq(fp32, trial, frames.calibration, weight_bits=bits)
            else:
                quantize_vision_onnx(fp32, trial, weight_bits=bits)
            cosine = measure_copy(trial, fp32, frames.check)
            if cosine >= min_cosine:
                restamp(trial, out, {META_CHECKED_ON: int8_gemm_class(), META_CHECKED_COSINE: f"{cosine:.6f}"})
                log.info(
                    "int8 vision copy %s: %d-bit weights, worst token cosine %.4f on %s",
                    out,
                    bits,
                    cosine,
                    int8_gemm_class() or "this CPU",
                )
                return out
            misses[bits] = cosine
        finally:
            trial.unlink(missing_ok=True)
    raise Int8Unfit(unfit_message(misses, min_cosine))


def unfit_message(misses: dict[int, float], min_cosine: float) -> str:
    figures = ", ".join(f"{c:.4f} with {bits}-bit weights" for bits, c in misses.items())
    why = ""
    if int8_gemm_class() == "x86-avx2":
        why = (
            " This CPU has no AVX512-VNNI or AVX-VNNI: ONNX Runtime's int8 kernels sum u8 x s8 pairs in 16 bits"
            " there and saturate."
        )
    return (
        f"int8 vision does not keep its accuracy on this CPU ({cpu_model() or 'unknown model'}): worst visual-token "
        f"cosine vs fp32 {figures}, below {min_cosine}.{why} Use weights fp32 or bf16, or backend torch with "
        "weights int8 (int8 weights with float activations do not saturate)."
    )


def checked_int8_copy(fp32: Path, out: Path, frames: Callable[[], Int8Frames], static: bool) -> Path:
    """`out` ready to serve on this CPU: kept where it passed on this kernel family, else checked here again,
    else (missing, or failing here) built anew. `frames` is called only when something must be measured."""
    out = Path(out)
    if out.is_file():
        meta = onnx_metadata(out)
        if meta.get(META_FINGERPRINT) != onnx_metadata(fp32).get(META_FINGERPRINT):
            log.warning("int8 vision copy %s was made from another export: rebuilding it", out)
        elif meta.get(META_CHECKED_ON) == int8_gemm_class():
            return out
        else:
            cosine = measure_copy(out, fp32, frames().check)
            if cosine >= INT8_MIN_COSINE:
                restamp(out, out, {META_CHECKED_ON: int8_gemm_class(), META_CHECKED_COSINE: f"{cosine:.6f}"})
                return out
            log.warning(
                "int8 vision copy %s (%s-bit weights, checked on %s) gives worst token cosine %.4f here (%s): "
                "rebuilding it for this CPU",
                out,
                meta.get(META_WEIGHT_BITS, "8"),
                meta.get(META_CHECKED_ON, "no CPU"),
                cosine,
                int8_gemm_class(),
            )
    log.info("building the int8 vision copy %s from %s for this CPU (first start)", out, fp32)
    return build_int8_copy(fp32, out, frames(), static)


def qualify_here(work: Path) -> dict[str, dict[str, float]]:
    """Both copies built in `work` as a node here would, with the full-range 8-bit ones measured beside them."""
    fp32 = work / "vision.onnx"
    frames = Int8Frames(list(np.load(work / "calibration.npy")[:, None]), np.load(work / "check.npy"))
    out: dict[str, dict[str, float]] = {}
    for kind, static in (("qdq", True), ("dynamic", False)):
        full = work / f"{kind}-8bit.onnx"
        if static:
            quantize_vision_qdq(fp32, full, frames.calibration, weight_bits=8)
        else:
            quantize_vision_onnx(fp32, full, weight_bits=8)
        built = build_int8_copy(fp32, work / f"{kind}.onnx", frames, static)
        out[kind] = {
            "full_range_cosine": round(measure_copy(full, fp32, frames.check), 6),
            "chosen_bits": int(onnx_metadata(built)[META_WEIGHT_BITS]),
            "chosen_cosine": round(measure_copy(built, fp32, frames.check), 6),
        }
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(qualify_here(Path(sys.argv[1]))))
