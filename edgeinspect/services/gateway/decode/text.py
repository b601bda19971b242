"""Generated ids -> text deltas as they come (the streamed part of InspectStream)."""

from __future__ import annotations

import functools


class IncrementalText:
    """Detokenizes generated ids as they come, in O(new tokens) per step (decoding a window, as HF's streamer
    does), holding back a partial UTF-8 sequence until it completes."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prefix_offset = 0  # window start: a few tokens before the unsent ones, so spaces merge right
        self.read_offset = 0  # first token whose text has not been sent

    def delta(self, ids: list[int]) -> str:
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=True)
        before = decode(ids[self.prefix_offset : self.read_offset])
        now = decode(ids[self.prefix_offset :])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return now[len(before) :]
