"""The embedded default: every role on one box, each its own OS process, wired over loopback gRPC.

Used by `edgeinspect up`/`demo` and by the end-to-end tests, so what the tests prove is what a user runs.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgeinspect.config import (
    GatewaySettings,
    RetrievalSettings,
    ServerConfig,
    StageSettings,
    VisionSettings,
    write_yaml,
)
from edgeinspect.errors import Unavailable

log = logging.getLogger(__name__)
ROLE_MODULES = {
    "vision": "edgeinspect.services.vision",
    "stage": "edgeinspect.services.stage",
    "retrieval": "edgeinspect.services.retrieval",
    "gateway": "edgeinspect.services.gateway",
}


@dataclass
class StackOptions:
    workdir: Path
    checkpoint: Path | None = None  # None: generate the tiny checkpoint under workdir on first run
    stages: int = 2
    kb_dir: Path | None = None  # None: no retrieval node
    codec: str = "fp16"
    chained: bool = False
    vision_backend: str = "torch"
    weights: str = "fp32"
    api_token: str = "edgeinspect-local"
    gateway_port: int = 0  # 0: pick a free port
    host: str = "127.0.0.1"
    start_timeout_s: float = 180.0
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class RoleProcess:
    name: str
    proc: subprocess.Popen
    port: int
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the role's log (what to show when it died)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def ensure_tiny_checkpoint(workdir: Path) -> Path:
    from edgeinspect.models.tiny import make_tiny

    path = workdir / "checkpoints" / "tiny"
    if not (path / "config.json").is_file():
        log.info("generating the tiny checkpoint in %s", path)
        make_tiny(path)
    return path


def stage_ranges(num_layers: int, stages: int) -> list[tuple[int, int]]:
    base, extra = divmod(num_layers, stages)
    out, start = [], 0
    for k in range(stages):
        end = start + base + (1 if k < extra else 0)
        out.append((start, end))
        start = end
    return out


class LocalStack:
    """Starts the roles (vision, stages, retrieval, gateway) as processes; `stop` ends them all."""

    def __init__(self, opts: StackOptions):
        self.opts = opts
        self.roles: list[RoleProcess] = []
        self.run_dir = opts.workdir / "run"
        self.gateway_address = ""
        self.checkpoint: Path | None = None

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def api_token(self) -> str:
        return self.opts.api_token

    def address_of(self, name: str) -> str:
        for r in self.roles:
            if r.name == name:
                return f"{self.opts.host}:{r.port}"
        raise KeyError(name)

    def start(self) -> None:
        o = self.opts
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint = ckpt = o.checkpoint or ensure_tiny_checkpoint(o.workdir)
        from edgeinspect.models.checkpoint import open_checkpoint

        num_layers = open_checkpoint(ckpt).num_layers
        self._spawn(
            "vision",
            VisionSettings(
                checkpoint=ckpt,
                backend=o.vision_backend,
                server=self._server("vision"),
                onnx_path=o.workdir / "vision.onnx",
            ),
        )
        ranges = stage_ranges(num_layers, o.stages)
        # Chained stages need the next stage's address, so start from the last one.
        stage_procs: list[RoleProcess] = []
        next_addr = None
        for k in reversed(range(len(ranges))):
            a, b = ranges[k]
            cfg = StageSettings(
                checkpoint=ckpt,
                layer_start=a,
                layer_end=b,
                weights=o.weights,
                next_stage=next_addr if o.chained else None,
                server=self._server(f"stage{k}"),
            )
            proc = self._spawn(f"stage{k}", cfg, wait=o.chained)
            stage_procs.insert(0, proc)
            next_addr = f"{o.host}:{proc.port}" if o.chained else None
        if o.kb_dir is not None:
            self._spawn("retrieval", RetrievalSettings(kb_dir=o.kb_dir, server=self._server("retrieval")))
        for role in self.roles:
            if role.port == 0:
                role.port = self._wait_port(role)
        gateway = GatewaySettings(
            checkpoint=ckpt,
            vision=self.address_of("vision"),
            stages=[f"{o.host}:{p.port}" for p in stage_procs],
            retrieval=self.address_of("retrieval") if o.kb_dir is not None else None,
            codec=o.codec,
            chained=o.chained,
            db_path=o.workdir / "reports.sqlite",
            api_tokens=[o.api_token],
            server=self._server("gateway", o.gateway_port),
            upstream_timeout_s=o.start_timeout_s,
        )
        self._spawn("gateway", gateway)
        self.gateway_address = self.address_of("gateway")
        self._wait_serving(self.gateway_address)

    def _server(self, name: str, port: int = 0) -> ServerConfig:
        return ServerConfig(host=self.opts.host, port=port, port_file=self.run_dir / f"{name}.port", grace_s=2.0)

    def _spawn(self, name: str, cfg, wait: bool = True) -> RoleProcess:
        role = name.rstrip("0123456789")
        config_path = self.run_dir / f"{name}.yaml"
        port_file = Path(cfg.server.port_file)
        port_file.unlink(missing_ok=True)
        write_yaml(cfg, config_path)
        log_path = self.opts.workdir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **self.opts.extra_env}
        with log_path.open("ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", ROLE_MODULES[role], "--config", str(config_path)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        rp = RoleProcess(name, proc, 0, log_path)
        self.roles.append(rp)
        if wait:
            rp.port = self._wait_port(rp)
        return rp

    def _wait_port(self, role: RoleProcess) -> int:
        port_file = self.run_dir / f"{role.name}.port"
        deadline = time.monotonic() + self.opts.start_timeout_s
        while time.monotonic() < deadline:
            if role.proc.poll() is not None:
                raise Unavailable(
                    f"{role.name} exited with code {role.proc.returncode}; see {role.log_path}:\n" + role.log_tail()
                )
            if port_file.is_file() and port_file.read_text().strip():
                return int(port_file.read_text())
            time.sleep(0.05)
        raise Unavailable(f"{role.name} did not bind a port within {self.opts.start_timeout_s}s; see {role.log_path}")

    def _wait_serving(self, address: str) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + self.opts.start_timeout_s
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                for role in self.roles:
                    if role.proc.poll() is not None:
                        raise Unavailable(f"{role.name} exited with code {role.proc.returncode}:\n" + role.log_tail())
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise Unavailable(f"the gateway at {address} was not SERVING within {self.opts.start_timeout_s}s")

    def kill(self, name: str) -> None:
        """SIGKILL one role (failure tests)."""
        role = next(r for r in self.roles if r.name == name)
        role.proc.kill()
        role.proc.wait()

    def restart(self, name: str) -> None:
        """Starts a role again from its written config (same port when it had a fixed one)."""
        role = next(r for r in self.roles if r.name == name)
        self.roles.remove(role)
        config_path = self.run_dir / f"{name}.yaml"
        cls = {
            "vision": VisionSettings,
            "stage": StageSettings,
            "retrieval": RetrievalSettings,
            "gateway": GatewaySettings,
        }[name.rstrip("0123456789")]
        cfg = cls.load(config_path)
        if cfg.server.port == 0:
            cfg.server.port = role.port  # keep the address its peers and clients know
        new = self._spawn(name, cfg)
        if name == "gateway":
            self._wait_serving(f"{self.opts.host}:{new.port}")

    def stop(self, timeout_s: float = 10.0) -> None:
        for role in reversed(self.roles):
            if role.proc.poll() is None:
                role.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for role in self.roles:
            try:
                role.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                role.proc.kill()
                role.proc.wait()
        self.roles = []
