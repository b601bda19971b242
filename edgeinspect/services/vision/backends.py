"""Vision backends behind one call: pixel_values [B, 3, S, S] float32 -> visual tokens [B, N, D] float32.

Chosen by a table keyed by VisionBackend; each loader takes the opened checkpoint and the role's settings.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from edgeinspect.config import WeightsDtype
from edgeinspect.errors import CheckpointError
from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.services.vision.settings import VisionBackend, VisionSettings

log = logging.getLogger(__name__)


class Backend(Protocol):
    name: str

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor: ...

    def close(self) -> None: ...


class TorchBackend:
    """The VisionTower module (fp32, bf16, or int8: int8 linears and native attention, fp32 activations between
    them); output always float32."""

    name = "torch"

    def __init__(self, ckpt: Checkpoint, weights: str, device: torch.device | None = None) -> None:
        from edgeinspect.models.vision import load_vision_tower
        from edgeinspect.services.vision.gpu import check_tower_weights

        self.device = device or torch.device("cpu")
        if self.device.type == "cpu" and weights not in ("fp32", "bf16", "int8"):
            raise CheckpointError(f"the torch vision backend runs fp32, bf16 or int8 weights, not {weights!r}")
        self.weights = weights  # fp32 | bf16 | int8: what the anomaly gate's siglip features must match to share it
        self.dtype = check_tower_weights(weights, self.device)
        if self.device.type == "cpu":
            self.tower = load_vision_tower(ckpt, weights)
        else:  # read in fp32, cast on the device (fp16 is no checkpoint dtype of ours)
            self.tower = load_vision_tower(ckpt, "fp32").to(self.device, self.dtype)

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            x = pixel_values.to(self.device, self.dtype, non_blocking=True)
            return self.tower(x).float().cpu()  # [B, N, D] on the host, where the codec is

    def close(self) -> None:
        self.tower = None


class OnnxBackend:
    """An onnxruntime InferenceSession over our export, refused when stamped with another checkpoint."""

    name = "onnxruntime"

    def __init__(self, path: Path, fingerprint: str, threads: int = 0, providers: list | None = None) -> None:
        import onnxruntime as ort

        from edgeinspect.models.onnx_export import INPUT_NAME, check_onnx_matches

        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        # CPU unless a GPU provider list is given (services/vision/gpu.py offers only installed ones)
        self.session = ort.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])
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


def _device(cfg: VisionSettings) -> torch.device:
    from edgeinspect.models.device import resolve_device

    return resolve_device(cfg.device, "vision")


def _load_torch(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    return TorchBackend(ckpt, cfg.weights.value, _device(cfg))


def _load_onnx(ckpt: Checkpoint, cfg: VisionSettings, provider: str | None = None) -> Backend:
    """The export under ONNX Runtime: CPU, or with a device the TensorRT provider where installed, else CUDA's.
    weights int8: the static QDQ copy (calibrated on first use), which runs int8 on the CPU and the GPU alike."""
    path = Path(cfg.onnx_path) if cfg.onnx_path else default_onnx_path(ckpt)
    if not path.is_file():
        from edgeinspect.models.onnx_export import export_vision_onnx

        log.info("no ONNX export at %s: exporting the vision tower of %s there (first start)", path, ckpt.path)
        export_vision_onnx(ckpt.path, path)
    int8 = cfg.weights is WeightsDtype.int8
    if int8:
        path = _int8_copy(ckpt, path, static=True)
    device = _device(cfg) if provider is None else torch.device("cuda", torch.cuda.current_device())
    providers = None
    if device.type == "cuda":
        from edgeinspect.services.vision.gpu import PROVIDERS, available_providers, provider_list

        if provider is None:
            provider = "tensorrt" if PROVIDERS["tensorrt"] in available_providers() else "cuda"
        providers = provider_list(provider, device, path, ckpt.fingerprint, int8=int8)
    log.info("onnxruntime backend: %s (%s)", path, provider or "cpu")
    return OnnxBackend(path, ckpt.fingerprint, cfg.threads, providers)


def _int8_copy(ckpt: Checkpoint, fp32: Path, static: bool) -> Path:
    """The int8 copy of the export beside it (static QDQ, calibrated on the drawn sample set, or dynamic), built and
    checked against fp32 for this CPU (models/vision_int8: 7-bit weights where 8-bit ones saturate; Int8Unfit with
    the figures where neither keeps the bound)."""
    from edgeinspect.models.vision_int8 import checked_int8_copy, sample_frames

    path = fp32.with_name(fp32.stem + ("-qdq.onnx" if static else "-int8.onnx"))
    return checked_int8_copy(fp32, path, lambda: sample_frames(ckpt.path, static), static)


def _load_hailo(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    from edgeinspect.models.hailo_backend import HailoVisionBackend, import_hailo

    import_hailo()  # the install hint comes before any complaint about settings
    if cfg.hef_path is None:
        raise CheckpointError("backend hailo needs hef_path: the HEF compiled from the ONNX export")
    vision = ckpt.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2
    return HailoVisionBackend(Path(cfg.hef_path), vision.image_size, tokens, vision.hidden_size)


def _load_onnx_int8(ckpt: Checkpoint, cfg: VisionSettings) -> Backend:
    """The dynamic-int8 copy of the export (made from the fp32 one on first use, beside it): `auto`'s CPU candidate."""
    if _device(cfg).type != "cpu":
        raise CheckpointError(
            "onnxruntime dynamic int8 runs its nodes on the host under the CUDA provider (and TensorRT cannot parse "
            "them); on a GPU, weights int8 with backend onnxruntime is the static QDQ copy"
        )
    fp32 = Path(cfg.onnx_path) if cfg.onnx_path else default_onnx_path(ckpt)
    if not fp32.is_file():
        from edgeinspect.models.onnx_export import export_vision_onnx

        export_vision_onnx(ckpt.path, fp32)
    return OnnxBackend(_int8_copy(ckpt, fp32, static=False), ckpt.fingerprint, cfg.threads)


def auto_loaders(ckpt: Checkpoint, cfg: VisionSettings) -> dict[str, Callable[[], Backend]]:
    """A loader for each `backend: auto` candidate that can run here (services/vision/autobackend.candidates)."""
    from edgeinspect.services.vision.autobackend import candidates

    host = cfg.model_copy(update={"device": "cpu"})  # the host candidates (torch-fp32 is the reference)

    def torch_with(weights: str) -> Callable[[], Backend]:
        return lambda: _load_torch(ckpt, host.model_copy(update={"weights": WeightsDtype(weights)}))

    loaders: dict[str, Callable[[], Backend]] = {f"torch-{w}": torch_with(w) for w in ("fp32", "bf16", "int8")}
    loaders["onnxruntime-fp32"] = lambda: _load_onnx(ckpt, host)
    loaders["onnxruntime-int8"] = lambda: _load_onnx_int8(ckpt, host)
    loaders["hailo"] = lambda: _load_hailo(ckpt, cfg)
    gpu = cfg.model_copy(update={"device": "cuda"})
    for w in ("fp16", "bf16"):
        loaders[f"torch-cuda-{w}"] = functools.partial(TorchBackend, ckpt, w, torch.device("cuda"))
    gpu_int8 = gpu.model_copy(update={"weights": WeightsDtype.int8})
    for kind in ("cuda", "tensorrt"):
        loaders[f"onnxruntime-{kind}"] = functools.partial(_load_onnx, ckpt, gpu, kind)
        loaders[f"onnxruntime-{kind}-int8"] = functools.partial(_load_onnx, ckpt, gpu_int8, kind)
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
