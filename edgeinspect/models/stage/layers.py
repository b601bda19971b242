"""The layer paths of a stage executor, one class each, and the table a stage picks its path from once, at load.

- "torch": transformers' own modules and ops (LlamaRMSNorm, apply_rotary_pos_emb, act_fn): what generate() runs, so
  fp32 stages match it bit for bit; also packed stages where the native kernels are off or the MLP is not silu.
- "native": packed CPU stages: norms (with their residual add), rotary and silu * up in the native kernels
  (models/kernels/ops.py) instead of ~40 small torch ops per layer.
- "native-stage": "native", and a pure decode step of up to DecodeLayers.MAX_ROWS sessions runs every layer of the
  stage in one native call (projections all vnni int8 or our int4: the same steps, the same bits).

- "device": a stage on a CUDA device (formats in stage/device.py): prompts as "torch"; a pure decode step over
  static KV caches through decode_static (a fixed sequence of tensor ops, captured into CUDA graphs there). It runs
  on the CPU too, which is how CI checks it against "torch".

The executor never asks which path it runs; attention and the KV cache stay the executor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from edgeinspect.models.int4 import Int4Linear
from edgeinspect.models.kernels import ops
from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.quant import Int8Linear
from edgeinspect.models.stage.device import DecodeGraphs

if TYPE_CHECKING:
    from edgeinspect.models.stage.executor import StageExecutor


def offsets(spans: Sequence[tuple[int, int]]) -> list[int]:
    """Row offset of each session's new positions in the concatenated batch."""
    out, acc = [], 0
    for _, t in spans:
        out.append(acc)
        acc += t
    return out


def pure_decode(spans, decode) -> bool:
    """Whether every session of the step adds one row and attends natively (`decode`: a DecodeAttention or None,
    and the indices of its sessions)."""
    return decode[0] is not None and len(decode[1]) == len(spans)


class TorchLayers:
    """transformers' own ops, layer by layer (see the module's docstring)."""

    decode_layers: ops.DecodeLayers | None = None

    def __init__(self, ex: StageExecutor):
        self.ex = ex

    @classmethod
    def build(cls, ex: StageExecutor) -> TorchLayers:
        return cls(ex)

    def norm(self, norm, x: torch.Tensor) -> torch.Tensor:
        return norm(x)

    def add_norm(self, norm, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, its norm)."""
        x = x + y
        return x, norm(x)

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)

    def mlp(self, mlp):
        """LlamaMLP itself, or its fused form: down(act(gate(x)) * up(x)) with gate and up from one GEMM."""
        if not hasattr(mlp, "gate_up_proj"):
            return mlp

        def fused(h: torch.Tensor) -> torch.Tensor:
            gate, up = mlp.gate_up_proj(h).chunk(2, dim=-1)  # [R, I] each
            return mlp.down_proj(mlp.act_fn(gate) * up)

        return fused

    def run(self, x: torch.Tensor, rope, sessions, spans, decode, keep=None) -> torch.Tensor:
        """x [R, D] through every layer of the stage; with `keep` (row indices), the last layer returns only those."""
        layers = self.ex.module.layers
        for j, layer in enumerate(layers):
            x = self.layer(j, layer, x, rope, sessions, spans, decode, keep if j == len(layers) - 1 else None)
        return x

    def layer(self, j: int, layer, x: torch.Tensor, rope, sessions, spans, decode, keep=None) -> torch.Tensor:
        """LlamaDecoderLayer.forward with the layer's own modules, its cache write replaced by KVBuffer.write.
        With `keep` (row indices), only those rows go on past attention, and only they are returned."""
        ex, attn = self.ex, layer.self_attn
        r = x.shape[0]
        h = self.norm(layer.input_layernorm, x)  # [R, D]
        if hasattr(attn, "qkv_proj"):  # fused at load (packed formats)
            q_width, kv_width = ex.heads * ex.head_dim, ex.kv_heads * ex.head_dim
            q, k, v = ex.rows(attn.qkv_proj, h, spans).split([q_width, kv_width, kv_width], dim=-1)
        else:
            q, k, v = (ex.rows(p, h, spans) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        q, k, v = (t.reshape(r, -1, ex.head_dim) for t in (q, k, v))  # [R, H, hd], [R, H_kv, hd] (views)
        q, k = self.rope(q, k, *rope)
        a = ex.attention(j, attn, q, k, v, sessions, spans, decode)  # [R, H*hd]
        if keep is not None:
            a, x = a[keep], x[keep]
            if not len(keep):
                return x
        x, h = self.add_norm(layer.post_attention_layernorm, x, ex.rows(attn.o_proj, a, spans))
        return x + ex.rows(self.mlp(layer.mlp), h, spans)


class NativeLayers(TorchLayers):
    """Norms, rotary and silu * up in the native kernels (see the module's docstring)."""

    def norm(self, norm, x: torch.Tensor) -> torch.Tensor:
        return ops.rmsnorm(x, norm.weight, norm.variance_epsilon)

    def add_norm(self, norm, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.rmsnorm(x, norm.weight, norm.variance_epsilon, add=y)  # the residual add and the norm in one pass

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        ops.rope_(q, k, cos, sin)  # in place, one pass (974 rows at 1.3B: 0.4 ms a layer, apply_rotary_pos_emb 3.7)
        return q, k

    def mlp(self, mlp):
        """The fused MLP with act * up in one threaded pass (ops.silu_mul), not two torch ops over [R, I] each."""
        if not hasattr(mlp, "gate_up_proj"):
            return mlp

        def fused(h: torch.Tensor) -> torch.Tensor:
            if isinstance(mlp.gate_up_proj, (Int8Linear, Int4Linear)):
                return mlp.down_proj(mlp.gate_up_proj.silu_mul(h))  # [R, I]
            return mlp.down_proj(ops.silu_mul(mlp.gate_up_proj(h)))

        return fused

    def run(self, x: torch.Tensor, rope, sessions, spans, decode, keep=None) -> torch.Tensor:
        if not pure_decode(spans, decode):
            return super().run(x, rope, sessions, spans, decode, keep)
        for j, layer in enumerate(self.ex.module.layers):
            x = self.decode_layer(j, layer, x, rope, decode[0])
        return x

    def decode_layer(self, j: int, layer, x: torch.Tensor, rope, native) -> torch.Tensor:
        """layer() for a pure decode step: the same steps, each projection called once over the step's rows."""
        ex, attn, mlp = self.ex, layer.self_attn, layer.mlp
        r = x.shape[0]
        h = self.norm(layer.input_layernorm, x)
        qkv = attn.qkv_proj(h)  # [R, (H + 2 H_kv) * hd]
        q_width, kv_width = ex.heads * ex.head_dim, ex.kv_heads * ex.head_dim
        q, k, v = (t.view(r, -1, ex.head_dim) for t in qkv.split([q_width, kv_width, kv_width], dim=-1))
        ops.rope_(q, k, *rope)
        a = native(j, q, k, v, attn.scaling)  # [R, H*hd]
        x, h = self.add_norm(layer.post_attention_layernorm, x, attn.o_proj(a))
        return x + mlp.down_proj(ops.silu_mul(mlp.gate_up_proj(h)))


class NativeStageLayers(NativeLayers):
    """NativeLayers, with a pure decode step's layers all in one native call (see the module's docstring)."""

    def __init__(self, ex: StageExecutor, decode_layers: ops.DecodeLayers):
        super().__init__(ex)
        self.decode_layers = decode_layers

    @classmethod
    def build(cls, ex: StageExecutor) -> NativeStageLayers:
        return cls(ex, ops.DecodeLayers(ex.module.layers, ex.heads, ex.kv_heads, ex.head_dim))

    def run(self, x: torch.Tensor, rope, sessions, spans, decode, keep=None) -> torch.Tensor:
        if pure_decode(spans, decode) and len(spans) <= ops.DecodeLayers.MAX_ROWS:
            return self.decode_layers(x, *rope, decode[0])  # every layer in one native call
        return super().run(x, rope, sessions, spans, decode, keep)


class DeviceLayers(TorchLayers):
    """The layer path of a device stage: prompts as TorchLayers (SDPA over each session's cache, GQA in SDPA);
    a pure decode step over static caches through decode_static, captured into CUDA graphs on a GPU."""

    def __init__(self, ex: StageExecutor):
        super().__init__(ex)
        use_graphs = ex.device.type == "cuda" and ex.cuda_graphs
        self.graphs = DecodeGraphs(self.decode_static, ex.device) if use_graphs else None

    @classmethod
    def build(cls, ex: StageExecutor) -> DeviceLayers:
        return cls(ex)

    def run(self, x: torch.Tensor, rope, sessions, spans, decode, keep=None) -> torch.Tensor:
        if not all(t == 1 for _, t in spans) or not all(s.kv.static for s in sessions):
            return super().run(x, rope, sessions, spans, decode, keep)
        pos = torch.tensor([p for p, _ in spans], dtype=torch.long).to(x.device, non_blocking=True)  # [B]
        caches = [s.kv for s in sessions]
        if self.graphs is not None:
            return self.graphs(x, pos, caches)
        return self.decode_static(x, pos, caches)

    def decode_static(self, x: torch.Tensor, pos: torch.Tensor, caches: list[KVBuffer]) -> torch.Tensor:
        """x [B, D] (one new row per session), pos [B] its positions -> [B, D] after every layer. Only tensor ops
        whose shapes are fixed by (B, the caches): capturable."""
        ex = self.ex
        b = x.shape[0]
        spans = [(0, 1)] * b  # row structure only (ex.rows runs row-exact stages one row at a time)
        cos, sin = ex.module.rotary_emb(x, position_ids=pos)  # [B, hd] each
        masks = []  # per session [1, 1, 1, capacity]: key i visible iff i <= pos
        for i, kv in enumerate(caches):
            cols = torch.arange(kv.capacity, device=x.device)
            masks.append((cols <= pos[i]).view(1, 1, 1, -1))
        for j, layer in enumerate(ex.module.layers):
            attn = layer.self_attn
            h = self.norm(layer.input_layernorm, x)  # [B, D]
            if hasattr(attn, "qkv_proj"):
                q_width, kv_width = ex.heads * ex.head_dim, ex.kv_heads * ex.head_dim
                q, k, v = ex.rows(attn.qkv_proj, h, spans).split([q_width, kv_width, kv_width], dim=-1)
            else:
                q, k, v = (ex.rows(p, h, spans) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            q, k, v = (t.reshape(b, -1, ex.head_dim) for t in (q, k, v))  # [B, H, hd], [B, H_kv, hd]
            q, k = self.rope(q, k, cos, sin)
            outs = []
            for i, kv in enumerate(caches):
                keys, values = kv.data[j, 0], kv.data[j, 1]  # [H_kv, capacity, hd]
                at = pos[i : i + 1]
                keys.index_copy_(1, at, k[i].unsqueeze(1).to(keys.dtype))
                values.index_copy_(1, at, v[i].unsqueeze(1).to(values.dtype))
                out = nn.functional.scaled_dot_product_attention(
                    q[i].unsqueeze(0).unsqueeze(2),  # [1, H, 1, hd]
                    keys.unsqueeze(0),
                    values.unsqueeze(0),
                    attn_mask=masks[i],
                    scale=attn.scaling,
                    enable_gqa=ex.heads != ex.kv_heads,
                )  # [1, H, 1, hd]
                outs.append(out.reshape(1, ex.heads * ex.head_dim))
            a = torch.cat(outs) if b > 1 else outs[0]  # [B, H*hd]
            x, h = self.add_norm(layer.post_attention_layernorm, x, ex.rows(attn.o_proj, a, spans))
            x = x + ex.rows(self.mlp(layer.mlp), h, spans)
        return x


class LayerPath(Protocol):
    """What the executor calls on its path: every layer of a step, and the last stage's final norm."""

    decode_layers: ops.DecodeLayers | None

    def run(self, x: torch.Tensor, rope, sessions, spans, decode, keep=None) -> torch.Tensor: ...

    def norm(self, norm, x: torch.Tensor) -> torch.Tensor: ...


# name -> path. A stage picks one at load (choose_layer_path); a CUDA path is one more row.
LAYER_PATHS: dict[str, type[TorchLayers]] = {
    "torch": TorchLayers,
    "native": NativeLayers,
    "native-stage": NativeStageLayers,
    "device": DeviceLayers,
}


def choose_layer_path(
    native: bool, hidden_act: str, weights: str, layers: nn.ModuleList, device: torch.device | None = None
) -> str:
    """The LAYER_PATHS name a stage runs: "device" on a CUDA device (its own formats and static decode step); the
    native kernels where a CPU stage keeps packed weights and runs them natively (`native`) over a silu MLP; every
    decode layer in one call where the C layer can read all of them."""
    if device is not None and device.type != "cpu":
        return "device"
    if not native or hidden_act != "silu" or weights == "fp32":
        return "torch"
    return "native-stage" if ops.DecodeLayers.fits(layers) else "native"
