"""Where every role of a plant listens: the one place addresses and ports are decided."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from edgeinspect.deploy.inventory import Box, Inventory, Role

DATABASE_SERVICE = "postgres"  # compose service, StatefulSet and headless Service of the plant's PostgreSQL


class Addressing(StrEnum):
    """How peers name each other: box addresses (one compose per box, bare metal), compose service names
    (all-in-one), or Kubernetes Service names."""

    box = "box"
    service = "service"


@dataclass(frozen=True)
class StagePlacement:
    """Decoder stage `index` serves layers [layer_start, layer_end) on `box`."""

    index: int
    box: Box
    layer_start: int
    layer_end: int
    weight_bytes: int = 0  # planned weights of the range (sizes the stage's memory request)
    replica: int = 0  # 0: the planned box; k > 0: the k-th box of its `replicas`


@dataclass(frozen=True)
class Instance:
    """One role process: its service name, the box it runs on, and the gRPC port it binds."""

    service: str
    role: Role
    box: Box
    port: int
    metrics_port: int | None
    stage: StagePlacement | None = None

    @property
    def stage_placement(self) -> StagePlacement:
        """`stage` of a decoder stage instance (every one has it; other roles have none)."""
        if self.stage is None:
            raise ValueError(f"{self.service} is a {self.role} instance, not a decoder stage")
        return self.stage

    def address(self, addressing: Addressing) -> str:
        host = self.box.address if addressing is Addressing.box else self.service
        return f"{host}:{self.port}"


def instances(inv: Inventory, stages: list[StagePlacement]) -> list[Instance]:
    """Every role process of the plant, in a stable order: gateways, vision, retrieval, database, stages, ingest."""
    ports = inv.plant.ports

    def metrics(port: int) -> int | None:
        return port + ports.metrics_offset if ports.metrics_offset else None

    out = []
    for role, port in ((Role.gateway, ports.gateway), (Role.vision, ports.vision), (Role.retrieval, ports.retrieval)):
        boxes = inv.boxes_with(role)
        # One of a role keeps its bare name (as every single-gateway plant always had); several are named by box,
        # which is also what a gateway of a pair calls itself in the shared store: stable across its restarts.
        for box in boxes:
            name = role.value if len(boxes) == 1 else f"{role.value}-{box.name}"
            out.append(Instance(name, role, box, port, metrics(port)))
    for box in inv.boxes_with(Role.database):  # PostgreSQL: no metrics port of ours
        out.append(Instance(DATABASE_SERVICE, Role.database, box, ports.database, None))
    for st in stages:
        port = ports.stage_base + st.index
        out.append(Instance(f"stage-{st.index}", Role.stage, st.box, port, metrics(port), st))
        # Replicas serve the same range on their own box, same port: the gateway learns each one's range from
        # its handshake and fails over between them.
        for k, copy in enumerate(inv.replicas_of(st.box), start=1):
            placed = replace(st, box=copy, replica=k)
            out.append(Instance(f"stage-{st.index}-r{k}", Role.stage, copy, port, metrics(port), placed))
    # Ingest is a client of the gateway: it binds nothing.
    for box in inv.boxes_with(Role.ingest):
        out.append(Instance(f"ingest-{box.name}", Role.ingest, box, 0, None))
    _check_ports(out)
    return out


def _check_ports(insts: list[Instance]) -> None:
    used: dict[tuple[str, int], str] = {}
    for inst in insts:
        for port in (inst.port, inst.metrics_port):
            if not port:
                continue
            key = (inst.box.name, port)
            if key in used:
                raise ValueError(f"port {port} on box {inst.box.name} is used by {used[key]} and {inst.service}")
            used[key] = inst.service
