"""Writes that survive a power cut once they return: what an fsync promises, and the folder fsync that makes a
rename or a new file itself durable (POSIX leaves a new directory entry in the page cache until then)."""

from __future__ import annotations

import os
from pathlib import Path


def write_synced(path: Path, data: bytes) -> None:
    """Writes `data` to `path` and fsyncs the file (not its folder: see fsync_dir)."""
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Makes the folder's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
