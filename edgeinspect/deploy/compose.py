"""Compose files: one per box (peers reached at box addresses), and an all-in-one for a single machine."""

from __future__ import annotations

import re
from typing import Any

import yaml

from edgeinspect.deploy import database, tls
from edgeinspect.deploy.inventory import GIB, Box, Inventory, Role
from edgeinspect.deploy.topology import Instance

CONFIG_DIR = "/etc/edgeinspect"
# The image's entrypoint exports every /run/secrets/EDGEINSPECT_* file as the variable of that name, so the
# settings classes read secrets from the environment and they never land in an image or a rendered YAML.
TOKENS_ENV = "EDGEINSPECT_API_TOKENS"  # gateway: JSON list of accepted bearer tokens
TOKEN_ENV = "EDGEINSPECT_API_TOKEN"  # ingest: the one token it presents
# compose secret name -> (file on the box, variable it becomes)
SECRETS = {
    "api_tokens": ("./secrets/api_tokens.json", TOKENS_ENV),
    "ingest_token": ("./secrets/ingest_token", TOKEN_ENV),
}
SECRET_OF_ROLE = {Role.gateway: "api_tokens", Role.ingest: "ingest_token"}
HAILO_DEVICE = "/dev/hailo0"
# The image's light health probe (services/common/health_probe.py): a probe through the whole `edgeinspect` CLI
# outlived the 5 s healthcheck timeout on a box loading its models.
HEALTHCHECK = ["edgeinspect-healthcheck"]
USER = 10001  # the image's user; PostgreSQL runs as it too, so one `chown` serves every secret file
VIDEO_GID = 44  # Debian's `video` group, which owns /dev/video* on the boxes and in the image
# A Pi's SD card fills with unrotated container logs: three files of 10 MB per service at most.
LOGGING = {"driver": "json-file", "options": {"max-size": "10m", "max-file": "3"}}
# Non-stage roles may burst to twice their reserve before the kernel stops them (a stage to its whole budget).
LIMIT_OVER_RESERVE = 2.0


class PlainDumper(yaml.SafeDumper):
    """safe_dump without anchors and aliases (`&id001`): every rendered file reads on its own."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=PlainDumper, sort_keys=False, width=110)


def video_devices(sources: list[str]) -> list[str]:
    """/dev/videoN for every V4L2 camera source (usb:N, N, /dev/videoN), in order, once each."""
    out: list[str] = []
    for src in sources:
        m = re.fullmatch(r"(?:usb:|/dev/video)?(\d+)", src.strip())
        if m and f"/dev/video{m.group(1)}" not in out:
            out.append(f"/dev/video{m.group(1)}")
    return out


def memory_request_bytes(inv: Inventory, inst: Instance) -> int:
    """What the instance needs: a stage its planned weights, KV budget and runtime (never above its budget)."""
    from edgeinspect.deploy.inventory import STAGE_RUNTIME_GIB

    if inst.role is Role.stage:
        need = inst.stage_placement.weight_bytes + inv.plant.kv_budget_mb * 2**20 + int(STAGE_RUNTIME_GIB * GIB)
        return min(need, inst.box.stage_budget_bytes())
    return int(inst.box.reserve_gib(inst.role) * GIB)


def memory_limit_bytes(inv: Inventory, inst: Instance) -> int:
    """Where the kernel stops the instance: a stage at the budget the planner gave it (box memory less the OS and
    the co-located roles), any other role at twice its reserve."""
    if inst.role is Role.stage:
        return inst.box.stage_budget_bytes()
    return int(min(inst.box.reserve_gib(inst.role) * LIMIT_OVER_RESERVE, inst.box.memory_gb) * GIB)


def cpu_limit(inst: Instance) -> float:
    """Cores the instance may use: a stage the whole box, any other role twice its share (at most the box)."""
    if inst.role is Role.stage:
        return inst.box.cpus
    return min(inst.box.role_cpus(inst.role) * LIMIT_OVER_RESERVE, inst.box.cpus)


def mebibytes(n: int) -> str:
    """A Kubernetes quantity in MiB."""
    return f"{n // 2**20}Mi"


def compose_bytes(n: int) -> str:
    """A compose byte value in MiB: `m` is 2**20 for the engine, and the one spelling both Compose versions read
    (v2 also takes Kubernetes' `Mi`, v1's docker-py refuses it)."""
    return f"{n // 2**20}m"


def http_health_command(port: int, path: str = "/v2/health/ready") -> list[str]:
    """A probe of an HTTP readiness endpoint (default: the role's on its metrics port) with what the image has."""
    code = (
        "import sys, urllib.request; "
        f"sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=4).status == 200 "
        "else 1)"
    )
    return ["python", "-c", code]


def config_file(inst: Instance) -> str:
    """The instance's settings file (ingest: the plant engineer's cameras file, completed by the renderer)."""
    return f"{inst.service}.yaml"


def image_for(inv: Inventory, box: Box, role: Role) -> str:
    if box.hailo and role is Role.vision:
        return inv.plant.hailo_image
    return inv.plant.gpu_image if box.uses_gpu(role) else inv.plant.image


def gpu_access(box: Box) -> dict[str, Any]:
    """What gives a compose service the box's GPU: on a Jetson the NVIDIA container runtime (L4T mounts the GPU
    and its libraries through it; it has no device requests), elsewhere a device reservation for one NVIDIA GPU."""
    if box.gpu is not None and box.gpu.unified:
        return {"runtime": "nvidia"}
    gpu = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    return {"deploy": {"resources": {"reservations": {"devices": [gpu]}}}}


def _bind(source: str, target: str, read_only: bool) -> dict[str, Any]:
    return {"type": "bind", "source": source, "target": target, "read_only": read_only}


def _volumes(inv: Inventory, inst: Instance) -> list[dict[str, Any]]:
    plant = inv.plant
    # The whole folder: an ingest camera's background picture sits beside its cameras file.
    vols = [_bind("./config", CONFIG_DIR, True)]
    ckpt = str(plant.data_dir / "checkpoints")
    if inst.role in (Role.vision, Role.stage, Role.gateway):
        vols.append(_bind(ckpt, ckpt, True))
    if inst.role in (Role.vision, Role.stage):  # the vision ONNX export; a stage's compiled decode kernel
        vols.append(_bind(str(plant.cache_dir), str(plant.cache_dir), False))
    if inst.role is Role.vision:  # the anomaly gate's banks, taught on this box: kept in its folder, not the container
        vols.append(_bind(str(plant.banks_dir), str(plant.banks_dir), False))
    if inst.role is Role.retrieval:
        vols.append(_bind(str(plant.kb_dir), str(plant.kb_dir), True))
    if inst.role is Role.gateway:
        vols.append(_bind(str(plant.reports_dir), str(plant.reports_dir), False))
    if inst.role is Role.ingest:
        vols.append(_bind(str(plant.frames_dir), str(plant.frames_dir), False))
    return vols


def _service(
    inv: Inventory,
    inst: Instance,
    local: list[Instance],
    publish: bool,
    client_ports: list[int],
    cameras: list[str],
) -> dict[str, Any]:
    if inst.role is Role.database:
        return _database_service(inv, inst, publish)
    if inst.role is Role.ingest:
        command = ["ingest", "--config", f"{CONFIG_DIR}/{config_file(inst)}"]
    else:
        command = ["serve", inst.role.value, "--config", f"{CONFIG_DIR}/{config_file(inst)}"]
    svc: dict[str, Any] = {
        "image": image_for(inv, inst.box, inst.role),
        "command": command,
        "restart": "unless-stopped",
        "init": True,
        "environment": {"HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"},  # no progress bars in the JSON logs
    }
    ports = _published(inst, client_ports) if publish else {inst.port: ""} if inst.role is Role.gateway else {}
    if ports:
        svc["ports"] = [f"{host}:{p}:{p}" if host else f"{p}:{p}" for p, host in ports.items()]
    gateways = [i for i in local if i.role is Role.gateway]
    if not publish and inst.role is Role.gateway and gateways.index(inst):
        # several gateways on one machine (all-in-one): the k-th on the next host port, the first where it always was
        svc["ports"] = [f"{inst.port + gateways.index(inst)}:{inst.port}"]
    svc["volumes"] = _volumes(inv, inst)
    secrets = []
    if inst.role in SECRET_OF_ROLE:
        name = SECRET_OF_ROLE[inst.role]
        secrets.append({"source": name, "target": SECRETS[name][1]})
    if inst.role is Role.gateway and inv.shared_store:  # the DSN as a file the settings name, never in a YAML
        secrets.append({"source": "store_dsn", "target": database.mounted(database.DSN_FILE)})
    if inv.plant.tls:
        # ingest only verifies the gateway: the CA, not the box's key
        wanted = _tls_secrets(inst.box).items() if inst.role is not Role.ingest else [("tls_ca", tls.CA_FILE)]
        secrets += [{"source": src, "target": tls.mounted(target)} for src, target in wanted]
    if secrets:
        svc["secrets"] = secrets
    if inst.role is Role.vision and inst.box.hailo:
        svc["devices"] = [f"{HAILO_DEVICE}:{HAILO_DEVICE}"]
    if inst.role is Role.ingest and video_devices(cameras):
        svc["devices"] = [f"{d}:{d}" for d in video_devices(cameras)]
        svc["group_add"] = [str(VIDEO_GID)]  # the image's user reads /dev/video* through the video group
    if inst.box.uses_gpu(inst.role):
        svc |= gpu_access(inst.box)
    health_tls = tls.healthcheck_args() if inv.plant.tls else []
    if inst.port:
        test = ["CMD", *HEALTHCHECK, *health_tls, f"127.0.0.1:{inst.port}"]
    elif inst.metrics_port:  # ingest serves no gRPC: its own HTTP health, never the image's default address
        test = ["CMD", *http_health_command(inst.metrics_port)]
    else:
        test = None
    if test:
        svc["healthcheck"] = {
            "test": test,
            "interval": "15s",
            # A probe is a new Python process: on a box (or a pilot machine) busy loading its models it took up to
            # 5 s before it asked anything (the compose test on 2 cores)
            "timeout": "10s",
            "retries": 3,
            # Loading a checkpoint and passing the canary inference takes minutes on a Pi or a cold disk.
            "start_period": "10m",
        }
    else:
        svc["healthcheck"] = {"disable": True}
    svc["mem_limit"] = compose_bytes(memory_limit_bytes(inv, inst))
    svc["mem_reservation"] = compose_bytes(memory_request_bytes(inv, inst))
    svc["cpus"] = cpu_limit(inst)
    # Under contention cores go by each role's share of the box (1024 = one core's weight).
    svc["cpu_shares"] = max(int(inst.box.role_cpus(inst.role) * 1024), 2)
    svc["logging"] = LOGGING
    deps = _depends_on(inst, local)
    if deps:
        svc["depends_on"] = {d: {"condition": "service_healthy"} for d in deps}
    svc["stop_grace_period"] = "10s"
    return svc


def _database_service(inv: Inventory, inst: Instance, publish: bool) -> dict[str, Any]:
    """PostgreSQL from the official image, as the image's user (10001) like every role, on a named volume; the
    password from a secret file; published on the box's own address for the gateways on other boxes."""
    svc: dict[str, Any] = {
        "image": database.declared(inv).image,
        "command": database.server_args(inv),
        "user": f"{USER}:{USER}",
        "restart": "unless-stopped",
        "environment": database.environment(inv),
    }
    if publish:
        svc["ports"] = [f"{_ip_or_none(inst.box.address)}:{inst.port}:{inst.port}".lstrip(":")]
    svc["volumes"] = [{"type": "volume", "source": database.VOLUME, "target": database.DATA_DIR}]
    secrets = [{"source": "postgres_password", "target": database.mounted(database.PASSWORD_FILE)}]
    if database.uses_tls(inv):
        wanted = [(src, t) for src, t in _tls_secrets(inst.box).items() if t != tls.CA_FILE]
        secrets += [{"source": src, "target": tls.mounted(target)} for src, target in wanted]
    svc["secrets"] = secrets
    svc["healthcheck"] = {
        "test": ["CMD", *database.ready_command(inv)],
        "interval": "10s",
        "timeout": "5s",
        "retries": 5,
        "start_period": "2m",
    }
    svc["mem_limit"] = compose_bytes(memory_limit_bytes(inv, inst))
    svc["mem_reservation"] = compose_bytes(memory_request_bytes(inv, inst))
    svc["cpus"] = cpu_limit(inst)
    svc["cpu_shares"] = max(int(inst.box.role_cpus(inst.role) * 1024), 2)
    svc["logging"] = LOGGING
    svc["stop_grace_period"] = "30s"  # a fast shutdown checkpoints first
    return svc


def _depends_on(inst: Instance, local: list[Instance]) -> list[str]:
    """Services in the same compose project this one needs healthy first (peers on other boxes are retried)."""
    if inst.role is Role.gateway:
        wanted = {Role.vision, Role.retrieval, Role.stage, Role.database}
    elif inst.role is Role.ingest:
        wanted = {Role.gateway}
    else:
        return []
    return [i.service for i in local if i.role in wanted and i is not inst]


def compose_project(
    inv: Inventory,
    local: list[Instance],
    publish: bool,
    client_ports: dict[str, list[int]],
    cameras: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """A compose document for `local` instances; `publish` exposes every gRPC/metrics port on the host
    (`client_ports`: ports of clients such as ingest's trigger endpoint, by service; `cameras`: each ingest
    service's camera sources, whose V4L2 devices it is given)."""
    cameras = cameras or {}
    services = {
        i.service: _service(inv, i, local, publish, client_ports.get(i.service, []), cameras.get(i.service, []))
        for i in local
    }
    doc: dict[str, Any] = {"services": services}
    if any(i.role is Role.database for i in local):
        doc["volumes"] = {database.VOLUME: {}}
    files = {n: file for n, (file, _) in SECRETS.items()}
    files |= {n: f"./{database.SECRETS_DIR}/{file}" for n, file in database.COMPOSE_SECRETS.items()}
    for box in {i.box.name: i.box for i in local}.values():
        files |= {src: f"./{tls.SECRETS_DIR}/{tls_file(box, target)}" for src, target in _tls_secrets(box).items()}
    used = {s["source"] for svc in services.values() for s in svc.get("secrets", [])}
    if used:
        doc["secrets"] = {n: {"file": files[n]} for n in sorted(used)}
    return doc


def project_env(name: str) -> str:
    """The `.env` beside a compose file: its project name. Compose v2 also reads a top-level `name:`, which
    Compose v1 (Debian's docker-compose 1.29) refuses as an invalid property; both read COMPOSE_PROJECT_NAME here."""
    return (
        "# Rendered by `edgeinspect deploy render`: the compose project's name (containers, networks, volumes).\n"
        f"COMPOSE_PROJECT_NAME={name}\n"
    )


def _tls_secrets(box: Box) -> dict[str, str]:
    """compose secret name -> file name under the TLS mount, for the certificate of `box`."""
    return {"tls_ca": tls.CA_FILE, f"tls_cert_{box.name}": tls.CERT_FILE, f"tls_key_{box.name}": tls.KEY_FILE}


def tls_file(box: Box, mounted_name: str) -> str:
    """The file under secrets/tls/ that is mounted as `mounted_name` for `box`'s services."""
    return {tls.CA_FILE: tls.CA_FILE, tls.CERT_FILE: f"{box.name}.crt", tls.KEY_FILE: f"{box.name}.key"}[mounted_name]


def _ip_or_none(address: str | None) -> str:
    """A host address compose can publish on ("" : every interface, when it is a DNS name or unset)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(address)) if address else ""
    except ValueError:
        return ""


def _published(inst: Instance, client_ports: list[int]) -> dict[int, str]:
    """port -> host address it is published on. The gateway's public API on every interface; internal gRPC ports on
    the box's address; metrics on its metrics_address (default: its address), never on 0.0.0.0 when known."""
    box = inst.box
    out: dict[int, str] = {}
    if inst.port:
        out[inst.port] = "" if inst.role is Role.gateway else _ip_or_none(box.address)
    if inst.metrics_port:
        out[inst.metrics_port] = _ip_or_none(box.metrics_address or box.address)
    for p in client_ports:  # ingest's trigger endpoint (and metrics): reached by the line at the box's address
        out.setdefault(p, _ip_or_none(box.address))
    return out


def compose_yaml(doc: dict[str, Any], header: str) -> str:
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + dump_yaml(doc)
