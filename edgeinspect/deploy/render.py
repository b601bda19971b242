"""Inventory -> every file a plant needs: per-box compose + settings, an all-in-one compose, a kustomize base.

`render` is pure (inventory and plan in, {relative path: text} out) so the committed examples can be compared
with a fresh rendering; `write` puts the files on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from edgeinspect.certs import Issued
from edgeinspect.config import RoleSettings
from edgeinspect.deploy import compose, console, dashboard, database, k8s, tls, tokens
from edgeinspect.deploy.inventory import Inventory, Role
from edgeinspect.deploy.settings import ingest_settings, role_settings, settings_yaml
from edgeinspect.deploy.topology import Addressing, Instance, StagePlacement, instances
from edgeinspect.services.gateway.settings import GatewaySettings

ALL_IN_ONE = "all-in-one"
K8S = "k8s"


class Target(StrEnum):
    compose = "compose"
    k8s = "k8s"
    all = "all"


@dataclass(frozen=True)
class Rendering:
    files: dict[str, str | bytes]  # relative path -> text (or the bytes of a copied file: a background picture)
    instances: list[Instance]


def referenced_files(cameras_yaml: str, base: Path) -> dict[str, bytes]:
    """{name: bytes} of every file a cameras file names relative to its folder (empty-station backgrounds), read
    from `base`; a missing one is an error naming it, not a camera that silently gates on nothing."""
    import yaml

    data = yaml.safe_load(cameras_yaml) or {}
    out: dict[str, bytes] = {}
    for cam in data.get("cameras") or []:
        background = ((cam.get("sampling") or {}).get("gating") or {}).get("background")
        if background and not Path(background).is_absolute():
            path = base / background
            if not path.is_file():
                raise FileNotFoundError(f"camera {cam.get('id')}: background picture {path} does not exist")
            out[str(background)] = path.read_bytes()
    return out


def _camera_sources(settings: dict[str, RoleSettings]) -> dict[str, list[str]]:
    from edgeinspect.services.ingest.config import IngestSettings

    return {n: [c.source for c in s.cameras] for n, s in settings.items() if isinstance(s, IngestSettings)}


def _with_ingest_metrics(inv: Inventory, insts: list[Instance], cameras: dict[str, str]) -> list[Instance]:
    """Ingest binds no gRPC port, but its metrics port (the cameras file's, or the default) carries its health."""
    out = []
    for inst in insts:
        if inst.role is Role.ingest:
            s = ingest_settings(inv, inst, insts, Addressing.service, cameras[inst.box.name])
            inst = replace(inst, metrics_port=s.server.metrics_port)
        out.append(inst)
    return out


def _header(inv: Inventory, what: str) -> str:
    return (
        f"{what} for plant {inv.plant.name}.\n"
        "Rendered by `edgeinspect deploy render` from the plant inventory: edit the inventory and re-render,\n"
        "not this file. Secrets (API tokens, TLS keys) are not in here: see compose/DEPLOY.md."
    )


def _plan_lines(insts: list[Instance]) -> str:
    return "\n".join(
        f"{i.service}: layers [{i.stage.layer_start}, {i.stage.layer_end}) on {i.box.name}"
        for i in insts
        if i.stage is not None
    )


def _settings(
    inv: Inventory, local: list[Instance], everyone: list[Instance], addressing: Addressing, cameras: dict[str, str]
) -> dict[str, RoleSettings]:
    """{service: settings} for every instance in `local`; peers (any of `everyone`) named by `addressing`."""
    out = {}
    for inst in local:
        if inst.role is Role.database:  # PostgreSQL: the official image's environment, no settings file of ours
            continue
        if inst.role is Role.ingest:
            out[inst.service] = ingest_settings(inv, inst, everyone, addressing, cameras[inst.box.name])
        else:
            out[inst.service] = role_settings(inv, inst, everyone, addressing)
    return out


def _settings_files(inv: Inventory, local: list[Instance], settings: dict[str, RoleSettings]) -> dict[str, str]:
    return {
        compose.config_file(i): settings_yaml(
            settings[i.service], _header(inv, f"{i.service} settings on {i.box.name}")
        )
        for i in local
        if i.service in settings
    }


def _client_ports(settings: dict[str, RoleSettings]) -> dict[str, list[int]]:
    """Ports clients listen on themselves (ingest: trigger endpoint, OPC UA server, metrics), to publish."""
    out = {}
    for service, named in _line_ports(settings).items():
        by_name = dict(named)
        ports = [by_name.get("trigger"), settings[service].server.metrics_port, by_name.get("opcua")]
        out[service] = [p for p in ports if p]
    return out


def _line_ports(settings: dict[str, RoleSettings]) -> dict[str, list[tuple[str, int]]]:
    """Named ports an ingest instance serves the line on (the HTTP trigger, the OPC UA server), by service."""
    out: dict[str, list[tuple[str, int]]] = {}
    for service, s in settings.items():
        trigger, opcua = getattr(s, "trigger", None), getattr(s, "opcua", None)
        named = [("trigger", trigger.port if trigger is not None else 0), ("opcua", opcua.port if opcua else 0)]
        if service.startswith("ingest-"):
            out[service] = [(name, port) for name, port in named if port]
    return out


def _compose_files(
    inv: Inventory, insts: list[Instance], plan: str, cameras: dict[str, str], assets: dict[str, dict[str, bytes]]
) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {}
    for box in inv.boxes:
        local = [i for i in insts if i.box.name == box.name]
        settings = _settings(inv, local, insts, Addressing.box, cameras)
        name = f"edgeinspect-{inv.plant.name}-{box.name}"
        doc = compose.compose_project(
            inv, local, publish=True, client_ports=_client_ports(settings), cameras=_camera_sources(settings)
        )
        files[f"{box.name}/.env"] = compose.project_env(name)
        head = _header(inv, f"Compose file for box {box.name} ({box.address})") + "\n" + plan
        if Role.gateway in box.roles:
            files |= _with_console(inv, doc, box.name, local, insts, Addressing.box)
        if Role.gateway in box.roles:  # the plant's Prometheus and Grafana beside the gateway, on request
            targets = {i.service: f"{i.box.metrics_address or i.box.address}:{i.metrics_port}" for i in insts}
            files |= _observability(doc, box.name, targets, compose._ip_or_none(box.address))
        files[f"{box.name}/compose.yaml"] = compose.compose_yaml(doc, head)
        for name, text in _settings_files(inv, local, settings).items():
            files[f"{box.name}/config/{name}"] = text
        if box.cameras is not None:
            files |= {f"{box.name}/config/{n}": data for n, data in assets.get(box.name, {}).items()}
    # The all-in-one keeps the plan's layer ranges and codec, so a pilot on one machine behaves as the plant does;
    # its vision runs on the CPU (ONNX Runtime): the machine a pilot runs on rarely has the Hailo box's accelerator.
    insts = [replace(i, box=i.box.model_copy(update={"hailo": False})) for i in insts]
    settings = _settings(inv, insts, insts, Addressing.service, cameras)
    # every stage on one machine: one memory bus, so sessions batch as one micro-batch group
    settings = {
        n: s.model_copy(update={"micro_batches": 1}) if isinstance(s, GatewaySettings) else s
        for n, s in settings.items()
    }
    doc = compose.compose_project(inv, insts, publish=False, client_ports={}, cameras=_camera_sources(settings))
    files[f"{ALL_IN_ONE}/.env"] = compose.project_env(f"edgeinspect-{inv.plant.name}")
    head = _header(inv, "All-in-one compose file (every role on one machine)") + "\n" + plan
    files |= _with_console(inv, doc, ALL_IN_ONE, insts, insts, Addressing.service)
    targets = {i.service: f"{i.service}:{i.metrics_port}" for i in insts}
    files |= _observability(doc, ALL_IN_ONE, targets, "127.0.0.1")
    files[f"{ALL_IN_ONE}/compose.yaml"] = compose.compose_yaml(doc, head)
    for name, text in _settings_files(inv, insts, settings).items():
        files[f"{ALL_IN_ONE}/config/{name}"] = text
    for box_assets in assets.values():
        files |= {f"{ALL_IN_ONE}/config/{n}": data for n, data in box_assets.items()}
    return files


def _with_console(
    inv: Inventory, doc: dict, folder: str, local: list[Instance], everyone: list[Instance], addressing: Addressing
) -> dict[str, str | bytes]:
    """Adds the web console beside the gateway(s) of a compose document; returns its settings file."""
    doc["services"][console.SERVICE] = console.console_service(inv, local)
    cfg = console.console_settings(inv, everyone, addressing)
    text = settings_yaml(cfg, _header(inv, f"console settings ({folder})"))
    return {f"{folder}/config/{console.CONFIG}": text}


def _observability(doc: dict, folder: str, targets: dict[str, str], publish_host: str) -> dict[str, str | bytes]:
    """Adds the `observability` profile (Prometheus scraping `targets`, Grafana with the dashboard) to a compose
    document; returns the files it mounts."""
    doc["services"] |= dashboard.compose_services(publish_host)
    doc["volumes"] = {**doc.get("volumes", {}), "prometheus-data": {}, "grafana-data": {}}
    root = f"{folder}/{dashboard.FOLDER}"
    scraped = {n: a for n, a in targets.items() if not a.endswith(":None")}
    files: dict[str, str | bytes] = {
        f"{root}/prometheus.yml": compose.dump_yaml(dashboard.prometheus_config(scraped)),
        f"{root}/grafana/dashboards/edgeinspect.json": dashboard.dashboard_json(),
    }
    for rel, obj in dashboard.grafana_provisioning().items():
        files[f"{root}/grafana/{rel}"] = compose.dump_yaml(obj)
    return files


def _k8s_files(
    inv: Inventory, insts: list[Instance], plan: str, cameras: dict[str, str], assets: dict[str, dict[str, bytes]]
) -> dict[str, str | bytes]:
    head = "".join(f"# {line}\n" for line in (_header(inv, "Kubernetes (k3s) manifests") + "\n" + plan).splitlines())
    settings = _settings(inv, insts, insts, Addressing.service, cameras)
    configs: dict[str, str | bytes] = dict(_settings_files(inv, insts, settings))
    sources = _camera_sources(settings)
    line_ports = _line_ports(settings)
    for box_assets in assets.values():
        configs |= box_assets
    # The web console beside the gateway, as in the compose files.
    cfg = console.console_settings(inv, insts, Addressing.service)
    configs[console.CONFIG] = settings_yaml(cfg, _header(inv, "console settings (Kubernetes)"))
    docs = {"namespace.yaml": [k8s.namespace(inv)], f"{console.SERVICE}.yaml": console.k8s_objects(inv, insts)}
    for inst in insts:
        if inst.role is Role.database:
            docs[f"{inst.service}.yaml"] = [k8s.statefulset(inv, inst), k8s.headless_service(inv, inst)]
            continue
        objs = [k8s.deployment(inv, inst, sources.get(inst.service), line_ports.get(inst.service))]
        if inst.port:
            objs.append(k8s.service(inv, inst))
        docs[f"{inst.service}.yaml"] = objs
    files: dict[str, str | bytes] = {
        f"{K8S}/{name}": head + "---\n".join(compose.dump_yaml(o) for o in objs) for name, objs in docs.items()
    }
    # The settings are files kustomize turns into a ConfigMap named after their hash: a changed file is a new
    # ConfigMap name in every Deployment, so the pods roll.
    files |= {f"{K8S}/{k8s.CONFIG_FOLDER}/{name}": data for name, data in configs.items()}
    kust = k8s.kustomization(inv, list(docs), sorted(configs))
    files[f"{K8S}/kustomization.yaml"] = head + compose.dump_yaml(kust)
    return files


def render(
    inv: Inventory,
    stages: list[StagePlacement],
    target: Target,
    cameras: dict[str, str],
    assets: dict[str, dict[str, bytes]] | None = None,
) -> Rendering:
    """Every file for `target`; `cameras` maps each ingest box to its cameras YAML text, `assets` to the files
    it names ({name: bytes}, from `referenced_files`), which are copied beside the settings."""
    assets = assets or {}
    insts = _with_ingest_metrics(inv, instances(inv, stages), cameras)
    plan = "Partition plan:\n" + _plan_lines(insts)
    files: dict[str, str | bytes] = {}
    if target in (Target.compose, Target.all):
        files |= _compose_files(inv, insts, plan, cameras, assets)
    if target in (Target.k8s, Target.all):
        files |= _k8s_files(inv, insts, plan, cameras, assets)
    return Rendering(files=dict(sorted(files.items())), instances=insts)


def write(rendering: Rendering, out: Path) -> list[Path]:
    """Writes every rendered file under `out`, role settings owner-only (0600); returns the paths written."""
    import os

    written = []
    for rel, text in rendering.files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o600 if "/config/" in f"/{rel}" else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
        os.chmod(path, mode)
        written.append(path)
    return written


def write_certs(inv: Inventory, rendering: Rendering, out: Path, ca: Issued) -> list[Path]:
    """Issues one certificate per box and writes it where each rendered folder mounts it from: a box folder gets
    its own, all-in-one/ and k8s/ every box's. Keys are 0600 secret files, never in a YAML."""
    issued = tls.issue(inv, rendering.instances, ca, inv.plant.cert_days)
    folders = {rel.split("/", 1)[0] for rel in rendering.files}
    written = []
    for folder in sorted(folders):
        mine = issued if folder in (ALL_IN_ONE, K8S) else {folder: issued[folder]}
        written += tls.write(out / folder, ca.cert, mine)
    return written


def write_store_secrets(inv: Inventory, rendering: Rendering, out: Path, inventory_dir: Path) -> list[Path]:
    """The shared report store's secret files (0600) where each rendered folder mounts them: the DSN for the
    gateways, the password for PostgreSQL (made once, kept on re-render), or the external DSN file's copy."""
    folders = {rel.split("/", 1)[0] for rel in rendering.files}
    files = database.secret_files(inv, rendering.instances, folders, {ALL_IN_ONE, K8S}, inventory_dir, out)
    return [database.write_secret(out / rel, text) for rel, text in files.items()]


def write_token_secrets(inv: Inventory, rendering: Rendering, out: Path) -> list[Path]:
    """The API tokens (0600, made once, kept on re-render): out/secrets/admin_token and ingest_token for the operator,
    the hashes in each gateway folder's secrets/api_tokens.json, the ingest token where ingest runs, k8s/secrets.env."""
    folders = {rel.split("/", 1)[0] for rel in rendering.files}
    files = tokens.secret_files(inv, folders, {ALL_IN_ONE, K8S}, out)
    return [database.write_secret(out / rel, text) for rel, text in files.items()]
