"""Whether this box can take a re-planned layer range (LoadLayers): the range's weight bytes, from the planner's
costs of this checkpoint, against the memory this box has available now."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.errors import EdgeInspectError, ResourceExhausted
from edgeinspect.models.planner import FORMATS, layer_costs_from_checkpoint

# How long a caller refused for want of memory should wait: another stage may be loading or freeing right now.
RETRY_AFTER_MS = 10_000


def memory_available() -> int:
    """This box's MemAvailable in bytes (0 when unknown)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def range_weight_bytes(ckpt, start: int, end: int, weights: str) -> int:
    """Bytes of the weights of layers [start, end) (+ embeddings on the first stage, norm + lm_head on the last)."""
    try:
        costs = layer_costs_from_checkpoint(ckpt.path, weights if weights in FORMATS else "fp32")
    except EdgeInspectError:
        return 0
    head = costs.head_bytes if start == 0 else 0
    tail = costs.tail_bytes if end == costs.num_layers else 0
    return int(sum(costs.layer_bytes[start:end]) + head + tail)


def check_room(ckpt, start: int, end: int, weights: str) -> None:
    """Raises ResourceExhausted where layers [start, end) would not fit this box's available memory (unknown: fits)."""
    need = range_weight_bytes(ckpt, start, end, weights)
    have = memory_available()
    if have and need > have:
        raise ResourceExhausted(
            f"layers [{start}, {end}) need {need >> 20} MiB of weights; this box has {have >> 20} MiB available",
            retry_after_ms=RETRY_AFTER_MS,
        )
