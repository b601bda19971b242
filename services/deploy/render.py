"""Inventory -> every file a plant needs: per-box compose + settings, an all-in-one compose, a kustomize base.

`render` is pure (inventory and plan in, {relative path: text} out) so the committed examples can be compared
with a fresh rendering; `write` puts the files on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from edgeinspect.certs import Issued
from edgeinspect.config import GatewaySettings, RoleSettings
from edgeinspect.services.deploy import compose, k8s, tls
from edgeinspect.services.deploy.inventory import Inventory, Role
from edgeinspect.services.deploy.settings import ingest_settings, role_settings, settings_yaml
from edgeinspect.services.deploy.topology import Addressing, Instance, StagePlacement, instances

ALL_IN_ONE = "all-in-one"
K8S = "k8s"


class Target(StrEnum):
    compose = "compose"
    k8s = "k8s"
    all = "all"


@dataclass(frozen=True)
class Rendering:
    files: dict[str, str]  # relative path -> text
    instances: list[Instance]


def _header(inv: Inventory, what: str) -> str:
    return (
        f"{what} for plant {inv.plant.name}.\n"
        "Rendered by `edgeinspect deploy render` from the plant inventory: edit the inventory and re-render,\n"
        "not this file. Secrets (API tokens, TLS keys) are not in here: see compose/DEPLOY.md."
    )


def _plan_lines(stages: list[StagePlacement]) -> str:
    return "\n".join(f"stage-{s.index}: layers [{s.layer_start}, {s.layer_end}) on {s.box.name}" for s in stages)


def _settings(
    inv: Inventory, local: list[Instance], everyone: list[Instance], addressing: Addressing, cameras: dict[str, str]
) -> dict[str, RoleSettings]:
    """{service: settings} for every instance in `local`; peers (any of `everyone`) named by `addressing`."""
    out = {}
    for inst in local:
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
    }


def _client_ports(settings: dict[str, RoleSettings]) -> dict[str, list[int]]:
    """Ports clients listen on themselves (ingest: trigger endpoint, OPC UA server, metrics), to publish."""
    out = {}
    for service, s in settings.items():
        trigger, opcua = getattr(s, "trigger", None), getattr(s, "opcua", None)
        ports = [trigger.port if trigger is not None else None, s.server.metrics_port]
        ports.append(opcua.port if opcua is not None else None)
        if service.startswith("ingest-"):
            out[service] = [p for p in ports if p]
    return out


def _compose_files(inv: Inventory, insts: list[Instance], plan: str, cameras: dict[str, str]) -> dict[str, str]:
    files: dict[str, str] = {}
    for box in inv.boxes:
        local = [i for i in insts if i.box.name == box.name]
        settings = _settings(inv, local, insts, Addressing.box, cameras)
        name = f"edgeinspect-{inv.plant.name}-{box.name}"
        doc = compose.compose_project(inv, name, local, publish=True, client_ports=_client_ports(settings))
        head = _header(inv, f"Compose file for box {box.name} ({box.address})") + "\n" + plan
        files[f"{box.name}/compose.yaml"] = compose.compose_yaml(doc, head)
        for name, text in _settings_files(inv, local, settings).items():
            files[f"{box.name}/config/{name}"] = text
    # The all-in-one keeps the plan's layer ranges and codec, so a pilot on one machine behaves as the plant does;
    # its vision runs on the CPU (ONNX Runtime): the machine a pilot runs on rarely has the Hailo box's accelerator.
    insts = [replace(i, box=i.box.model_copy(update={"hailo": False})) for i in insts]
    settings = _settings(inv, insts, insts, Addressing.service, cameras)
    # every stage on one machine: one memory bus, so sessions batch as one micro-batch group
    settings = {
        n: s.model_copy(update={"micro_batches": 1}) if isinstance(s, GatewaySettings) else s
        for n, s in settings.items()
    }
    doc = compose.compose_project(inv, f"edgeinspect-{inv.plant.name}", insts, publish=False, client_ports={})
    head = _header(inv, "All-in-one compose file (every role on one machine)") + "\n" + plan
    files[f"{ALL_IN_ONE}/compose.yaml"] = compose.compose_yaml(doc, head)
    for name, text in _settings_files(inv, insts, settings).items():
        files[f"{ALL_IN_ONE}/config/{name}"] = text
    return files


def _k8s_files(inv: Inventory, insts: list[Instance], plan: str, cameras: dict[str, str]) -> dict[str, str]:
    import yaml

    head = "".join(f"# {line}\n" for line in (_header(inv, "Kubernetes (k3s) manifests") + "\n" + plan).splitlines())
    configs = _settings_files(inv, insts, _settings(inv, insts, insts, Addressing.service, cameras))
    docs = {"namespace.yaml": [k8s.namespace(inv)], "configmap.yaml": [k8s.configmap(inv, configs)]}
    for inst in insts:
        objs = [k8s.deployment(inv, inst)]
        if inst.port:
            objs.append(k8s.service(inv, inst))
        docs[f"{inst.service}.yaml"] = objs
    files = {
        f"{K8S}/{name}": head + "---\n".join(yaml.safe_dump(o, sort_keys=False, width=110) for o in objs)
        for name, objs in docs.items()
    }
    kust = k8s.kustomization(inv, list(docs))
    files[f"{K8S}/kustomization.yaml"] = head + yaml.safe_dump(kust, sort_keys=False, width=110)
    return files


def render(inv: Inventory, stages: list[StagePlacement], target: Target, cameras: dict[str, str]) -> Rendering:
    """Every file for `target`; `cameras` maps each ingest box to its cameras YAML text."""
    insts = instances(inv, stages)
    plan = "Partition plan:\n" + _plan_lines(stages)
    files: dict[str, str] = {}
    if target in (Target.compose, Target.all):
        files |= _compose_files(inv, insts, plan, cameras)
    if target in (Target.k8s, Target.all):
        files |= _k8s_files(inv, insts, plan, cameras)
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
        with os.fdopen(fd, "w") as f:
            f.write(text)
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
