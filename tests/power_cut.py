"""A box whose power the test cuts: an ext4 filesystem on a loop device, and a snapshot of that device taken at one
instant, as a disk holds it when the power goes.

Why this is faithful: what a power cut loses is what the kernel had not yet written to the device (dirty pages, an
uncommitted journal). Here nothing reaches the device but what an fsync (or a journal commit it forces) sends:
periodic and background writeback are switched off for the test (vm.dirty_writeback_centisecs=0, a long dirty
expiry, high dirty ratios) and ext4's own commit interval is an hour. The writer is frozen with SIGSTOP first, so
no write is in flight while the device is copied; the copy is therefore one point in time, and mounting it replays
ext4's journal exactly as a reboot does.
What it does not model: a drive's volatile write cache that ignores flushes (industrial SSDs with power-loss
protection do not have one); device-mapper's dm-flakey/dm-log-writes would, but this VM's kernel has no
device-mapper. The control test proves the rig bites: a SQLite writer without fsync (WAL, synchronous=NORMAL) loses
acknowledged rows here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

# No periodic writeback, nothing expires for an hour, and no background flush for dirty pages elsewhere on the box
# (a busy box crosses the default 10% and the flusher would write our unsynced pages too).
WRITEBACK = {
    "vm/dirty_writeback_centisecs": "0",
    "vm/dirty_expire_centisecs": "360000",
    "vm/dirty_background_ratio": "90",
    "vm/dirty_ratio": "95",
}


def available() -> str:
    """'' where the rig can run, else why not."""
    if os.geteuid() != 0:
        return "needs root (a loop device and a mount)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not Path("/dev/loop-control").exists():
        return "needs loop devices (/dev/loop-control)"
    return ""


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@contextlib.contextmanager
def _writeback_off() -> Iterator[None]:
    saved = {key: Path("/proc/sys", key).read_text().strip() for key in WRITEBACK}
    try:
        for key, value in WRITEBACK.items():
            Path("/proc/sys", key).write_text(value)
        yield
    finally:
        for key, value in saved.items():
            Path("/proc/sys", key).write_text(value)


@contextlib.contextmanager
def mounted(image: Path, mountpoint: Path, options: str = "") -> Iterator[Path]:
    """`image` attached to a loop device and mounted (a journal left by a cut is replayed here, as at boot)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    loop = _run("losetup", "--find", "--show", str(image))
    try:
        _run("mount", *(["-o", options] if options else []), loop, str(mountpoint))
        try:
            yield mountpoint
        finally:
            for _ in range(50):  # a killed writer's files may take a moment to close
                if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                _run("umount", "--lazy", str(mountpoint))
    finally:
        subprocess.run(["losetup", "-d", loop], capture_output=True)


class PowerCutBox:
    """with PowerCutBox(tmp) as box: write under box.root; box.cut(pid) -> the device image at that instant."""

    def __init__(self, tmp: Path, size_mb: int = 96) -> None:
        self.tmp = tmp
        self.image = tmp / "disk.img"
        self.root = tmp / "box"
        self.size_mb = size_mb
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> PowerCutBox:
        with self.image.open("wb") as f:
            f.truncate(self.size_mb << 20)
        _run("mkfs.ext4", "-q", "-F", str(self.image))
        self._stack.enter_context(_writeback_off())
        self._stack.enter_context(mounted(self.image, self.root, "commit=3600"))
        return self

    def cut(self, writer_pid: int) -> Path:
        """Freezes the writer, copies the device as it is now (the state a power cut leaves), kills the writer."""
        os.kill(writer_pid, 19)  # SIGSTOP: no write of its own is in flight once it is stopped
        deadline = time.monotonic() + 10
        while _state(writer_pid) not in ("T", "t", "Z", "") and time.monotonic() < deadline:
            time.sleep(0.01)
        snapshot = self.tmp / "after-cut.img"
        shutil.copyfile(self.image, snapshot)  # the loop device's writes are in the image file, dirty pages are not
        os.kill(writer_pid, 9)
        return snapshot

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return ""
