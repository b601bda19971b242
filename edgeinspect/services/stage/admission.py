"""Which new sessions a stage admits. Each live session holds a KV reservation to the end of its budget of
positions (prompt + new tokens, from the gateway); a new session is admitted only when its reservation fits the
budget beside theirs, so no live session is ever evicted to make room: new work is refused instead, with a
message saying what is full and a pushback telling the caller when to try again.

Pure functions over plain numbers, so the policy is tested without processes or tensors.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgeinspect.models.kv import GROW_ALIGN

# How long a refused caller should wait before trying again here. A slot frees when a live session ends (one
# report: seconds at the tiny model, tens of seconds at 1.3B); a second keeps retries far from hot without making
# a caller that could have gone to another replica wait long for the news.
RETRY_AFTER_MS = 1000


def reservation_bytes(max_positions: int, first_step_end: int, bytes_per_position: int) -> int:
    """KV bytes a new session reserves: its whole budget of positions, or (unknown budget) its first step,
    rounded up as the KV buffer allocates them (models/kv.py), so the reservation is exactly what it will hold."""
    positions = max(max_positions, first_step_end, 1)
    return (positions + GROW_ALIGN - 1) // GROW_ALIGN * GROW_ALIGN * bytes_per_position


def kv_budget_bytes(configured: int, device_free: int | None, free_fraction: float) -> int:
    """The KV budget a stage admits against: the configured bytes, capped on a GPU by `free_fraction` of the
    device memory free once the weights are loaded (models/device.free_bytes: on a Jetson that is the OS's free
    memory, shared with the CPU side, hence the fraction). On the CPU (device_free None) the configured budget."""
    if device_free is None:
        return configured
    return min(configured, int(device_free * free_fraction))


def refusal(need: int, reserved: Mapping[str, int], budget: int) -> str | None:
    """None when a session needing `need` bytes fits beside the `reserved` ones (bytes per live session), else
    why not, in words an operator can act on."""
    held = sum(reserved.values())
    if held + need <= budget:
        return None
    if need > budget:
        return (
            f"KV budget too small: this session needs {human_bytes(need)}, more than the whole budget of "
            f"{human_bytes(budget)}; ask for fewer new tokens or raise kv_budget_mb"
        )
    return (
        f"KV budget full: {human_bytes(held)} of {human_bytes(budget)} reserved by {len(reserved)} live "
        f"session{'s' if len(reserved) != 1 else ''}; this session needs {human_bytes(need)}"
    )


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
