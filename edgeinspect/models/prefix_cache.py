"""Keys/values of shared prompt prefixes (system prompt + spec context) kept on a stage, LRU under a byte budget.

Every frame of the same part starts with the same system turn; prefilling it again for each frame is the larger
part of the prompt's text. A stage keeps those positions' keys/values under a key the gateway derives from their
token ids, and a new session starting from the prefix copies them instead of recomputing them. The image comes
after the prefix, so the cached positions never depend on a frame.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class PrefixEntry:
    kv: torch.Tensor  # [L, 2, H_kv, length, head_dim], the stage's layers
    length: int

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class PrefixCache:
    """LRU over prefix entries; `budget_bytes` 0 keeps nothing."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, PrefixEntry] = OrderedDict()
        self.hits = self.misses = self.stored = self.evicted = 0

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def get(self, key: str, length: int) -> PrefixEntry | None:
        """The entry for `key` if it holds exactly `length` positions (a hit refreshes it)."""
        entry = self._entries.get(key)
        if entry is None or entry.length != length:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: str, kv: torch.Tensor) -> bool:
        """Keeps `kv` ([L, 2, H_kv, length, hd], owned by the cache from now on); evicts least recently used
        entries to fit. False when it cannot fit at all."""
        entry = PrefixEntry(kv, kv.shape[3])
        if entry.nbytes > self.budget_bytes:
            return False
        self._entries.pop(key, None)
        while self._entries and self.nbytes + entry.nbytes > self.budget_bytes:
            self._entries.popitem(last=False)
            self.evicted += 1
        self._entries[key] = entry
        self.stored += 1
        return True
