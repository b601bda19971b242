"""Real peers for tests and benches: a Mosquitto broker on a loopback port, stopped and started at will."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MosquittoBroker:
    """Debian's mosquitto on 127.0.0.1:<free port>, with persistence, so sessions and queued QoS 1 messages of
    persistent subscribers survive `stop()` + `start()` as they do on a plant's broker."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        if shutil.which("mosquitto") is None:
            raise FileNotFoundError("mosquitto is not installed (apt-get install mosquitto)")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.conf = self.workdir / "mosquitto.conf"
        # Started as root, mosquitto drops to the "mosquitto" user, which cannot write into this (root-owned)
        # folder: no log and, worse, no persistence file, so a restart lost every session and its queue (the
        # broker-outage test then raced the gateway's republish against the subscriber's resubscribe).
        stay_root = "user root\n" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {self.workdir}/\nautosave_interval 1\nlog_dest file {self.workdir}/broker.log\n"
            f"{stay_root}"
        )
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 10.0) -> MosquittoBroker:
        self.proc = subprocess.Popen(
            ["mosquitto", "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}; see {self.workdir}/broker.log")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout_s}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: it saves its persistence file first
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
