"""Compose files: one per box (peers reached at box addresses), and an all-in-one for a single machine."""

from __future__ import annotations

from typing import Any

from edgeinspect.services.deploy.inventory import Box, Inventory, Role
from edgeinspect.services.deploy.topology import Instance

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


def config_file(inst: Instance) -> str:
    """The instance's settings file (ingest: the plant engineer's cameras file, completed by the renderer)."""
    return f"{inst.service}.yaml"


def image_for(inv: Inventory, box: Box, role: Role) -> str:
    return inv.plant.hailo_image if box.hailo and role is Role.vision else inv.plant.image


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
    if inst.role is Role.retrieval:
        vols.append(_bind(str(plant.kb_dir), str(plant.kb_dir), True))
    if inst.role is Role.gateway:
        vols.append(_bind(str(plant.reports_dir), str(plant.reports_dir), False))
    if inst.role is Role.ingest:
        vols.append(_bind(str(plant.frames_dir), str(plant.frames_dir), False))
    return vols


def _service(
    inv: Inventory, inst: Instance, local: list[Instance], publish: bool, client_ports: list[int]
) -> dict[str, Any]:
    if inst.role is Role.ingest:
        command = ["ingest", "--config", f"{CONFIG_DIR}/{config_file(inst)}"]
    else:
        command = ["serve", inst.role.value, "--config", f"{CONFIG_DIR}/{config_file(inst)}"]
    svc: dict[str, Any] = {
        "image": image_for(inv, inst.box, inst.role),
        "command": command,
        "restart": "unless-stopped",
        "init": True,
        "environment": {"HF_HUB_OFFLINE": "1"},
    }
    ports = [p for p in (inst.port, inst.metrics_port, *client_ports) if p]
    if ports and (publish or inst.role is Role.gateway):
        svc["ports"] = [f"{p}:{p}" for p in ports]
    svc["volumes"] = _volumes(inv, inst)
    if inst.role in SECRET_OF_ROLE:
        name = SECRET_OF_ROLE[inst.role]
        svc["secrets"] = [{"source": name, "target": SECRETS[name][1]}]
    if inst.role is Role.vision and inst.box.hailo:
        svc["devices"] = [f"{HAILO_DEVICE}:{HAILO_DEVICE}"]
    if inst.port:
        svc["healthcheck"] = {
            "test": ["CMD", "edgeinspect", "healthcheck", f"127.0.0.1:{inst.port}"],
            "interval": "15s",
            "timeout": "5s",
            "retries": 3,
            # Loading a checkpoint and passing the canary inference takes minutes on a Pi or a cold disk.
            "start_period": "10m",
        }
    deps = _depends_on(inst, local)
    if deps:
        svc["depends_on"] = {d: {"condition": "service_healthy"} for d in deps}
    svc["stop_grace_period"] = "10s"
    return svc


def _depends_on(inst: Instance, local: list[Instance]) -> list[str]:
    """Services in the same compose project this one needs healthy first (peers on other boxes are retried)."""
    if inst.role is Role.gateway:
        wanted = {Role.vision, Role.retrieval, Role.stage}
    elif inst.role is Role.ingest:
        wanted = {Role.gateway}
    else:
        return []
    return [i.service for i in local if i.role in wanted and i is not inst]


def compose_project(
    inv: Inventory, name: str, local: list[Instance], publish: bool, client_ports: dict[str, list[int]]
) -> dict[str, Any]:
    """A compose document for `local` instances; `publish` exposes every gRPC/metrics port on the host
    (`client_ports`: ports of clients such as ingest's trigger endpoint, by service)."""
    services = {i.service: _service(inv, i, local, publish, client_ports.get(i.service, [])) for i in local}
    doc: dict[str, Any] = {"name": name, "services": services}
    used = [SECRET_OF_ROLE[i.role] for i in local if i.role in SECRET_OF_ROLE]
    if used:
        doc["secrets"] = {n: {"file": SECRETS[n][0]} for n in sorted(set(used))}
    return doc


def compose_yaml(doc: dict[str, Any], header: str) -> str:
    import yaml

    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump(doc, sort_keys=False, width=110)
