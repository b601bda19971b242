"""What the embedded stack runs: each role's module and settings type, the stack's options, role names, free
ports and private run configs. Pure choices and files; launcher.py starts and supervises the processes.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from edgeinspect.config import RoleSettings, write_yaml
from edgeinspect.services.common.lifecycle import RestartPolicy
from edgeinspect.services.console.settings import ConsoleSettings
from edgeinspect.services.gateway.settings import AnomalyPolicy, GatewayAnomalySettings, GatewaySettings, StationGate
from edgeinspect.services.retrieval.settings import RetrievalSettings
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.services.vision.settings import VisionSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoleKind:
    module: str  # python -m MODULE --config FILE
    settings: type[RoleSettings]


ROLES = {
    "vision": RoleKind("edgeinspect.services.vision", VisionSettings),
    "stage": RoleKind("edgeinspect.services.stage", StageSettings),
    "retrieval": RoleKind("edgeinspect.services.retrieval", RetrievalSettings),
    "gateway": RoleKind("edgeinspect.services.gateway", GatewaySettings),
    "console": RoleKind("edgeinspect.services.console", ConsoleSettings),
}
STACK_FILE = "stack.json"


@dataclass
class StackOptions:
    workdir: Path
    checkpoint: Path | None = None  # None: generate the tiny checkpoint under workdir on first run
    stages: int = 2  # layer ranges the language model is split into
    replicas: int = 1  # processes serving each layer range (the gateway routes between them)
    vision_replicas: int = 1  # vision processes (the gateway sends each request to a healthy one)
    kb_dir: Path | None = None  # None: no retrieval node
    retrieval_replicas: int = 1  # retrieval processes over kb_dir (when it is set)
    codec: str = "fp16"
    vision_backend: str = "torch"
    weights: str = "fp32"
    api_token: str = ""  # "": the token in WORKDIR/api_token, made there on first start (security.py)
    tls: bool = False  # `up --tls`: mTLS between the roles, TLS on the public API, a CA under WORKDIR/tls
    allow_unauthenticated: bool = False  # the gateway accepts calls without a token (loopback development)
    gateway_port: int = 0  # 0: pick a free port
    host: str = "127.0.0.1"
    start_timeout_s: float = 180.0
    supervise: bool = False  # restart a crashed role on its port with backoff (`up`); off: tests drive restarts
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    extra_env: dict[str, str] = field(default_factory=dict)
    console_port: int | None = None  # `up`: the web console on this HTTP port (0: a free one); None: none
    metrics: bool = True  # every role serves /metrics and /v2/health/{live,ready} on a port of its own
    banks_dir: Path | None = None  # the vision node's anomaly banks (None: WORKDIR/banks, where `anomaly teach` goes)
    anomaly: str = ""  # every station's gate policy, gate | vlm | off ("": the gateway's default, gate)
    gate_stations: tuple[str, ...] = ()  # these stations use `gate` whatever the default says
    gateways: int = 1  # gateway processes serving the whole public API (> 1: a pair on store_dsn, PostgreSQL)
    store_dsn: str = ""  # the PostgreSQL database a gateway pair shares ("": SQLite under workdir, one gateway)
    owner_lease_s: float = 10.0  # a pair's gateway silent this long is gone: its running keys may be taken over


def ensure_tiny_checkpoint(workdir: Path) -> Path:
    from edgeinspect.models.tiny import make_tiny

    path = workdir / "checkpoints" / "tiny"
    if not (path / "config.json").is_file():
        log.info("generating the tiny checkpoint in %s", path)
        make_tiny(path)
    return path


def gate_policy(default: str, gate_stations: tuple[str, ...]) -> GatewayAnomalySettings:
    """The gateway's per-station gate settings from `up`'s flags (--anomaly, --gate-station)."""
    cfg = GatewayAnomalySettings()
    if default:
        cfg.default = StationGate(policy=AnomalyPolicy(default))
    cfg.stations = {name: StationGate(policy=AnomalyPolicy.gate) for name in gate_stations}
    return cfg


def stage_ranges(num_layers: int, stages: int) -> list[tuple[int, int]]:
    base, extra = divmod(num_layers, stages)
    out, start = [], 0
    for k in range(stages):
        end = start + base + (1 if k < extra else 0)
        out.append((start, end))
        start = end
    return out


def stage_name(k: int, replica: int = 0) -> str:
    """stage0, stage1, ... for the first replica of each range (what single-replica stacks always called them);
    stage0r1, stage0r2, ... for further replicas of range 0."""
    return f"stage{k}" if replica == 0 else f"stage{k}r{replica}"


def replica_name(role: str, replica: int) -> str:
    """vision, vision1, vision2 ... (the first replica keeps the role's name, as single-replica stacks had it)."""
    return role if replica == 0 else f"{role}{replica}"


def free_ports(count: int, host: str, avoid: tuple[int, ...] = ()) -> list[int]:
    """Ports free right now: all bound at once (so distinct), then released for the roles to bind. Another
    process may take one in between; that role then fails to start naming the port (SO_REUSEPORT is off)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.bind((host, 0))
            if s.getsockname()[1] in avoid:  # the kernel may hand out a port the user asked for elsewhere
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_private_yaml(settings: RoleSettings, path: Path) -> None:
    """A run config, readable by this user only (it may hold API tokens and, with TLS, key paths)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file keeps its mode through open(); tighten it before writing
    finally:
        os.close(fd)
    write_yaml(settings, path)
