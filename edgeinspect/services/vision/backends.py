"""Vision backends behind one call: pixel_values [B, 3, S, S] float32 -> visual tokens [B, N, D] float32.

Chosen by a table keyed by VisionBackend; each loader takes the opened checkpoint and the role's settings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from edgeinspect.config import VisionBackend, VisionSettings, WeightsDtype
from edgeinspect.errors import CheckpointError
from edgeinspect.models.checkpoint import Checkpoint, torch_dtype

log = logging.getLogger(__name__)


class Backend(Protocol):
    name: str

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor: ...

    def close(self) -> None: ...


class TorchBackend:
    """The VisionTower module (fp32, bf16, or int8: int8 linears and native attention, fp32 activations between
    them); output always float32."""

    name = "torch"

    def __init__(self, ckpt: Checkpoint, weights: str) -> None:
        from edgeinspect.models.vision import load_vision_tower

        if weights not in ("fp32", "bf16", "int8"):
            raise CheckpointError(f"the torch vision backend runs fp32, bf16 or int8 weights, not {weights!r}")
        self.weights = weights  # fp32 | bf16 | int8: what the anomaly gate's siglip features must match to share it
        self.dtype = torch.float32 if weights == "int8" else torch_dtype(weights)
        self.tower = load_vision_tower(ckpt, weights)

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.tower(pixel_values.to(self.dtype)).float()  # [B, N, D]

    def close(self) -> None:
        self.tower = None


class OnnxBackend:
    """An onnxruntime InferenceSession over our export, refused when stamped with another checkpoint."""

    name = "onnxruntime"

    def __init__(self, path: Path, fingerprint: str, threads: int = 0) -> None:
        import onnxruntime as ort

        from edgeinspect.models.onnx_export import INPUT_NAME, check_onnx_matches

        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        check_onnx_matches(dict(self.session.get_modelmeta().custom_metadata_map), path, fingerprint)
        self.input_name = INPUT_NAME
        self.path = path

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        feed = {self.input_name: pixel_values.to(torch.float32).contiguous().numpy()}
        return torch.from_numpy(self.session.run(None, feed)[0])  # [B, N, D]

    def close(self) -> None:
        self.session = None


def default_onnx_path(ckpt: Checkpoint) -> Path:
    """Where a missing export goes: beside the checkpoint when writable, else under var/onnx/."""
    name = f"vision-{ckpt.fingerprint}.onnx"
    beside = ckpt.path / ".edgeinspect-onnx"
    if os.access(ckpt.path, os.W_OK):
        return beside / name
    return Path("var/onnx").resolve() / name


def _load_torch(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    return TorchBackend(ckpt, cfg.weights.value)


def _load_onnx(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    path = Path(cfg.onnx_path) if cfg.onnx_path else default_onnx_path(ckpt)
    if not path.is_file():
        from edgeinspect.models.onnx_export import export_vision_onnx

        log.info("no ONNX export at %s: exporting the vision tower of %s there (first start)", path, ckpt.path)
        export_vision_onnx(ckpt.path, path)
    log.info("onnxruntime backend: %s", path)
    return OnnxBackend(path, ckpt.fingerprint, cfg.threads)


def _load_hailo(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    from edgeinspect.models.hailo_backend import HailoVisionBackend, import_hailo

    import_hailo()  # the install hint comes before any complaint about settings
    if cfg.hef_path is None:
        raise CheckpointError("backend hailo needs hef_path: the HEF compiled from the ONNX export")
    vision = ckpt.config.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2
    return HailoVisionBackend(Path(cfg.hef_path), vision.image_size, tokens, vision.hidden_size)


def _load_onnx_int8(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    """The dynamic-int8 copy of the export (made from the fp32 one on first use, beside it)."""
    fp32 = Path(cfg.onnx_path) if cfg.onnx_path else default_onnx_path(ckpt)
    path = fp32.with_name(fp32.stem + "-int8.onnx")
    if not path.is_file():
        from edgeinspect.models.onnx_export import export_vision_onnx, quantize_vision_onnx

        if not fp32.is_file():
            export_vision_onnx(ckpt.path, fp32)
        log.info("no int8 ONNX copy at %s: quantising %s there (first start)", path, fp32)
        quantize_vision_onnx(fp32, path)
    return OnnxBackend(path, ckpt.fingerprint, cfg.threads)


def auto_loaders(ckpt: Checkpoint, cfg: VisionSettings) -> dict[str, Callable[[], Backend]]:
    """A loader for each `backend: auto` candidate that can run here (services/vision/autobackend.candidates)."""
    from edgeinspect.services.vision.autobackend import candidates

    def torch_with(weights: str) -> Callable[[], Backend]:
        return lambda: _load_torch(ckpt, cfg.model_copy(update={"weights": WeightsDtype(weights)}))

    loaders: dict[str, Callable[[], Backend]] = {f"torch-{w}": torch_with(w) for w in ("fp32", "bf16", "int8")}
    loaders["onnxruntime-fp32"] = lambda: _load_onnx(ckpt, cfg)
    loaders["onnxruntime-int8"] = lambda: _load_onnx_int8(ckpt, cfg)
    loaders["hailo"] = lambda: _load_hailo(ckpt, cfg)
    return {name: loaders[name] for name in candidates(cfg)}


def _load_auto(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    from edgeinspect.services.vision.autobackend import choose_backend

    backend, _ = choose_backend(ckpt, cfg, auto_loaders(ckpt, cfg))
    return backend


LOADERS: dict[VisionBackend, Callable[[Checkpoint, VisionSettings], Backend]] = {
    VisionBackend.torch: _load_torch,
    VisionBackend.onnxruntime: _load_onnx,
    VisionBackend.hailo: _load_hailo,
    VisionBackend.auto: _load_auto,
}


def load_backend(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    """The backend cfg.backend names, loaded for this checkpoint (auto: measured here, services/vision/autobackend)."""
    return LOADERS[VisionBackend(cfg.backend)](ckpt, cfg)
