"""A session's KV cache on one stage: one preallocated buffer written in place (gpt-fast style).

transformers' DynamicCache grows by torch.cat on every step (6-10% of decode time at 1.3B dimensions: each step
copies the whole cache). Here a step writes its new keys/values into spare capacity; the buffer is reallocated
only when it runs out, growing by half its size so copies are amortised to O(1) per token.
"""

from __future__ import annotations

import torch

GROW_ALIGN = 64  # positions: capacity is a multiple of this


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


class KVBuffer:
    """Keys and values of one session for a stage's layers: data [L, 2, H_kv, capacity, head_dim]."""

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 0):
        self.shape = (n_layers, 2, kv_heads, head_dim)
        self.dtype = dtype
        self.length = 0  # positions holding valid keys/values
        self.data = torch.empty(n_layers, 2, kv_heads, _round_up(capacity, GROW_ALIGN), head_dim, dtype=dtype)

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
        new_cap = _round_up(max(needed, self.capacity + self.capacity // 2), GROW_ALIGN)
        n_layers, two, heads, head_dim = self.shape
        grown = torch.empty(n_layers, two, heads, new_cap, head_dim, dtype=self.dtype)
        grown[:, :, :, : self.length] = self.data[:, :, :, : self.length]
        self.data = grown

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor, at: int) -> None:
        """keys/values [H_kv, T, head_dim] into positions [at, at + T) of layer `layer` (0-based in the stage)."""
        t = keys.shape[1]
        self.data[layer, 0, :, at : at + t] = keys
        self.data[layer, 1, :, at : at + t] = values

    def view(self, layer: int, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of positions [0, upto), each [H_kv, upto, head_dim] (views, no copy)."""
        return self.data[layer, 0, :, :upto], self.data[layer, 1, :, :upto]
