"""Loading a stage: layers [start, end) of DeepSeek-VL's language model built on the meta device and filled with
just their tensors, converted to the stage's weight format layer by layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.deepseek_vl.modeling_deepseek_vl import DeepseekVLAligner
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from edgeinspect.errors import InvalidInput
from edgeinspect.models.checkpoint import (
    ALIGNER_PREFIX,
    EMBED_KEY,
    NORM_KEY,
    QUANTIZED,
    Checkpoint,
    layer_prefix,
    load_dtype,
)
from edgeinspect.models.int4 import Int6Linear, fits, int4_linears
from edgeinspect.models.quant import (
    Int8Linear,
    fuse_projections,
    half16_linears,
    quantize_linears,
    resolve_weights,
    use_half16,
)
from edgeinspect.models.weight_arena import huge_page_weights


@dataclass(frozen=True)
class LayerRange:
    """Layers [start, end) of a model with `total` layers."""

    start: int
    end: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= self.total:
            raise InvalidInput(f"layer range [{self.start}, {self.end}) is not inside [0, {self.total})")

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.total

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}) of {self.total}"


class StageModule(nn.Module):
    """The weights one stage holds; nothing outside its range is ever materialised."""

    def __init__(self, ckpt: Checkpoint, layers: LayerRange):
        super().__init__()
        cfg = ckpt.text_config
        cfg._attn_implementation = "sdpa"  # what from_pretrained picks on CPU: the oracle uses the same kernel
        self.config = cfg
        self.range = layers
        self.weights = "fp32"  # the format load_stage filled it in (int8 keeps fp32 norms beside Int8Linear)
        self.image_token_id = ckpt.config.image_token_id
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if layers.is_first else None
            self.aligner = DeepseekVLAligner(ckpt.config) if layers.is_first else None
            self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(layers.start, layers.end))
            self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps) if layers.is_last else None
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if layers.is_last else None
        self.rotary_emb = LlamaRotaryEmbedding(config=cfg)  # buffers computed from config, not stored weights

    def checkpoint_keys(self, ckpt: Checkpoint) -> dict[str, str]:
        """Our parameter name -> checkpoint tensor name."""
        keys: dict[str, str] = {}
        for j, i in enumerate(range(self.range.start, self.range.end)):
            for key in ckpt.keys_with_prefix(layer_prefix(i)):
                keys[f"layers.{j}.{key.removeprefix(layer_prefix(i))}"] = key
        if self.range.is_first:
            keys["embed_tokens.weight"] = EMBED_KEY
            for key in ckpt.keys_with_prefix(ALIGNER_PREFIX):
                keys[f"aligner.{key.removeprefix(ALIGNER_PREFIX)}"] = key
        if self.range.is_last:
            keys["norm.weight"] = NORM_KEY
            keys["lm_head.weight"] = ckpt.lm_head_key
        return keys


def load_stage(
    ckpt: Checkpoint, layers: LayerRange, weights: str = "fp32", int8_kernel: str | None = None
) -> StageModule:
    """Builds the stage on the meta device and fills it with just its tensors from the safetensors files.

    Tensors are read one layer at a time; with `weights="int8"` (or "int4"/"int6", models/int4.py) each layer's linears
    (and the lm_head) are quantized right after reading, so fp32 copies of at most one layer exist at once.
    """
    if weights == "auto":  # measured on this CPU for this checkpoint (cached): models/autoformat.py
        from edgeinspect.models.autoformat import choose_weights

        weights = choose_weights(ckpt).weights
    weights = resolve_weights(weights)
    dtype = load_dtype(weights)
    module = StageModule(ckpt, layers)
    keys = module.checkpoint_keys(ckpt)
    groups: dict[str, dict[str, str]] = {}
    for ours, theirs in keys.items():
        group = ".".join(ours.split(".")[:2]) if ours.startswith("layers.") else ours.split(".")[0]
        groups.setdefault(group, {})[ours] = theirs
    for group, names in groups.items():
        tensors = ckpt.read(names.values(), dtype)
        module.load_state_dict({ours: tensors[theirs] for ours, theirs in names.items()}, strict=False, assign=True)
        if group.startswith("layers."):
            layer = module.layers[int(group.split(".")[1])]
            if weights != "fp32":
                fuse_projections(layer)
            if weights == "int8":
                quantize_linears(layer, int8_kernel)
            elif weights in ("int4", "int6"):
                int4_linears(layer, bits=int(weights[3:]))
            elif use_half16(weights):
                half16_linears(layer)
                layer.float()  # norms: activations stay fp32 beside the 16-bit packed weights
    leftover = [n for n, p in module.named_parameters() if p.is_meta]
    if leftover:
        raise InvalidInput(f"checkpoint {ckpt.path} lacks weights for {', '.join(leftover[:5])}")
    if weights == "int8" and module.lm_head is not None:
        module.lm_head = Int8Linear.from_linear(module.lm_head, int8_kernel)
    if weights in QUANTIZED and module.aligner is not None:  # 576 visual tokens: ~50 ms of fp32 GEMM at 1.3B
        quantize_linears(module.aligner, int8_kernel if weights == "int8" else None)
    if weights == "int4" and module.lm_head is not None:  # int8: its error lands on the logits (models/int4.py)
        module.lm_head = Int8Linear.from_linear(module.lm_head)
    if weights == "int6" and module.lm_head is not None:  # 1/4 of q4_0's error: 6 bits hold there too
        head = module.lm_head
        module.lm_head = Int6Linear(head) if fits(head) else Int8Linear.from_linear(head)
    if use_half16(weights):
        for part in (module.aligner, module.norm):
            if part is not None:
                part.float()
        if module.lm_head is not None:
            half16_linears(module)  # the lm_head (the layers are done); embeddings stay bf16, cast on lookup
    if weights in QUANTIZED:  # int8/int4/int6: decode streams them: one mapping on huge pages (models/weight_arena.py)
        huge_page_weights(module)
    module.rotary_emb.to(torch.float32)
    module.weights = weights
    return module.eval()


def load_device_stage(ckpt: Checkpoint, layers: LayerRange, weights: str, device: torch.device) -> StageModule:
    """load_stage on the CPU; on a CUDA device the stage read in fp32 and moved there in a device format
    (stage/device.py), refused with the reason when the device cannot run it."""
    if device.type == "cpu":
        return load_stage(ckpt, layers, weights)
    from edgeinspect.models.stage.device import format_refusal, to_device_format

    if weights == "auto":
        raise InvalidInput(
            f"weights auto is measured on CPUs only; on {device} name bf16, int8 or int4 (bench/gpu.py times them)"
        )
    reason = format_refusal(weights, device)  # before reading gigabytes of weights
    if reason:
        raise InvalidInput(f"stage {layers} on {device}: {reason}")
    return to_device_format(load_stage(ckpt, layers, "fp32"), weights, device)
