"""The SigLIP vision tower, loaded alone from a checkpoint: pixels -> visual tokens (before the aligner)."""

from __future__ import annotations

import copy

import torch
from PIL import Image
from torch import nn
from transformers import AttentionInterface, AutoModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from edgeinspect.models.checkpoint import VISION_PREFIX, Checkpoint, load_processor, torch_dtype

NATIVE_ATTENTION = "edgeinspect_native"


class VisionTower(nn.Module):
    """pixel_values [B, 3, S, S] -> visual tokens [B, (S/patch)^2, vision_hidden]."""

    def __init__(self, ckpt: Checkpoint, attention: str = "sdpa"):
        super().__init__()
        cfg = copy.deepcopy(ckpt.vision_config)  # the checkpoint's own config keeps its implementation
        cfg._attn_implementation = attention
        with torch.device("meta"):
            self.vision_model = AutoModel.from_config(cfg)
        self.vision_model.embeddings.register_forward_hook(_contiguous)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision_model(pixel_values).last_hidden_state


def _contiguous(module, args, output: torch.Tensor) -> torch.Tensor:
    """SigLIP's patch embeddings come out of the convolution transposed ([B, C, N] memory seen as [B, N, C]); the
    encoder's residual adds then kept that layout all the way through, each add mixing layouts (~1 ms a time) and
    each layer norm copying it: ~50 ms of a 0.8 s int8 encode on a 2-core Zen 4. One copy here, the same values."""
    return output.contiguous()


def load_vision_tower(ckpt: Checkpoint, weights: str = "fp32") -> VisionTower:
    """Only the vision tower's tensors are read from the safetensors files.

    int8: every linear as an Int8Linear (per-channel int8 weights, activations quantized per token; the prompt GEMM
    of the decoder stages, models/quant.py) and attention in the native kernel without its causal mask
    (native_attention): together 1.15 -> ~0.75 s per 384 px image on a 2-core Zen 4 (bench/NOTES.md, vision)."""
    int8 = weights == "int8"
    tower = VisionTower(ckpt, NATIVE_ATTENTION if int8 else "sdpa")
    dtype = torch.float32 if int8 else torch_dtype(weights)
    state = ckpt.read(ckpt.keys_with_prefix(VISION_PREFIX), dtype, strip=VISION_PREFIX)
    tower.vision_model.load_state_dict(state, strict=True, assign=True)
    # Non-persistent buffers (position ids) are not in the checkpoint: rebuild them on the CPU.
    for module in tower.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                module.register_buffer(name, _rebuild_buffer(name, buf), persistent=False)
    if int8:
        from edgeinspect.models.quant import Int8Linear, quantize_linears

        quantize_linears(tower)
        for module in tower.modules():  # SiglipMLP: fc1 -> activation_fn -> fc2; fc1's kernel applies the GELU
            fc1 = getattr(module, "fc1", None)
            if isinstance(fc1, Int8Linear) and tower.vision_model.config.hidden_act == "gelu_pytorch_tanh":
                fc1.gelu, module.activation_fn = True, nn.Identity()
    return tower.eval()


def native_attention(module, query, key, value, attention_mask, scaling=None, is_causal=None, **kwargs):
    """SigLIP's attention through models/kernels/prompt_attention.c with the causal mask off (bf16 dot products on
    AVX512-BF16, fp32 on AVX2); query/key/value [B, H, N, hd] -> [B, N, H, hd]. SDPA where the kernel declines
    (no SIMD path, a head_dim it does not take) or where there is a mask (a vision tower has none)."""
    from edgeinspect.models.kernels import ops

    if attention_mask is None and not is_causal and query.dtype == torch.float32:
        images = zip(query, key, value, strict=True)  # one kernel call per image: [H, N, hd] each
        outs = [ops.prompt_attention(q, k, v, 0, scaling, causal=False) for q, k, v in images]
        if all(o is not None for o in outs):
            batch, heads, n, hd = query.shape
            return torch.stack(outs).view(batch, n, heads, hd), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, is_causal=is_causal)


AttentionInterface.register(NATIVE_ATTENTION, native_attention)


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
