"""A session's KV cache on one stage: one preallocated buffer written in place (gpt-fast style).

transformers' DynamicCache grows by torch.cat on every step (6-10% of decode time at 1.3B dimensions: each step
copies the whole cache). Here a step writes its new keys/values into spare capacity; the buffer is reallocated
only when it runs out, growing by half its size so copies are amortised to O(1) per token.

A buffer of dtype int8 holds quantized rows (packed-weight stages, `kv_cache: int8`): each key or value row of a
head is head_dim int8 values and, in its last 4 bytes, its fp32 scale (absmax / 127, symmetric, round to nearest
even), so a row is head_dim + 4 bytes against fp16's 2 * head_dim: decode attention, which reads the whole cache
every step, reads about half. The scale sits beside its row because the kernel reads them together.
"""

from __future__ import annotations

import torch

from edgeinspect.errors import InvalidInput

GROW_ALIGN = 64  # positions: capacity is a multiple of this


class KVCapacityError(InvalidInput):
    """A step would run past a static KV cache's admitted capacity."""


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


SCALE_BYTES = 4  # an int8 row's fp32 scale, stored after its values


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of `dtype` per stored row: head_dim, or head_dim + the scale's bytes for quantized rows."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., hd] float -> [..., hd + 4] int8 rows: values round(x / s), s = absmax / 127 in fp32 (0 for a zero row),
    s's bytes last. The native kernel stores a new row with exactly these operations."""
    x = x.float()
    if x.numel() == 0:
        return torch.empty(*x.shape[:-1], x.shape[-1] + SCALE_BYTES, dtype=torch.int8)
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    q = torch.round(x / torch.where(scale > 0, scale, 1.0)).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def encode_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float keys/values [..., hd] as a cache of `dtype` stores them: int8 rows, or a plain cast."""
    return quantize_rows(x) if dtype == torch.int8 else x.to(dtype)


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """[..., hd + 4] int8 rows (may be strided) -> [..., hd] fp32."""
    hd = rows.shape[-1] - SCALE_BYTES
    return rows[..., :hd].float() * rows[..., hd:].view(torch.float32)


class KVBuffer:
    """Keys and values of one session for a stage's layers: data [L, 2, H_kv, capacity, row], row = head_dim
    (float dtypes) or head_dim + 4 (int8 rows, see above), on the stage's device.

    `static`: allocated once at `capacity` (the session's admitted max_positions) and never regrown, so its address
    is fixed for the session's life (what a captured CUDA graph reads and writes) and a step beyond it is refused.
    Its spare positions are zeros, not garbage: a static decode step attends over the whole capacity with a mask,
    and a masked NaN would still poison the weighted sum (0 * NaN).
    """

    def __init__(
        self,
        n_layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        capacity: int = 0,
        device: torch.device | None = None,
        static: bool = False,
    ):
        if dtype == torch.int8 and head_dim % SCALE_BYTES:
            raise ValueError(f"an int8 KV cache needs head_dim divisible by {SCALE_BYTES}, got {head_dim}")
        self.shape = (n_layers, 2, kv_heads, head_dim)
        self.dtype = dtype
        self.row = row_width(head_dim, dtype)
        self.static = static
        self.length = 0  # positions holding valid keys/values
        size = (n_layers, 2, kv_heads, _round_up(max(capacity, 1) if static else capacity, GROW_ALIGN), self.row)
        self.data = (torch.zeros if static else torch.empty)(size, dtype=dtype, device=device)

    @property
    def quantized(self) -> bool:
        return self.dtype == torch.int8

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Float keys/values [..., head_dim] as this buffer stores them."""
        return encode_rows(x, self.dtype)

    @property
    def capacity(self) -> int:
        return self.data.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes held (capacity, not just the valid part: that is what the budget must count)."""
        return self.data.numel() * self.data.element_size()

    def reserve(self, needed: int) -> None:
        """Makes room for `needed` positions, copying the valid part once if the buffer must grow."""
        if needed <= self.capacity:
            return
        if self.static:
            raise KVCapacityError(
                f"session needs {needed} positions but its static KV cache was allocated for {self.capacity} at "
                f"admission; send max_positions covering prompt + new tokens"
            )
        new_cap = _round_up(max(needed, self.capacity + self.capacity // 2), GROW_ALIGN)
        n_layers, two, heads, _ = self.shape
        grown = torch.empty(n_layers, two, heads, new_cap, self.row, dtype=self.dtype, device=self.data.device)
        grown[:, :, :, : self.length] = self.data[:, :, :, : self.length]
        self.data = grown

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor, at: int) -> None:
        """keys/values [H_kv, T, head_dim] into positions [at, at + T) of layer `layer` (0-based in the stage)."""
        t = keys.shape[1]
        self.data[layer, 0, :, at : at + t] = self.encode(keys)
        self.data[layer, 1, :, at : at + t] = self.encode(values)

    def view(self, layer: int, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of positions [0, upto), each [H_kv, upto, head_dim]: views (no copy) of a float cache,
        fp32 copies of an int8 one."""
        keys, values = self.data[layer, 0, :, :upto], self.data[layer, 1, :, :upto]
        if self.quantized:
            return dequantize_rows(keys), dequantize_rows(values)
        return keys, values
