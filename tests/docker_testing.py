"""A real Docker engine for the compose tests: started by the project's own script where it is not running, the
image built from compose/Dockerfile on the stand-in base, compose projects brought up and torn down with Debian's
docker-compose (Compose v1, 1.29)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# Debian's docker.io client matches its engine and builds with BuildKit itself (a newer client needs buildx).
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
COMPOSE = "docker-compose"
BASE_IMAGE = os.environ.get("EDGEINSPECT_BASE_IMAGE", "edgeinspect/base-bookworm:local")


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=check)


def _engine_answers() -> bool:
    try:
        return docker("info", timeout=15, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def engine_unavailable_reason() -> str | None:
    """None when an engine answers and the stand-in base exists (starting both with tools/docker_engine.sh where
    this runs as root), else why not."""
    have_base = _engine_answers() and docker("image", "inspect", BASE_IMAGE, check=False).returncode == 0
    if not have_base:
        if os.geteuid() != 0:
            return "no Docker engine answers and starting one needs root (sudo tools/docker_engine.sh)"
        try:
            done = subprocess.run(
                ["bash", str(REPO / "tools" / "docker_engine.sh")], capture_output=True, text=True, timeout=1500
            )
        except subprocess.TimeoutExpired:
            return "tools/docker_engine.sh did not finish in 25 minutes"
        if done.returncode != 0:
            return f"tools/docker_engine.sh could not start an engine: {(done.stderr or done.stdout)[-400:]}"
    if shutil.which(COMPOSE) is None:
        return "docker-compose (Debian's Compose v1) is not installed: run tools/docker_engine.sh"
    return None


@dataclass(frozen=True)
class Built:
    tag: str
    build_s: float
    size_bytes: int
    layers: int


def build_image(tag: str, python: str) -> Built:
    """The wheelhouse (tools/wheelhouse.sh with `python`) and then the image, on the stand-in base."""
    env = {**os.environ, "PYTHON": python}
    subprocess.run(["bash", str(REPO / "tools" / "wheelhouse.sh")], check=True, timeout=1800, env=env,
                   capture_output=True)  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(
        [DOCKER, "build", "-f", "compose/Dockerfile", "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "-t", tag, "."],
        cwd=REPO, env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"docker build failed:\n{done.stderr[-3000:]}")
    built_s = time.monotonic() - start
    info = json.loads(docker("image", "inspect", tag).stdout)[0]
    return Built(tag, built_s, info["Size"], len(info["RootFS"]["Layers"]))


class Project:
    """One compose project: a file run under its own project name (`docker-compose -p NAME -f FILE`)."""

    def __init__(self, name: str, file: Path):
        self.name, self.file = name, file

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [COMPOSE, "--ansi", "never", "-p", self.name, "-f", str(self.file), *args],
            cwd=self.file.parent, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"docker-compose {' '.join(args)} ({self.name}): {done.stderr[-3000:]}")
        return done

    def up(self) -> None:
        self.compose("up", "-d", "--no-build")

    def down(self, volumes: bool = False) -> None:
        self.compose("down", "--remove-orphans", *(["--volumes"] if volumes else []), timeout=300, check=False)

    def container(self, service: str) -> str:
        """The id of the service's (one) container."""
        out = self.compose("ps", "-q", service).stdout.split()
        if len(out) != 1:
            raise RuntimeError(f"{self.name}/{service}: {len(out)} containers")
        return out[0]

    def state(self, service: str) -> dict:
        return json.loads(docker("inspect", self.container(service)).stdout)[0]["State"]

    def health(self, service: str) -> str:
        """The engine's verdict from the compose healthcheck: starting, healthy or unhealthy."""
        return self.state(service).get("Health", {}).get("Status", "none")

    def services(self) -> list[str]:
        """The services `up` starts (not those of an optional profile: Prometheus, Grafana)."""
        doc = yaml.safe_load(self.file.read_text())
        return [name for name, svc in doc["services"].items() if "profiles" not in svc]

    def logs(self, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), check=False).stdout

    def wait_healthy(self, services: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            health = {s: self.health(s) for s in services}
            if all(h == "healthy" for h in health.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not healthy after {timeout_s:.0f} s: {health}\n{self.logs()}")
            time.sleep(2)


def loopback_addresses(addresses: list[str]) -> None:
    """Gives the host each box's address (on lo): every box's compose project publishes its ports there and
    reaches its peers there, as boxes on one line network do."""
    for a in addresses:
        subprocess.run(["ip", "addr", "add", f"{a}/32", "dev", "lo"], check=True, capture_output=True)


def drop_loopback_addresses(addresses: list[str]) -> None:
    for a in addresses:
        subprocess.run(["ip", "addr", "del", f"{a}/32", "dev", "lo"], check=False, capture_output=True)
