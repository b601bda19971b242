"""A stage on a CUDA device: its weight formats and CUDA graphs of the static decode step in batch buckets (the
"device" layer path itself, DeviceLayers, is a row of stage/layers.py).

Formats (DEVICE_FORMATS): fp32, bf16, fp16 weights as they are; int8 weight-only through
`torch._weight_int8pack_mm` (per-output-channel scales, bf16 activations), int4 through tinygemm
`_weight_int4pack_mm` (sm80+, bf16 activations) on the q4_0 grid the CPU's int4 uses (models/int4.py: the same q
and scales, so the CPU accuracy records gate it). Each is probed on the device at load; a format the device or the
installed torch cannot run is refused with the reason, never run slowly some other way.

The static decode step (layers.DeviceLayers.decode_static) writes each session's new key/value at its position
tensor and attends over its whole static KV buffer with a mask: no Python value depends on the data, so the same
calls run on the CPU (tests compare them with the executor's own path) and are captured into a CUDA graph on a GPU.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from edgeinspect.errors import InvalidInput
from edgeinspect.models.device import capability
from edgeinspect.models.int4 import GROUP, INT8_LINEARS, quantize_q4
from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.quant import fuse_projections, quantize_per_channel

if TYPE_CHECKING:
    from edgeinspect.models.stage.load import StageModule

log = logging.getLogger(__name__)

# weights -> activation (compute) dtype on a device
DEVICE_FORMATS = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "int8": torch.bfloat16,
    "int4": torch.bfloat16,
}
GRAPH_BUCKETS = (1, 2, 4, 8)  # decode batch sizes a graph is captured for; larger steps run eagerly
GRAPHS_KEPT = 16  # captured graphs (one per bucket and set of session caches), least recently used dropped


class Int8PackLinear(nn.Module):
    """y = x @ (q * s).T: int8 weights [N, K], one scale per output channel, `_weight_int8pack_mm` (weight-only)."""

    weight: torch.Tensor  # [N, K] int8 buffer
    scales: torch.Tensor  # [N] buffer

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, device: torch.device):
        super().__init__()
        q, scales = quantize_per_channel(linear.weight.detach())  # [N, K] int8, [N] fp32
        self.register_buffer("weight", q.to(device))
        self.register_buffer("scales", scales.to(device, dtype))
        self.bias = None if linear.bias is None else linear.bias.detach().to(device, dtype)
        self.out_features, self.in_features = q.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mm = torch._weight_int8pack_mm  # pyright: ignore[reportPrivateImportUsage]  # torch leaves it out of __all__
        y = mm(x.reshape(-1, self.in_features), self.weight, self.scales)  # [R, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def int4_fits(linear: nn.Linear) -> bool:
    """Whether tinygemm takes this linear: input width a multiple of the q4_0 group and of 32, outputs of 8."""
    return linear.in_features % max(GROUP, 32) == 0 and linear.out_features % 8 == 0


def inner_k_tiles(k: int) -> int:
    """tinygemm's K tiling: K must be a multiple of 16 * tiles (2, 4 or 8)."""
    for tiles in (8, 4, 2):
        if k % (16 * tiles) == 0:
            return tiles
    raise InvalidInput(f"int4 on CUDA needs an input width divisible by 32, got {k}")


def tinygemm_scales(scales: torch.Tensor) -> torch.Tensor:
    """q4_0 scales [N, K/32] -> tinygemm's [K/32, N, 2] (scale, zero) with zero 0: w = (q - 8) * scale + zero is then
    q4_0's (q - 8) * d exactly (the scale rounded to bf16, as on the CPU's torch int4 kernel)."""
    return torch.stack([scales, torch.zeros_like(scales)], -1).transpose(0, 1).contiguous().bfloat16()


class Int4PackLinear(nn.Module):
    """y = x @ W.T with W on the q4_0 grid, tinygemm's packed layout (`_weight_int4pack_mm`; on the CPU its
    `_for_cpu` twin, which the CPU tests use to check the grid conversion)."""

    def __init__(self, linear: nn.Linear, device: torch.device):
        super().__init__()
        w = linear.weight.detach()
        self.out_features, self.in_features = w.shape
        q, scales = quantize_q4(w)  # [N, K] uint8 in [0, 15], [N, K/32] fp16
        self.on_cpu = device.type == "cpu"  # not `cpu`: that would hide nn.Module.cpu()
        if self.on_cpu:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        else:
            pairs = (q[:, ::2] << 4 | q[:, 1::2]).to(device)  # [N, K/2] uint8, the first of a pair high
            packed = torch.ops.aten._convert_weight_to_int4pack(pairs, inner_k_tiles(self.in_features))
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", tinygemm_scales(scales).to(device))
        self.bias = None if linear.bias is None else linear.bias.detach().to(device, torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu if self.on_cpu else torch.ops.aten._weight_int4pack_mm
        y = mm(x.reshape(-1, self.in_features).to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


@functools.cache
def format_refusal(weights: str, device: torch.device) -> str | None:
    """None when `weights` runs on `device` with a real kernel, else why not (probed once per process)."""
    if weights not in DEVICE_FORMATS:
        return f"weights {weights!r} have no kernel on {device}; choose one of {', '.join(DEVICE_FORMATS)}"
    if device.type != "cuda":
        return None
    major, minor = capability(device)
    if weights in ("bf16", "int8", "int4") and not torch.cuda.is_bf16_supported():
        return f"{weights} needs bf16 math, which sm{major}{minor} lacks; use fp16 weights"
    if weights == "int4" and major < 8:
        return f"int4 runs tinygemm (_weight_int4pack_mm), which needs sm80+; this GPU is sm{major}{minor}"
    if weights in ("int8", "int4"):
        probe = nn.Linear(128, 64, bias=False)
        layer = Int8PackLinear(probe, torch.bfloat16, device) if weights == "int8" else Int4PackLinear(probe, device)
        try:
            layer(torch.zeros(1, 128, dtype=torch.bfloat16, device=device))
            torch.cuda.synchronize(device)
        except (RuntimeError, NotImplementedError) as exc:
            kernel = "_weight_int8pack_mm" if weights == "int8" else "_weight_int4pack_mm"
            return f"torch {torch.__version__} has no CUDA {kernel} for this GPU ({str(exc).splitlines()[0]})"
    return None


def to_device_format(module: StageModule, weights: str, device: torch.device) -> StageModule:
    """An fp32-loaded stage moved onto `device` in `weights`, layer by layer (the device never holds a layer's fp32
    copy beside another's). Packed formats replace the linears of the layers and the lm_head; norms, embeddings
    and the aligner run in the activation dtype. int4 keeps INT8_LINEARS (down_proj) and the lm_head int8, as on
    the CPU."""
    reason = format_refusal(weights, device)
    if reason:
        raise InvalidInput(f"stage on {device}: {reason}")
    dtype = DEVICE_FORMATS[weights]

    kept_int8: list[str] = []

    def convert(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and weights in ("int8", "int4"):
                if weights == "int4" and int4_fits(child) and name not in INT8_LINEARS:
                    setattr(parent, name, Int4PackLinear(child, device))
                else:
                    kept_int8.extend([f"{prefix}{name}"] if weights == "int4" and name not in INT8_LINEARS else [])
                    setattr(parent, name, Int8PackLinear(child, dtype, device))
            else:
                convert(child, f"{prefix}{name}.")

    for j, layer in enumerate(module.layers):
        if weights != "fp32":  # fp32 keeps generate()'s three GEMMs; the others read q/k/v and gate/up in one
            fuse_projections(layer)
        convert(layer, f"layers.{j}.")
        layer.to(device, dtype)
    if kept_int8:  # as the CPU's int4 does for widths off its grid: int8, said once
        log.warning("int4 on %s: %d linears off tinygemm's grid kept int8 (%s)", device, len(kept_int8), kept_int8[0])
    if module.lm_head is not None and weights in ("int8", "int4"):
        module.lm_head = Int8PackLinear(module.lm_head, dtype, device)  # int8 even for int4, as on the CPU
    module.to(device)
    for part in (module.embed_tokens, module.aligner, module.norm, module.lm_head):
        if isinstance(part, nn.Module) and not isinstance(part, (Int8PackLinear, Int4PackLinear)):
            part.to(dtype)
    module.rotary_emb.to(device, torch.float32)
    module.weights = weights
    return module


class DecodeGraphs:
    """decode_static captured into CUDA graphs: one per batch bucket and set of session caches (a captured graph
    reads and writes fixed addresses; static caches keep theirs for a session's life). Rows short of the bucket run
    on scratch caches. A decode stream of the same sessions replays one graph; a change of membership captures
    another (two eager passes, once), least recently used dropped past GRAPHS_KEPT."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor, list[KVBuffer]], torch.Tensor], device):
        self.fn = fn
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: OrderedDict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]]
        self.graphs = OrderedDict()
        self.scratch: list[KVBuffer] = []
        self.captured = 0

    def __call__(self, x: torch.Tensor, pos: torch.Tensor, caches: list[KVBuffer]) -> torch.Tensor:
        b = x.shape[0]
        bucket = next((n for n in GRAPH_BUCKETS if n >= b), None)
        if bucket is None:
            return self.fn(x, pos, caches)
        caches = caches + self._scratch(caches[0], bucket - b)
        key = (bucket, tuple(kv.data.data_ptr() for kv in caches))
        entry = self.graphs.get(key)
        if entry is None:
            entry = self._capture(x, pos, caches, bucket)
            self.graphs[key] = entry
            if len(self.graphs) > GRAPHS_KEPT:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        graph, static_x, static_pos, out = entry
        static_x[:b].copy_(x)
        static_pos[:b].copy_(pos)
        graph.replay()
        return out[:b]

    def _scratch(self, like: KVBuffer, n: int) -> list[KVBuffer]:
        while len(self.scratch) < n:
            n_layers, _, kv_heads, head_dim = like.shape
            self.scratch.append(KVBuffer(n_layers, kv_heads, head_dim, like.dtype, 1, like.data.device, static=True))
        return self.scratch[:n]

    def _capture(self, x: torch.Tensor, pos: torch.Tensor, caches: list[KVBuffer], bucket: int):
        b = x.shape[0]
        static_x = torch.zeros(bucket, x.shape[1], dtype=x.dtype, device=x.device)
        static_pos = torch.zeros(bucket, dtype=torch.long, device=x.device)  # padding rows write position 0
        static_x[:b].copy_(x)
        static_pos[:b].copy_(pos)
        # Warm-up on a side stream (allocator and cuBLAS workspaces), as torch.cuda.graphs asks. Its cache writes
        # are the real step's writes at the real positions: replaying them is idempotent.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(static_x, static_pos, caches)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.fn(static_x, static_pos, caches)
        self.captured += 1
        log.debug("captured a decode graph for %d sessions (bucket %d)", b, bucket)
        return graph, static_x, static_pos, out
