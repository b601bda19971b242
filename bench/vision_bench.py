"""Vision encoder benchmark: seconds per image for torch fp32 (the baseline), torch bf16, torch int8 (our int8
linears and native attention, where the int8 kernel has a SIMD path), onnxruntime fp32 and onnxruntime int8
(dynamic), with each one's cosine similarity to torch fp32, on the 1.3B-shaped checkpoint.

    .venv/bin/python bench/vision_bench.py [--ckpt DIR] [--repeats 3] [--threads 2] [--out bench/results/vision.json]

The checkpoint is --ckpt, else $EDGEINSPECT_BENCH_CKPT, else var/checkpoints/deepseek-vl-1.3b (make it with
`edgeinspect model make-tiny var/checkpoints/deepseek-vl-1.3b --preset deepseek-vl-1.3b`); when it is missing the
run says so and uses a generated mid-size checkpoint instead. ONNX exports are cached in var/onnx/ by checkpoint
fingerprint (the node refuses a stale one anyway).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from edgeinspect.assets import asset_path
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.image_io import decode_image
from edgeinspect.models.kernels import bindings
from edgeinspect.models.onnx_export import export_vision_onnx, quantize_vision_onnx
from edgeinspect.models.tiny import TinySpec, make_tiny
from edgeinspect.models.vision import ImagePreprocessor
from edgeinspect.services.vision.backends import OnnxBackend, TorchBackend

DEFAULT_CKPT = Path("var/checkpoints/deepseek-vl-1.3b")
# When the 1.3B-shaped checkpoint is missing: a ViT-S-sized tower at 224 px (196 tokens), fast to generate.
MID_SIZE = TinySpec(
    layers=2,
    hidden=256,
    heads=4,
    kv_heads=4,
    intermediate=512,
    image_size=224,
    patch_size=16,
    vision_hidden=384,
    vision_layers=12,
    vision_heads=6,
    vision_intermediate=1536,
    initializer_range=0.02,
)
IMAGES = ["part_ok.jpg", "part_scratch.jpg", "part_dent.jpg"]


def resolve_checkpoint(arg: Path | None) -> tuple[Path, str]:
    path = arg or Path(os.environ.get("EDGEINSPECT_BENCH_CKPT", DEFAULT_CKPT))
    if (path / "config.json").is_file():
        return path, "given"
    print(
        f"checkpoint {path} not found (make it with `edgeinspect model make-tiny {path} --preset deepseek-vl-1.3b`);"
        " using a generated mid-size checkpoint instead",
        file=sys.stderr,
    )
    mid = Path("var/checkpoints/vision-bench-mid")
    if not (mid / "config.json").is_file():
        make_tiny(mid, MID_SIZE)
    return mid, "generated mid-size"


def cosine(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(mean, min) over tokens of the cosine similarity."""
    cos = torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)
    return float(cos.mean()), float(cos.min())


def time_backend(backend, pixels: list[torch.Tensor], repeats: int) -> tuple[list[torch.Tensor], float]:
    """Per-image outputs and the median seconds of one [1, 3, S, S] forward (after one warm-up)."""
    backend(pixels[0])
    outs, times = [], []
    for _ in range(repeats):
        outs = []
        for p in pixels:
            t0 = time.perf_counter()
            outs.append(backend(p)[0])
            times.append(time.perf_counter() - t0)
    return outs, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, default=None, help="checkpoint folder")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the images per backend")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (torch and onnxruntime)")
    parser.add_argument("--onnx-dir", type=Path, default=Path("var/onnx"), help="where exports are cached")
    parser.add_argument("--out", type=Path, default=Path("bench/results/vision.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)

    path, origin = resolve_checkpoint(args.ckpt)
    ckpt = open_checkpoint(path)
    vision = ckpt.config.vision_config
    pre = ImagePreprocessor(ckpt)
    t0 = time.perf_counter()
    images = [decode_image(asset_path(n).read_bytes(), 20 << 20, 40_000_000) for n in IMAGES]
    pixels = [pre(im) for im in images]  # each [1, 3, S, S]
    preprocess_ms = (time.perf_counter() - t0) / len(images) * 1e3

    fp32_onnx = args.onnx_dir / f"vision-{ckpt.fingerprint}.onnx"
    int8_onnx = args.onnx_dir / f"vision-{ckpt.fingerprint}-int8.onnx"
    export_s = None
    if not fp32_onnx.is_file():
        t0 = time.perf_counter()
        export_vision_onnx(ckpt.path, fp32_onnx)
        export_s = time.perf_counter() - t0
    if not int8_onnx.is_file():
        quantize_vision_onnx(fp32_onnx, int8_onnx)

    loaders = {
        "torch fp32": lambda: TorchBackend(ckpt, "fp32"),
        "torch bf16": lambda: TorchBackend(ckpt, "bf16"),
        "torch int8": lambda: TorchBackend(ckpt, "int8"),
        "onnxruntime fp32": lambda: OnnxBackend(fp32_onnx, ckpt.fingerprint, args.threads),
        "onnxruntime int8": lambda: OnnxBackend(int8_onnx, ckpt.fingerprint, args.threads),
    }
    if not bindings.q8_fast():  # the plain-C loop: correct, but no candidate (services/vision/autobackend.py)
        del loaders["torch int8"]
    rows, baseline, baseline_s = [], None, None
    for name, load in loaders.items():
        t0 = time.perf_counter()
        backend = load()
        load_s = time.perf_counter() - t0
        outs, seconds = time_backend(backend, pixels, args.repeats)
        if baseline is None:
            baseline, baseline_s = outs, seconds
        cos = [cosine(o, b) for o, b in zip(outs, baseline, strict=True)]
        rows.append(
            {
                "backend": name,
                "seconds_per_image": round(seconds, 4),
                "speedup_vs_torch_fp32": round(baseline_s / seconds, 2),
                "cosine_mean": round(statistics.mean(c[0] for c in cos), 6),
                "cosine_min_token": round(min(c[1] for c in cos), 6),
                "load_s": round(load_s, 2),
            }
        )
        print(f"{name:18s} {seconds:7.3f} s/image  cos mean {rows[-1]['cosine_mean']:.6f}", file=sys.stderr)
        backend.close()
        del backend
        gc.collect()

    result = {
        "checkpoint": str(ckpt.path),
        "checkpoint_origin": origin,
        "fingerprint": ckpt.fingerprint,
        "vision": {
            "image_size": vision.image_size,
            "tokens": (vision.image_size // vision.patch_size) ** 2,
            "hidden": vision.hidden_size,
            "layers": vision.num_hidden_layers,
        },
        "images": IMAGES,
        "repeats": args.repeats,
        "threads": args.threads,
        "preprocess_ms_per_image": round(preprocess_ms, 1),
        "onnx_export_s": None if export_s is None else round(export_s, 1),
        "onnx_bytes": {"fp32": fp32_onnx.stat().st_size, "int8": int8_onnx.stat().st_size},
        "machine": {
            "cpu_count": os.cpu_count(),
            # bf16 is only fast with AVX-512 BF16 / AMX; on an AVX2-only CPU torch emulates it.
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "load_average": [round(x, 1) for x in os.getloadavg()],
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
