"""The SigLIP vision tower, loaded alone from a checkpoint: pixels -> visual tokens (before the aligner)."""

from __future__ import annotations

import torch
from PIL import Image
from torch import nn
from transformers import AutoModel

from edgeinspect.models.checkpoint import VISION_PREFIX, Checkpoint, load_processor, torch_dtype


class VisionTower(nn.Module):
    """pixel_values [B, 3, S, S] -> visual tokens [B, (S/patch)^2, vision_hidden]."""

    def __init__(self, ckpt: Checkpoint):
        super().__init__()
        cfg = ckpt.config.vision_config
        cfg._attn_implementation = "sdpa"
        with torch.device("meta"):
            self.vision_model = AutoModel.from_config(cfg)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision_model(pixel_values).last_hidden_state


def load_vision_tower(ckpt: Checkpoint, weights: str = "fp32") -> VisionTower:
    """Only the vision tower's tensors are read from the safetensors files."""
    tower = VisionTower(ckpt)
    state = ckpt.read(ckpt.keys_with_prefix(VISION_PREFIX), torch_dtype(weights), strip=VISION_PREFIX)
    tower.vision_model.load_state_dict(state, strict=True, assign=True)
    # Non-persistent buffers (position ids) are not in the checkpoint: rebuild them on the CPU.
    for module in tower.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                module.register_buffer(name, _rebuild_buffer(name, buf), persistent=False)
    return tower.eval()


def _rebuild_buffer(name: str, buf: torch.Tensor) -> torch.Tensor:
    if name == "position_ids":
        return torch.arange(buf.shape[-1]).expand(buf.shape).clone()
    raise ValueError(f"do not know how to rebuild buffer {name!r} of the vision tower")


class ImagePreprocessor:
    """DeepseekVLImageProcessorPil of the checkpoint (resize longest side, pad to square, normalise)."""

    def __init__(self, ckpt: Checkpoint):
        self.image_processor = load_processor(ckpt).image_processor

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.image_processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]  # [1, 3, S, S]
