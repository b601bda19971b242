"""Where a role's tensors live: `device: cpu | cuda | cuda:N | auto`, resolved once at start, and the host side of
the wire boundary (codecs, chaining and failover see host tensors only, whatever device computed them).

`auto` is CUDA when torch sees a device, else the CPU; the choice is logged. A CUDA device is checked here, once,
with words an operator can act on (no CUDA build, no such index), never by a crash deep inside a step.
"""

from __future__ import annotations

import logging
import re

import torch

from edgeinspect.errors import InvalidInput

log = logging.getLogger(__name__)

DEVICE_PATTERN = r"^(cpu|auto|cuda(:\d+)?)$"


def resolve_device(spec: str, role: str = "") -> torch.device:
    """The torch device a setting names; `auto` picks CUDA where torch sees one (logged either way)."""
    spec = spec.strip().lower()
    if not re.match(DEVICE_PATTERN, spec):
        raise InvalidInput(f"device must be cpu, cuda, cuda:N or auto, not {spec!r}")
    if spec == "auto":
        chosen = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        log.info("%sdevice auto -> %s (%s)", f"{role}: " if role else "", chosen, describe(chosen))
        return chosen
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise InvalidInput(f"device {spec} asked for, but torch {torch.__version__} ({build}) sees no CUDA device")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise InvalidInput(f"device {spec}: this box has {torch.cuda.device_count()} CUDA device(s)")
        device = torch.device("cuda", index)
    log.info("%sdevice %s (%s)", f"{role}: " if role else "", device, describe(device))
    return device


def describe(device: torch.device) -> str:
    """The device in words for logs and bench records."""
    if device.type != "cuda":
        return "host CPU"
    p = torch.cuda.get_device_properties(device)
    return f"{p.name}, sm{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB, torch {torch.__version__}"


def capability(device: torch.device) -> tuple[int, int]:
    """CUDA compute capability, (0, 0) off CUDA."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


def free_bytes(device: torch.device) -> int | None:
    """Device memory free now (None on the CPU: the configured budget stands alone there).

    torch.cuda.mem_get_info is cudaMemGetInfo. On a discrete GPU that is the card's own memory. On a Jetson
    (integrated GPU, one LPDDR pool for CPU and GPU) it reports the OS's free memory, the same pages the Arm cores,
    the page cache and the other roles on the box draw from: nothing is reserved for the GPU. The KV budget takes
    what is free after the weights are loaded, times the caller's headroom fraction, so the OS and its neighbours
    keep the rest; a Jetson operator should still cap kv_budget_mb, since the page cache can give memory back later
    that cudaMemGetInfo did not count, and a neighbour can take it first.
    """
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


class HostCopy:
    """Device tensors to the host for the wire: each into a pinned buffer (the wire keeps it) with a non-blocking
    copy, then one synchronisation for the whole step's outputs, not one per tensor."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        if self.device.type == "cpu":
            return tensors
        staged: list[torch.Tensor | None] = []
        for t in tensors:
            if t is None:
                staged.append(None)
                continue
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            buf.copy_(t, non_blocking=True)
            staged.append(buf)
        torch.cuda.current_stream(self.device).synchronize()
        return staged


def to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A host tensor from the wire onto the stage's device (pinned, non-blocking: the copy overlaps the launch of
    the step's first kernels)."""
    if t is None or device.type == "cpu" or t.device == device:
        return t
    return t.pin_memory().to(device, non_blocking=True)
