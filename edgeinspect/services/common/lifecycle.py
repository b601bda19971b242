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
  thread, the launcher forks every role from one thread that lives exactly as long as its stack (launcher.py),
  and passes that thread's id too: a role whose forking thread ended before it armed (a stack stopped while the
  role was still importing) would never get the signal, so it exits as well.
- a parent-pid watch thread, the fallback where prctl is missing: getppid() changes once the parent process is
  gone (the role is reparented). It also ends a role whose graceful stop hangs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgeinspect.services.common.retry import backoff_delays

log = logging.getLogger(__name__)

PARENT_PID_ENV = "EDGEINSPECT_PARENT_PID"
PARENT_TID_ENV = "EDGEINSPECT_PARENT_TID"  # the launcher thread that forked the role (its native id)
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
    # Popped: a process this role starts in turn must not take the launcher for its own parent and exit.
    value, thread = os.environ.pop(PARENT_PID_ENV, ""), os.environ.pop(PARENT_TID_ENV, "")
    if not value.isdigit():
        return  # started by hand, systemd or a container runtime: its lifetime is theirs to manage
    parent_pid = int(value)
    armed = set_parent_death_signal(signal.SIGTERM)
    # Checked after arming: a launcher that died before prctl left us reparented already.
    if os.getppid() != parent_pid:
        log.error("the launcher (pid %d) exited before this role started; not starting", parent_pid)
        raise SystemExit(1)
    # The same for the forking thread alone: ended before prctl, its exit signal will never come.
    if armed and thread.isdigit() and not Path(f"/proc/{parent_pid}/task/{thread}").exists():
        log.error("the launcher (pid %d) stopped its stack before this role started; not starting", parent_pid)
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


@dataclass
class RoleProcess:
    name: str  # unique in its stack: "vision", "stage0", "stage0r1" (replica 1 of range 0), "gateway"
    proc: subprocess.Popen
    port: int
    log_path: Path
    role: str = ""  # what the process runs (launcher.ROLES key)
    config_path: Path | None = None
    layers: tuple[int, int] | None = None  # stages: the layer range [a, b) served
    replica: int = 0
    restarts: int = 0  # times the supervisor or restart() started it again
    crashes_in_a_row: int = 0
    started_at: float = field(default_factory=time.monotonic)
    restart_at: float | None = None  # the supervisor's scheduled restart
    given_up: bool = False  # crashed too often in a row: the supervisor no longer restarts it
    held: bool = False  # being stopped or restarted on purpose: the supervisor keeps out

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the role's log (what to show when it died)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def supervise_step(role: RoleProcess, policy: RestartPolicy, relaunch: Callable[[RoleProcess], None]) -> bool:
    """One supervisor look at one role (under the stack's lock): schedule the restart of a crashed one, run a
    restart that is due, or give up on it. Returns whether anything changed (the stack file is rewritten)."""
    if role.held or role.given_up:
        return False
    now = time.monotonic()
    if role.restart_at is not None:
        if now < role.restart_at:
            return False
        role.restart_at = None
        relaunch(role)
        log.warning("%s restarted on port %d (pid %d)", role.name, role.port, role.pid)
        return True
    code = role.proc.poll()
    if code is None:
        return False
    role.crashes_in_a_row = policy.next_count(role.crashes_in_a_row, now - role.started_at)
    delay = policy.delay(role.crashes_in_a_row)
    if delay is None:
        role.given_up = True
        log.error(
            "%s exited with code %s after %d crashes in a row; not restarting it again. Its log (%s) ends:\n%s",
            role.name,
            code,
            role.crashes_in_a_row,
            role.log_path,
            role.log_tail(),
        )
        return True
    attempt = role.crashes_in_a_row + 1  # the run about to start; the first run was attempt 1
    log.warning("%s exited with code %s; restarting in %.1f s (attempt %d)", role.name, code, delay, attempt)
    role.restart_at = now + delay
    return True


def terminate(roles: list[RoleProcess], timeout_s: float) -> None:
    """SIGTERM to each (their grace runs), then SIGKILL to whatever still runs after timeout_s."""
    for role in roles:
        if role.proc.poll() is None:
            role.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for role in roles:
        try:
            role.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s of SIGTERM; killing it", role.name, timeout_s)
            role.proc.kill()
            role.proc.wait()


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
