"""Writes that survive a power cut once they return: what an fsync promises, and the folder fsync that makes a
rename or a new file itself durable (POSIX leaves a new directory entry in the page cache until then)."""

from __future__ import annotations

import os
import shutil
import tempfile
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


def write_folder(final: Path, files: dict[str, bytes]) -> None:
    """Creates folder `final` holding `files` (name -> bytes) whole or not at all: written and fsynced under a
    temporary name beside it, then renamed into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        for name, data in files.items():
            write_synced(tmp / name, data)
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
