"""Runs a rendered plant inside a network lab: every role started from its box's rendered compose command, as
`ip netns exec NS edgeinspect ...`, then inspections through the gateway with `edgeinspect deploy smoke`. Used by
the multi-box test and bench/network_bench.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import yaml

from edgeinspect.deploy import tls
from edgeinspect.deploy.compose import CONFIG_DIR, HEALTHCHECK
from edgeinspect.deploy.netns import Lab

log = logging.getLogger(__name__)
EDGEINSPECT = str(Path(sys.executable).parent / "edgeinspect")


@dataclass
class PlantRun:
    """The role processes of one rendered plant, started in `lab` (box name -> lab box)."""

    lab: Lab
    rendered: Path
    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    servers: list[tuple[str, str]] = field(default_factory=list)  # (lab box, host:port as seen inside it)
    health_args: dict[str, list[str]] = field(default_factory=dict)  # host:port -> healthcheck's TLS options
    log_of: dict[int, Path] = field(default_factory=dict)  # pid -> its log file

    def start(self, netns_of: dict[str, str], roles: set[str] | None = None) -> None:
        """Starts every served role (or only `roles`) of every box folder under `rendered`; `netns_of` maps
        box -> lab box. EDGEINSPECT_SERVER__PORT in `env` overrides the rendered port, as it does in the role."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for compose_file in sorted(self.rendered.glob("*/compose.yaml")):
            box = compose_file.parent.name
            if box not in netns_of:
                continue
            doc = yaml.safe_load(compose_file.read_text())
            for name, svc in doc["services"].items():
                command = svc.get("command") or [""]  # observability services (Prometheus, Grafana) have none
                if command[0] != "serve" or (roles is not None and command[1] not in roles):
                    continue
                if svc["healthcheck"]["test"][1:2] != HEALTHCHECK:  # the gRPC roles; not the console (a web client)
                    continue
                # The container's /etc/edgeinspect is the box folder's config/: same files, same command; its
                # mounted secrets are the box folder's secrets/ (the settings name them at the mount: rewritten).
                mount = self._tls_mount(compose_file.parent, box)
                argv = [a.replace(CONFIG_DIR, str(compose_file.parent / "config")) for a in svc["command"]]
                text = (compose_file.parent / "config" / Path(argv[-1]).name).read_text().replace(tls.MOUNT, mount)
                argv[-1] = str(self.logs / f"{box}-{Path(argv[-1]).name}")
                Path(argv[-1]).write_text(text)
                cfg = yaml.safe_load(text)
                log_path = self.logs / f"{box}-{name}.log"
                with log_path.open("w") as out:
                    proc = self.lab.popen(
                        netns_of[box], [EDGEINSPECT, *argv], env=self.env, stdout=out, stderr=subprocess.STDOUT
                    )
                self.procs.append(proc)
                self.log_of[proc.pid] = log_path
                # The compose healthcheck's address (loopback inside the box) with the port the settings bind.
                host = svc["healthcheck"]["test"][-1].rsplit(":", 1)[0]
                port = self.env.get("EDGEINSPECT_SERVER__PORT", cfg["server"]["port"])
                self.servers.append((netns_of[box], f"{host}:{port}"))
                # CMD edgeinspect-healthcheck [TLS options] ADDRESS
                options = svc["healthcheck"]["test"][1 + len(HEALTHCHECK) : -1]
                self.health_args[f"{host}:{port}"] = [a.replace(tls.MOUNT, mount) for a in options]

    def _tls_mount(self, box_dir: Path, box: str) -> str:
        """A folder laid out as the container's TLS mount (ca.crt, box.crt, box.key) from box_dir/secrets/tls/."""
        mount = self.logs / f"tls-{box}"
        mount.mkdir(parents=True, exist_ok=True)
        src = box_dir / tls.SECRETS_DIR
        for name, file in ((tls.CA_FILE, tls.CA_FILE), (tls.CERT_FILE, f"{box}.crt"), (tls.KEY_FILE, f"{box}.key")):
            if (src / file).is_file() and not (mount / name).exists():
                (mount / name).symlink_to(src / file)
        return str(mount)

    def ca_file(self) -> Path | None:
        """The plant CA, as the boxes hold it (None: the plant runs without TLS)."""
        return next((p for p in sorted(self.logs.glob(f"tls-*/{tls.CA_FILE}")) if p.exists()), None)

    def wait_healthy(self, timeout_s: float) -> None:
        """Waits until every role answers SERVING (one `healthcheck --wait` per role, inside its box); raises
        RuntimeError with the log tail as soon as a role exits, TimeoutError when one is not up in time."""
        waiters = [
            (address, self.lab.popen(box, [EDGEINSPECT, "healthcheck", *self.health_args.get(address, []), address,
                                           "--wait", str(timeout_s)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            for box, address in self.servers
        ]  # fmt: skip
        try:
            while True:
                self._check_alive()
                pending = [(a, w) for a, w in waiters if w.poll() is None]
                for address, w in waiters:
                    if w.returncode not in (None, 0):
                        why = w.stderr.read().strip() if w.stderr is not None else ""
                        raise TimeoutError(f"{address} not SERVING after {timeout_s:.0f} s: {why}")
                if not pending:
                    return
                time.sleep(0.2)
        finally:
            for _, w in waiters:
                if w.poll() is None:
                    w.kill()
                w.wait()
                if w.stderr is not None:
                    w.stderr.close()

    def _check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                path = self.log_of[proc.pid]
                tail = "\n".join(path.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"{_command_tail(proc)} exited with {proc.returncode}; {path}:\n{tail}")

    def inspect(self, box: str, gateway: str, image: Path, token: str, timeout_s: float = 300.0) -> dict:
        """One inspection from inside `box`'s namespace; the smoke command's JSON."""
        argv = [EDGEINSPECT, "deploy", "smoke", "-g", gateway, "--image", str(image), "--token", token, "--json"]
        argv += ["--timeout", str(timeout_s)]
        ca = self.ca_file()
        if ca is not None:
            argv += ["--ca", str(ca)]
        done = subprocess.run(
            ["ip", "netns", "exec", self.lab.netns(box), *argv], capture_output=True, text=True, env=self.env
        )
        if done.returncode != 0:
            raise RuntimeError(f"smoke inspection failed: {done.stderr[-2000:]}; logs in {self.logs}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every role, then SIGKILL whatever is still running after `grace_s`."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0f s: killing it", _command_tail(proc), grace_s)
                proc.kill()
                proc.wait()
        self.procs.clear()


def _command_tail(proc: subprocess.Popen) -> str:
    """The end of a role's command line (`serve ROLE --config FILE`), for messages (lab.popen is given a list)."""
    return " ".join(cast(list[str], proc.args)[-4:])


def role_env(tokens: list[str], threads: int = 1) -> dict[str, str]:
    """Environment of the role processes: offline hub, the gateway's tokens (as hashes, admin role; env, not
    settings, as a deployment passes them)."""
    from edgeinspect.services.common.auth import hash_token

    entries = [{"name": f"lab-{i}", "role": "admin", "hash": hash_token(t)} for i, t in enumerate(tokens)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEINSPECT_")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "EDGEINSPECT_API_TOKENS": json.dumps(entries),
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    return env
