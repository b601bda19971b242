"""Child-process lifecycle of roles started by a launcher: die with the parent, restart with backoff, stop on
SIGTERM/SIGHUP as on Ctrl-C.

No role may outlive the process that started it, even when that one is SIGKILLed (a second `up` would find
the ports taken, and orphans keep serving stale state). Two mechanisms, both armed by the role itself in
run_role when the launcher set EDGEINSPECT_PARENT_PID:
- PR_SET_PDEATHSIG (Linux): the kernel sends the role SIGTERM when the *thread* that forked it exits. It is
  armed in the role after exec rather than in a subprocess preexec_fn: preexec_fn runs Python between fork and
  exec, which can deadlock when the parent has other threads (the launcher has a supervisor thread). The gap
  before the role arms it (interpreter start, imports) is closed by comparing getppid() with the pid the
  launcher passed: if the launcher already died, the role exits at once. Because the signal follows the forking
  thread, the launcher forks every role from one thread that lives exactly as long as its stack (launcher.py).
- a parent-pid watch thread, the fallback where prctl is missing: getppid() changes once the parent process is
  gone (the role is reparented). It also ends a role whose graceful stop hangs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from edgeinspect.services.common.retry import backoff_delays

log = logging.getLogger(__name__)

PARENT_PID_ENV = "EDGEINSPECT_PARENT_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Asks the kernel to send `sig` when the thread that forked this process exits (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent_pid: int, interval_s: float = 0.5, kill_after_s: float = 12.0) -> threading.Thread:
    """A daemon thread: once the parent is gone, SIGTERM this process (a graceful stop), and SIGKILL it when
    that has not ended it within kill_after_s (a stop that hangs must not leave an orphan serving)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        log.warning("the launcher (pid %d) is gone; stopping", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(kill_after_s)
        log.error("still running %.0f s after the launcher died; killing this process", kill_after_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def die_with_launcher() -> None:
    """Called first thing in a role process: when a launcher started it, end it when the launcher ends."""
    value = os.environ.get(PARENT_PID_ENV, "")
    if not value.isdigit():
        return  # started by hand, systemd or a container runtime: its lifetime is theirs to manage
    parent_pid = int(value)
    set_parent_death_signal(signal.SIGTERM)
    # Checked after arming: a launcher that died before prctl left us reparented already.
    if os.getppid() != parent_pid:
        log.error("the launcher (pid %d) exited before this role started; not starting", parent_pid)
        raise SystemExit(1)
    watch_parent(parent_pid)


@dataclass(frozen=True)
class RestartPolicy:
    """When a supervisor restarts a crashed role: exponential backoff, and a bound on crashes in a row."""

    base_s: float = 0.4  # first restart delay
    factor: float = 2.0
    max_s: float = 10.0  # longest delay between restarts
    max_restarts: int = 5  # crashes in a row (each within stable_s of its start) before giving up
    stable_s: float = 30.0  # a run this long resets the count: a crash a day is restarted forever

    def delay(self, restarts_in_a_row: int) -> float | None:
        """Seconds to wait before restart number `restarts_in_a_row` (1-based); None: give up."""
        if restarts_in_a_row < 1 or restarts_in_a_row > self.max_restarts:
            return None
        delays = backoff_delays(self.base_s, self.factor, self.max_s, self.max_restarts + 1)
        return delays[restarts_in_a_row - 1]

    def next_count(self, restarts_in_a_row: int, ran_s: float) -> int:
        """The crash count after a run of ran_s seconds ended in a crash."""
        return 1 if ran_s >= self.stable_s else restarts_in_a_row + 1


class StopSignal(KeyboardInterrupt):
    """SIGTERM / SIGHUP turned into the same exception as Ctrl-C, so one `except KeyboardInterrupt` stops."""


@contextlib.contextmanager
def signals_as_interrupt(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise StopSignal in the main thread, as Ctrl-C raises
    KeyboardInterrupt: a background `up` started by a script ignores SIGINT, so SIGTERM is all it gets."""

    def interrupt(signum: int, _frame) -> None:
        raise StopSignal(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_ignored(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """A bounded cleanup (stopping every role) runs to its end: a second Ctrl-C must not leave half of them."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
