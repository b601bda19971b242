"""Vision on a GPU: the torch tower on a CUDA device in fp16/bf16, and ONNX Runtime's CUDA and TensorRT execution
providers over the same export.

A provider is offered only when onnxruntime.get_available_providers() lists it (the onnxruntime-gpu wheel, or
JetPack's); otherwise the backend is refused with the reason. TensorRT builds an engine per GPU and TensorRT version
on the first run (minutes at ViT-L size), so engines are cached in a folder keyed by the checkpoint fingerprint and
the TensorRT version: a new checkpoint or TensorRT never loads a stale engine. int8 on a GPU is the static QDQ copy
of the export (models/onnx_export.quantize_vision_qdq): quantize_dynamic's DynamicQuantizeLinear/MatMulInteger nodes
go back to the host under the CUDA EP and TensorRT cannot parse them (DESIGN §9), so the dynamic copy is refused here.
"""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path

import torch

from edgeinspect.errors import CheckpointError

log = logging.getLogger(__name__)

GPU_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


def available_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())


def tensorrt_version() -> str:
    """The TensorRT the provider links (its Python package's version; JetPack ships it as `tensorrt`)."""
    for dist in ("tensorrt", "tensorrt-libs", "tensorrt_libs"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def engine_cache_dir(onnx_path: Path, fingerprint: str) -> Path:
    """TensorRT engines for this checkpoint and TensorRT version, beside the export."""
    return onnx_path.parent / "trt-engines" / f"{fingerprint}-trt{tensorrt_version()}"


def provider_list(kind: str, device: torch.device, onnx_path: Path, fingerprint: str, int8: bool = False) -> list:
    """ONNX Runtime providers for `kind` (cuda | tensorrt) on `device`, CPU last for the few nodes they lack.
    int8: the model is the QDQ copy; TensorRT then builds int8 kernels from its Q/DQ scales (no calibration table)."""
    wanted = PROVIDERS[kind]
    have = available_providers()
    if wanted not in have:
        raise CheckpointError(
            f"onnxruntime {kind}: {wanted} is not in this onnxruntime's providers ({', '.join(have) or 'none'}); "
            f"install onnxruntime-gpu (JetPack: NVIDIA's onnxruntime wheel) or use backend torch with a device"
        )
    index = device.index or 0
    cuda = ("CUDAExecutionProvider", {"device_id": index})
    if kind == "cuda":
        return [cuda, "CPUExecutionProvider"]
    cache = engine_cache_dir(onnx_path, fingerprint)
    cache.mkdir(parents=True, exist_ok=True)
    trt = (
        "TensorrtExecutionProvider",
        {
            "device_id": index,
            "trt_fp16_enable": True,
            "trt_int8_enable": int8,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(cache),
        },
    )
    log.info("tensorrt engines cached in %s", cache)
    return [trt, cuda, "CPUExecutionProvider"]


def check_tower_weights(weights: str, device: torch.device) -> torch.dtype:
    """The torch tower's dtype on `device`; int8 (our CPU kernels) is refused on a GPU."""
    if device.type == "cpu":
        return torch.float32 if weights == "int8" else GPU_DTYPES[weights]
    if weights not in GPU_DTYPES:
        raise CheckpointError(
            f"the torch vision tower on {device} runs fp16, bf16 or fp32, not {weights!r} (int8 on a GPU: backend "
            f"onnxruntime with weights int8, the static QDQ copy)"
        )
    if weights == "bf16" and not torch.cuda.is_bf16_supported():
        raise CheckpointError(f"{device} has no bf16: use fp16 vision weights")
    return GPU_DTYPES[weights]


def gpu_candidates() -> list[str]:
    """`backend: auto` candidates a GPU adds: the torch tower in 16 bits and the GPU providers that are installed."""
    if not torch.cuda.is_available():
        return []
    out = ["torch-cuda-fp16"]
    if torch.cuda.is_bf16_supported():
        out.append("torch-cuda-bf16")
    have = available_providers()
    for kind, name in PROVIDERS.items():
        if name in have:
            out += [f"onnxruntime-{kind}", f"onnxruntime-{kind}-int8"]  # fp16/fp32 export and its QDQ int8 copy
    return out
