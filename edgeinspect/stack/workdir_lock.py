"""One embedded stack per workdir, and a taken port refused, before anything is written or started.

A second `edgeinspect up` on a running stack's workdir used to rewrite its run configs and delete run/stack.json,
start a duplicate set of model processes, and only then fail on the gateway's port; a later restart of the first
stack's roles then read the second stack's configs. The lock is an flock on WORKDIR/up.lock: the kernel releases it
when the holder exits however it ends (kill -9 too), so a stale file never blocks a restart. The file says who holds
it (launcher pid, gateway address), for the one line the second `up` prints.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from pathlib import Path

from edgeinspect.errors import FailedPrecondition

LOCK_FILE = "up.lock"


class StackAlreadyRunning(FailedPrecondition):
    """Another stack holds this workdir, or another program the gateway's port."""

    code = "stack_running"


class WorkdirLock:
    """Held from before a stack writes anything until it has stopped every role."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.path = workdir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            pid = holder.get("pid", "?")
            raise StackAlreadyRunning(
                f"a stack is already running in {self.workdir} (launcher pid {pid}, gateway "
                f"{holder.get('gateway') or 'starting'}); it is left as it is. Stop it first (Ctrl-C where it runs, "
                f"or kill {pid}), or start another one with --workdir DIR --port PORT"
            ) from None
        self._fd = fd
        self.note(gateway="")

    def note(self, gateway: str) -> None:
        """Records the holder (this process) and its gateway address(es) in the lock file."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps({"pid": os.getpid(), "gateway": gateway}).encode(), 0)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}


def check_port_free(host: str, port: int, what: str) -> None:
    """Refuses a fixed port another program holds, before any role is started to find out."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise StackAlreadyRunning(
                f"port {port} on {host} ({what}) is in use by another program or stack: stop it, or choose another "
                f"with --port"
            ) from None
