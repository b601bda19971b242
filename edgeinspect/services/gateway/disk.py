"""Free-space floors of the gateway's disks (frames, report store, logs).

Below a floor the gateway refuses new inspections (DiskFull: RESOURCE_EXHAUSTED with retry pushback) and keeps
serving reads; it never starts a write it may not finish, so a store is never left half-written by a full disk.
Frames expire first: when a disk that holds the frames is short, the oldest frames are pruned before anyone is
refused. Nothing is latched: every admission measures again, so the gateway resumes by itself once space returns.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from edgeinspect.errors import DiskFull
from edgeinspect.services.common import metrics
from edgeinspect.services.gateway.reports.frames import FrameFiles
from edgeinspect.services.gateway.settings import DiskSettings, GatewaySettings
from edgeinspect.services.store.settings import StoreBackend

log = logging.getLogger(__name__)

MB = 1 << 20


class FrameKeeper(Protocol):
    """What the guard needs of the report store: where frames live and how to prune them (ReportStore)."""

    @property
    def frames(self) -> FrameFiles | None: ...  # read only here: a store whose frames are always set fits too

    def prune_frames(self, free_bytes: int = 0) -> list[str]: ...


@dataclass(frozen=True)
class Disk:
    name: str  # frames | store | logs: what the caller's message names
    path: Path  # the folder written to
    floor: int  # bytes kept free


@dataclass(frozen=True)
class Space:
    disk: Disk
    free: int  # bytes an unprivileged writer may still use (statvfs f_bavail)
    device: int  # st_dev: disks on one filesystem share their free space

    @property
    def short(self) -> bool:
        return self.free < self.disk.floor


def _existing(path: Path) -> Path:
    """The folder itself or its nearest existing parent (a folder made at first write is measured where it will be)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def measure(disk: Disk) -> Space:
    folder = _existing(disk.path)
    st = os.statvfs(folder)
    return Space(disk, st.f_bavail * st.f_frsize, os.stat(folder).st_dev)


def frames_shortfall(spaces: list[Space], frames_device: int, headroom: float) -> int:
    """Bytes of frames to prune: enough to lift every short disk on the frames' filesystem to its floor plus
    `headroom` of it (0 when none is short; a disk elsewhere gains nothing from pruning frames)."""
    need = [int(s.disk.floor * (1 + headroom)) - s.free for s in spaces if s.short and s.device == frames_device]
    return max(need, default=0)


def refusal(short: list[Space]) -> str:
    """What a refused caller reads: which disk, how much is free, the floor (the folder goes to the log only). Disks
    on one filesystem are named together: they share their free space."""
    by_device: dict[int, list[Space]] = {}
    for s in short:
        by_device.setdefault(s.device, []).append(s)
    parts = [
        f"the {' and '.join(s.disk.name for s in group)} disk has {group[0].free / MB:.1f} MiB free, below its floor "
        f"of {max(s.disk.floor for s in group) / MB:.1f} MiB"
        for group in by_device.values()
    ]
    return "; ".join(parts) + ": new inspections are refused until space is freed (reports can still be read)"


def gateway_disks(cfg: GatewaySettings, frames_dir: Path | None) -> list[Disk]:
    """The disks this gateway writes, each with its floor (a floor of 0 leaves that disk unchecked)."""
    d: DiskSettings = cfg.disk
    disks = []
    if frames_dir is not None and d.frames_min_free_mb:
        disks.append(Disk("frames", frames_dir, int(d.frames_min_free_mb * MB)))
    if cfg.store.backend == StoreBackend.sqlite and d.store_min_free_mb:
        disks.append(Disk("store", cfg.db_path.parent, int(d.store_min_free_mb * MB)))
    if cfg.log_file is not None and d.logs_min_free_mb:
        disks.append(Disk("logs", cfg.log_file.parent, int(d.logs_min_free_mb * MB)))
    return disks


class DiskGuard:
    """Admits an inspection only while every disk is above its floor; prunes frames first when that helps.

    `prune(free_bytes)` deletes the oldest frames until at least `free_bytes` of them are gone (ReportStore's
    prune_frames); None when this gateway keeps no frames."""

    def __init__(
        self,
        disks: list[Disk],
        frames_dir: Path | None,
        prune: Callable[[int], object] | None,
        settings: DiskSettings,
    ) -> None:
        self.disks = disks
        self._frames_dir = frames_dir
        self._prune = prune
        self._headroom = settings.headroom
        self._pushback_ms = int(settings.pushback_s * 1000)
        self._pruning = asyncio.Lock()
        self.refusing = ""  # the last refusal's text ("" while admitting): GetClusterStatus says it
        for disk in disks:
            metrics.DISK_FLOOR.labels(disk=disk.name).set(disk.floor)
            # measured at scrape time: the gauge is right even while no inspection arrives
            metrics.DISK_FREE.labels(disk=disk.name).set_function(lambda disk=disk: measure(disk).free)

    def measure(self) -> list[Space]:
        return [measure(d) for d in self.disks]

    async def admit(self) -> None:
        """Returns when every disk is above its floor (after pruning frames if that was needed); else DiskFull."""
        spaces = await asyncio.to_thread(self.measure)
        if any(s.short for s in spaces) and self._prune is not None and self._frames_dir is not None:
            async with self._pruning:  # one prune at a time; those that waited measure what it freed
                spaces = await asyncio.to_thread(self._make_room)
        short = [s for s in spaces if s.short]
        if not short:
            if self.refusing:
                log.info("disk space is back above every floor: admitting inspections again")
            self.refusing = ""
            return
        text = refusal(short)
        if text != self.refusing:
            where = ", ".join(f"{s.disk.name}={s.disk.path}" for s in short)
            log.warning("refusing inspections: %s [%s]", text, where)
        self.refusing = text
        for s in short:
            metrics.DISK_REFUSED.labels(disk=s.disk.name).inc()
        raise DiskFull(text, retry_after_ms=self._pushback_ms)

    def _make_room(self) -> list[Space]:
        spaces = self.measure()
        device = os.stat(_existing(self._frames_dir)).st_dev if self._frames_dir is not None else -1
        need = frames_shortfall(spaces, device, self._headroom)
        if need > 0 and self._prune is not None:
            log.warning("disk short of its floor: pruning %.1f MiB of the oldest frames", need / MB)
            try:
                self._prune(need)
            except Exception as exc:  # noqa: BLE001 (a full disk may refuse the delete's own journal write)
                log.warning("pruning frames for space failed: %s", exc)
            spaces = self.measure()
        return spaces

    def notes(self) -> list[str]:
        """For GetClusterStatus: why inspections are refused now (measured afresh), with the folders."""
        return [
            f"inspections refused: the {s.disk.name} disk ({s.disk.path}) has {s.free / MB:.1f} MiB free, below its "
            f"floor of {s.disk.floor / MB:.1f} MiB"
            for s in self.measure()
            if s.short
        ]


def gateway_guard(cfg: GatewaySettings, store: FrameKeeper) -> DiskGuard:
    """The guard of a gateway over its store: frames where the store keeps them, pruned by the store."""
    frames_dir = store.frames.root if store.frames is not None else None
    prune = store.prune_frames if store.frames is not None else None
    return DiskGuard(gateway_disks(cfg, frames_dir), frames_dir, prune, cfg.disk)
