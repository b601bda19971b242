"""Runs a rendered plant inside a network lab: every role started from its box's rendered compose command, as
`ip netns exec NS edgeinspect ...`, then one inspection through the gateway. Used by the multi-box test and
bench/network_bench.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from edgeinspect.services.deploy.compose import CONFIG_DIR
from edgeinspect.services.deploy.netns import Lab, wait_for

log = logging.getLogger(__name__)
EDGEINSPECT = str(Path(sys.executable).parent / "edgeinspect")


@dataclass
class PlantRun:
    """The role processes of one rendered plant, started in `lab` (box name -> namespace)."""

    lab: Lab
    rendered: Path
    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    servers: list[tuple[str, str]] = field(default_factory=list)  # (box, host:port)

    def start(self, netns_of: dict[str, str]) -> None:
        """Starts every served role of every box folder under `rendered`; `netns_of` maps box -> lab box."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for compose_file in sorted(self.rendered.glob("*/compose.yaml")):
            box = compose_file.parent.name
            if box not in netns_of:
                continue
            doc = yaml.safe_load(compose_file.read_text())
            for name, svc in doc["services"].items():
                if svc["command"][0] != "serve":
                    continue
                # The container's /etc/edgeinspect is the box folder's config/: same files, same command.
                argv = [a.replace(CONFIG_DIR, str(compose_file.parent / "config")) for a in svc["command"]]
                cfg = yaml.safe_load((compose_file.parent / "config" / Path(argv[-1]).name).read_text())
                out = (self.logs / f"{box}-{name}.log").open("w")
                proc = self.lab.popen(
                    netns_of[box], [EDGEINSPECT, *argv], env=self.env, stdout=out, stderr=subprocess.STDOUT
                )
                self.procs.append(proc)
                host = svc["healthcheck"]["test"][-1].rsplit(":", 1)[0]
                self.servers.append((netns_of[box], f"{host}:{cfg['server']['port']}"))

    def wait_healthy(self, timeout_s: float) -> None:
        for box, address in self.servers:

            def serving(box: str = box, address: str = address) -> bool:
                self._check_alive()
                argv = [EDGEINSPECT, "healthcheck", address, "--timeout", "1"]
                return self.lab.popen(box, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait() == 0

            wait_for(serving, timeout_s, f"{address} in {box}", interval_s=0.5)

    def _check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(proc.args[-5:])} exited with {proc.returncode}; logs in {self.logs}")

    def inspect(self, box: str, gateway: str, image: Path, token: str) -> dict:
        """One inspection from inside `box`'s namespace; the smoke command's JSON."""
        argv = [EDGEINSPECT, "deploy", "smoke", "-g", gateway, "--image", str(image), "--token", token, "--json"]
        done = subprocess.run(
            ["ip", "netns", "exec", self.lab.netns(box), *argv], capture_output=True, text=True, env=self.env
        )
        if done.returncode != 0:
            raise RuntimeError(f"smoke inspection failed: {done.stderr[-2000:]}; logs in {self.logs}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL whatever is still running after 10 s."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def role_env(tokens_json: str, threads: int = 1) -> dict[str, str]:
    """Environment of the role processes: offline hub, the gateway's tokens (a secret: env, not settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEINSPECT_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "EDGEINSPECT_API_TOKENS": tokens_json,
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    return env
