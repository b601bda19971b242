"""Where a stage's quantized weights live in memory: one mapping advised for transparent huge pages.

A decode step streams every int8/int4 weight once. On 4 KiB pages that is a TLB miss every 4 KiB (a two-level page
walk inside a VM), and each of the ~100 linears of a 1.3B step starts a new run of them. Moved into one anonymous
mapping advised MADV_HUGEPAGE (2 MiB pages where the kernel's THP setting is "madvise" or "always"), a 1.3B int8
(vnni) decode step at 974 positions took 0.946x the time with bit-identical logits on an AVX2 EPYC VM
(bench/perf_weight_pages.py; bench/README.md, "Decode: weights on huge pages"). One mapping for the whole stage,
not one per tensor: each tensor's last huge page would otherwise waste up to 2 MiB. Where THP is "never", or off
Linux, the advice changes nothing and the weights still sit in one mapping on ordinary pages.
"""

from __future__ import annotations

import logging
import mmap

import torch
from torch import nn

from edgeinspect.models.int4 import Int4Linear
from edgeinspect.models.quant import Int8Linear

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line, as torch's allocator places them
MIN_BYTES = 4 * HUGE_PAGE  # below this a stage's weights fit a few huge pages' worth of TLB anyway: left as they are


def _streamed(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """(linear, attribute) for every weight tensor a decode step streams: int8 row-major weights, int4/int6 packed
    ones (in torch's int4 layout where its kernel was picked)."""
    found = []
    for m in module.modules():
        if isinstance(m, Int8Linear) and m.qweight is not None:
            found.append((m, "qweight"))
        elif isinstance(m, Int4Linear):
            found.append((m, "packed" if m.packed is not None else "torch_packed"))
    return found


def huge_page_buffer(nbytes: int) -> tuple[torch.Tensor, bool]:
    """nbytes (uint8) in a fresh anonymous mapping advised MADV_HUGEPAGE, starting on a huge-page boundary, and
    whether the kernel took the advice. The tensor, and any view of it, keeps the mapping alive."""
    arena = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice, advised = getattr(mmap, "MADV_HUGEPAGE", None), False
    if advice is not None:
        try:
            arena.madvise(advice)
            advised = True
        except OSError as e:  # a kernel built without THP: ordinary pages, still one mapping
            log.info("4 KiB pages: the kernel refused huge pages (%s)", e)
    raw = torch.frombuffer(arena, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + nbytes], advised


def huge_page_weights(module: nn.Module) -> int:
    """Moves the module's streamed weights (see _streamed) into one mapping advised for huge pages, tensor by tensor
    (so memory peaks at the weights plus one tensor); returns the bytes moved, 0 where there was too little to
    bother. The values are unchanged; call before anything records the tensors' addresses (StageExecutor's native
    decode layers do)."""
    targets = _streamed(module)
    sizes = [getattr(m, name).numel() * getattr(m, name).element_size() for m, name in targets]
    total = sum(-(-size // ALIGN) * ALIGN for size in sizes)
    if total < MIN_BYTES:
        return 0
    raw, advised = huge_page_buffer(total)
    offset = 0
    for (m, name), size in zip(targets, sizes, strict=True):
        old = getattr(m, name).contiguous()
        new = raw[offset : offset + size].view(old.dtype).view(old.shape)
        new.copy_(old)
        setattr(m, name, new)
        offset += -(-size // ALIGN) * ALIGN
    log.info(
        "%d weight tensors (%.0f MiB) in one mapping%s",
        len(targets), total / 2**20, " advised for 2 MiB pages" if advised else "",
    )  # fmt: skip
    return total
