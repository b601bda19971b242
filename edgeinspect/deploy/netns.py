"""An emulated plant network on one Linux machine (root): one network namespace per box, joined by veth pairs to
a bridge inside a hub namespace of its own, each link shaped with tbf. Used by the multi-box test and benchmark.

Nothing touches the caller's namespace: the bridge, the veths and the addresses live only in namespaces made here,
and closing the lab deletes them all (which also removes the links and qdiscs inside).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SUBNET = "10.213.0"  # private, and only inside the lab's namespaces
TBF = ("burst", "256kb", "latency", "50ms")

# Sink/source for measuring a link: the sink prints its port, then the seconds between first and last byte.
_SINK = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""
_SOURCE = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); left = int(sys.argv[3]); buf = bytes(1 << 20)
while left > 0:
    left -= c.send(buf[: min(left, len(buf))])
c.close()
"""


def unavailable_reason() -> str | None:
    """Why a lab cannot be built here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"eiprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass
class Lab:
    """Boxes `names` on one bridge, each link shaped to `rate` (tc syntax: 1gbit, 100mbit) both ways."""

    names: list[str]
    rate: str = "1gbit"
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    namespaces: list[str] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"ei{self.run_id}hub"

    def netns(self, box: str) -> str:
        return f"ei{self.run_id}-{self.names.index(box)}"

    def address(self, box: str) -> str:
        return f"{SUBNET}.{self.names.index(box) + 1}"

    def up(self) -> Lab:
        """Creates the namespaces, bridge, links, addresses and shaping; on any failure removes what it made."""
        try:
            self._add_ns(self.hub)
            _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for i, box in enumerate(self.names):
                ns = self.netns(box)
                self._add_ns(ns)
                # eth0 in the box, port<i> on the hub's bridge; both ends shaped so each direction is limited.
                _run(
                    "ip", "-n", self.hub, "link", "add", f"port{i}", "type", "veth", "peer", "name", "eth0", "netns", ns
                )
                _run("ip", "-n", self.hub, "link", "set", f"port{i}", "master", "br0", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.address(box)}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                self.shape(self.rate, box)
        except BaseException:
            self.down()
            raise
        return self

    def shape(self, rate: str, box: str | None = None) -> None:
        """(Re)shapes the links of `box` (all boxes when None) to `rate`."""
        for b in [box] if box else self.names:
            i = self.names.index(b)
            for ns, dev in ((self.netns(b), "eth0"), (self.hub, f"port{i}")):
                _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, *TBF)
        self.rate = rate

    def _add_ns(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)

    def down(self) -> None:
        """Kills whatever still runs inside this lab's namespaces, then deletes them (links and qdiscs go with
        them). A process left inside would keep its namespace, and the addresses in it, alive after the name."""
        while self.namespaces:
            ns = self.namespaces.pop()
            _kill_inside(ns)
            done = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if done.returncode != 0:
                log.warning("could not delete netns %s: %s", ns, done.stderr.strip())

    def popen(self, box: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Starts `argv` inside the box's namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns(box), *argv], **kwargs)  # noqa: S603

    def throughput_bps(self, src: str, dst: str, nbytes: int = 64 << 20) -> float:
        """Bits per second of one TCP stream from `src` to `dst` through the shaped links."""
        sink = self.popen(dst, [sys.executable, "-c", _SINK, self.address(dst)], stdout=subprocess.PIPE, text=True)
        try:
            if sink.stdout is None:
                raise RuntimeError("the sink's stdout is not a pipe")
            port = sink.stdout.readline().strip()
            source = self.popen(src, [sys.executable, "-c", _SOURCE, self.address(dst), port, str(nbytes)])
            source.wait(timeout=120)
            got, seconds = sink.stdout.readline().split()
        finally:
            sink.kill()
            sink.wait()
        return int(got) * 8 / float(seconds)

    def __enter__(self) -> Lab:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def _kill_inside(ns: str, timeout_s: float = 5.0) -> None:
    """SIGKILLs every process in namespace `ns` (all started by this lab) and waits for them to be gone."""
    listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    pids = [int(p) for p in listed if p.isdigit()]
    for pid in pids:
        log.warning("killing pid %d left running in lab namespace %s", pid, ns)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        # Not reaped here: a child of ours stays a zombie for its Popen to collect (and see the kill).
        pids = [p for p in pids if _alive(p)]
        if pids:
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
