"""The plant inventory: every box once (address, roles, memory, speed, Hailo), plus plant-wide settings."""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgeinspect.config import CHAINED_RETIRED, WeightsDtype, WireCodec, refuse_retired
from edgeinspect.models.planner import GpuSpec
from edgeinspect.services.gateway.settings import GatewayAnomalySettings
from edgeinspect.services.outputs.config import OutputsConfig

GIB = 1024**3
# Memory a co-located role (and the OS) keeps away from a decoder stage on the same box, in GiB. Measured
# magnitudes from the design card: the vision tower is ~1.2 GB fp32 plus ONNX Runtime arenas; MiniLM + FAISS for a
# plant's specs stays under 1 GB; the gateway is a Python process with SQLite; PostgreSQL for a gateway pair's
# reports runs in its default shared_buffers (128 MB) plus backends and the page cache it leans on.
ROLE_RESERVE_GIB = {"vision": 1.5, "retrieval": 1.0, "gateway": 0.5, "ingest": 0.5, "database": 1.0}
OS_RESERVE_GIB = 1.0
# CPU cores a co-located role is guaranteed (Kubernetes requests, compose cpu_shares); a decoder stage gets what is
# left of the box. Vision on a Hailo offloads the tower and needs less.
ROLE_CPUS = {"vision": 1.0, "retrieval": 0.5, "gateway": 1.0, "ingest": 1.0, "database": 0.5}
# A Python process with torch loaded holds this much beyond its weights and KV cache.
STAGE_RUNTIME_GIB = 0.75
# What the CUDA context, cuBLAS workspaces and torch's allocator slack take of a GPU's memory (on a Jetson: of the
# box's RAM, the same pool). A planning margin, not measured on a Jetson here.
CUDA_CONTEXT_GIB = 1.0
# Roles that run on a box's GPU when it has one (device cuda); the others stay on the CPU.
GPU_ROLES = ("vision", "stage")


class Role(StrEnum):
    vision = "vision"
    stage = "stage"
    retrieval = "retrieval"
    gateway = "gateway"
    ingest = "ingest"
    database = "database"  # PostgreSQL (the official image) for the gateways' shared report store


class Arch(StrEnum):
    amd64 = "amd64"
    arm64 = "arm64"


class Box(BaseModel):
    """One edge box: where it is, what it runs, and what it can hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$", description="DNS-label name")
    address: str = Field(..., description="IP address or DNS name the other boxes reach this one at")
    roles: list[Role] = Field(..., min_length=1, description="roles this box runs")
    memory_gb: float = Field(..., gt=0, description="RAM (or unified memory on a Jetson) in GiB")
    stage_memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="memory a decoder stage may use; default: memory_gb less OS and co-located roles",
    )
    speed: float = Field(
        default=1.0, gt=0, description="relative decode speed, measured (`edgeinspect plan`) or declared"
    )
    link_gbps: float = Field(default=1.0, gt=0, description="network link speed of this box in Gbit/s")
    hailo: bool = Field(default=False, description="a Hailo-8/8L accelerator is fitted (vision runs on it)")
    arch: Arch = Field(default=Arch.amd64, description="CPU architecture: amd64 or arm64 (Raspberry Pi 5, Jetson)")
    cameras: str | None = Field(
        default=None, description="ingest boxes: cameras YAML for `edgeinspect ingest`, relative to the inventory file"
    )
    box_type: str = Field(
        default="generic",
        pattern=r"^[a-z0-9]([a-z0-9.-]{0,60}[a-z0-9])?$",
        description="Kubernetes node-selector value",
    )
    metrics_address: str | None = Field(
        default=None,
        description="address this box publishes /metrics on, for the plant's Prometheus (default: address)",
    )
    cpus: float = Field(default=4.0, gt=0, description="CPU cores of the box (Raspberry Pi 5: 4, Jetson Orin NX: 8)")
    replicas: list[str] = Field(
        default_factory=list,
        description="stage boxes that each run a copy of this box's layer range (the gateway fails over to them)",
    )
    gpu: GpuSpec | None = Field(
        default=None,
        description="an NVIDIA GPU its stage and vision run on (device cuda): memory_gb in GiB, bandwidth_gb_s; "
        "unified: true on a Jetson, whose GPU shares memory_gb with the OS",
    )

    @field_validator("roles")
    @classmethod
    def _unique_roles(cls, roles: list[Role]) -> list[Role]:
        if len(set(roles)) != len(roles):
            raise ValueError(f"a role is listed twice: {[r.value for r in roles]}")
        return roles

    def uses_gpu(self, role: Role) -> bool:
        """`role` runs on this box's GPU (vision on a Hailo box stays on the Hailo)."""
        return self.gpu is not None and role.value in GPU_ROLES and not (role is Role.vision and self.hailo)

    def reserve_gib(self, role: Role) -> float:
        """Memory kept for `role` on this box (stage: whatever the OS and the other roles leave)."""
        if role is Role.stage:
            return self.stage_budget_bytes() / GIB
        return ROLE_RESERVE_GIB[role.value]

    def role_cpus(self, role: Role) -> float:
        """CPU cores guaranteed to `role` on this box; a stage gets the rest (at least half a core)."""
        if role is not Role.stage:
            return min(ROLE_CPUS[role.value] * (0.5 if role is Role.vision and self.hailo else 1.0), self.cpus)
        others = sum(self.role_cpus(r) for r in self.roles if r is not Role.stage)
        return max(self.cpus - others, 0.5)

    def stage_budget_bytes(self) -> int:
        """Bytes the decoder stage on this box may hold."""
        if self.stage_memory_gb is not None:
            return int(self.stage_memory_gb * GIB)
        reserve = OS_RESERVE_GIB + sum(ROLE_RESERVE_GIB.get(r.value, 0.0) for r in self.roles)
        left = self.memory_gb - reserve
        if left <= 0:
            raise ValueError(f"box {self.name}: {self.memory_gb} GiB leaves nothing for a stage after {reserve} GiB")
        return int(left * GIB)


class Ports(BaseModel):
    """gRPC ports per role; metrics ports are the gRPC port plus metrics_offset."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gateway: int = Field(default=50051, ge=1, le=65535, description="public InspectionService port")
    vision: int = Field(default=50052, ge=1, le=65535)
    retrieval: int = Field(default=50053, ge=1, le=65535)
    stage_base: int = Field(default=50060, ge=1, le=65535, description="decoder stage k listens on stage_base + k")
    database: int = Field(default=5432, ge=1, le=65535, description="PostgreSQL, on the box with role database")
    metrics_offset: int = Field(default=1000, ge=0, description="Prometheus port = gRPC port + this (0: no metrics)")
    console: int = Field(default=8080, ge=1, le=65535, description="the web console (HTTP) beside each gateway")


class ModelSizes(BaseModel):
    """Language-model sizes for planning when no checkpoint is at hand where the render runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_layers: int = Field(default=24, gt=0)
    hidden_size: int = Field(default=2048, gt=0)
    intermediate_size: int = Field(default=5632, gt=0)
    vocab_size: int = Field(default=102400, gt=0)
    num_attention_heads: int = Field(default=16, gt=0)
    num_key_value_heads: int = Field(default=16, gt=0)
    vision_hidden_size: int = Field(default=1024, ge=0, description="vision tower width (stage 0 holds the aligner)")


class Database(BaseModel):
    """The report database the gateways share: PostgreSQL run by the renderer on the box with role `database`, or
    an external one (`external_dsn_file`). Absent, with one gateway: SQLite on the gateway's box."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    external_dsn_file: Path | None = Field(
        default=None,
        description="an external PostgreSQL: a file holding its DSN, relative to the inventory file; copied into "
        "the gateways' secrets, never into a rendered YAML (no box may then have role database)",
    )
    image: str = Field(default="postgres:16", description="the PostgreSQL image on the database box")
    storage_gb: int = Field(
        default=20, gt=0, description="Kubernetes: size of the database's PersistentVolumeClaim in GiB"
    )
    user: str = Field(
        default="edgeinspect", pattern=r"^[a-z_][a-z0-9_]{0,62}$", description="database role the gateways use"
    )
    name: str = Field(default="edgeinspect", pattern=r"^[a-z_][a-z0-9_]{0,62}$", description="database name")
    owner_lease_s: float = Field(
        default=10.0,
        ge=1.0,
        le=600.0,
        description="a gateway silent this long is gone; another takes over its inspections",
    )


class Plant(BaseModel):
    """Plant-wide settings: what every box shares."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
    image: str = Field(default="edgeinspect:0.1.0", description="container image every role runs")
    hailo_image: str = Field(
        default="edgeinspect:0.1.0-hailo", description="image built with --build-arg HAILO=1, for vision on Hailo boxes"
    )
    gpu_image: str = Field(
        default="edgeinspect:0.1.0-gpu",
        description="image with CUDA torch (and onnxruntime-gpu) for the roles on a `gpu` box: on a Jetson built FROM "
        "an L4T PyTorch base (compose/DEPLOY.md, Jetson)",
    )
    data_dir: Path = Field(
        default=Path("/var/lib/edgeinspect"),
        description="on every box (and inside the containers, same path): checkpoints/ kb/ reports/ cache/ frames/ "
        "banks/",
    )
    checkpoint: str = Field(..., description="checkpoint folder name under data_dir/checkpoints")
    vision_hef: str | None = Field(
        default=None, description="compiled Hailo HEF under data_dir/checkpoints (Hailo boxes)"
    )
    weights: WeightsDtype = Field(
        default=WeightsDtype.bf16,
        description="decoder weight format (fp32 | bf16 | int8 | int6 | int4; auto cannot be planned)",
    )
    codec: WireCodec = Field(default=WireCodec.fp16, description="tensor codec between nodes (fp32 | fp16 | int8)")
    zstd: bool = Field(default=False, description="zstd on top of the codec")
    max_new_tokens: int = Field(default=128, gt=0)
    kv_budget_mb: int = Field(default=1024, gt=0, description="KV cache each decoder stage may hold across sessions")
    api_tokens_secret: str = Field(
        default="edgeinspect-api-tokens",
        pattern=r"^[a-z0-9]([a-z0-9-]{0,60}[a-z0-9])?$",
        description="compose secret / Kubernetes Secret holding the gateway's API tokens (a JSON list)",
    )
    tls: bool = Field(
        default=True,
        description="mTLS between the roles and TLS on the public API, one certificate per box from the plant CA "
        "(`deploy render --ca DIR`); false only on a network nobody else can reach",
    )
    cert_days: int = Field(default=825, gt=0, description="validity of the box certificates `deploy render` issues")
    ports: Ports = Field(default_factory=Ports)
    database: Database | None = Field(
        default=None, description="the gateways' shared PostgreSQL; required with more than one gateway (None: SQLite)"
    )
    model: ModelSizes = Field(default_factory=ModelSizes, description="sizes for planning without a checkpoint")
    log_level: str = Field(default="INFO")
    outputs: OutputsConfig = Field(
        default_factory=OutputsConfig,
        description="where the gateway sends each result (MQTT, webhooks); passwords and secrets via "
        "EDGEINSPECT_OUTPUTS__... at start, not in this file",
    )
    anomaly: GatewayAnomalySettings = Field(
        default_factory=GatewayAnomalySettings,
        description="the anomaly gate per station, as the gateway's `anomaly` settings: `default` and `stations` "
        "(name -> policy gate | vlm | off, vlm_may_clear, vlm_when_gate_fails); unset: every station gates",
    )
    regions: dict[str, tuple[int, int, int, int]] = Field(
        default_factory=dict,
        description="part -> x, y, width, height in camera pixels: where the part sits in its station camera's "
        "frame; every vision box tiles that region when it teaches the part (the vision settings' anomaly.regions)",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_retired(cls, data: Any) -> Any:
        return refuse_retired(data, {"chained": CHAINED_RETIRED})

    @property
    def checkpoint_path(self) -> Path:
        return self.data_dir / "checkpoints" / self.checkpoint

    @property
    def kb_dir(self) -> Path:
        return self.data_dir / "kb"

    @property
    def reports_dir(self) -> Path:
        return self.data_dir / "reports"

    @property
    def frames_dir(self) -> Path:
        """Writable: frames the ingest role saved with their reports."""
        return self.data_dir / "frames"

    @property
    def banks_dir(self) -> Path:
        """Writable: the anomaly gate's banks on a vision box (one folder per part), kept across container
        recreation like the reports."""
        return self.data_dir / "banks"

    @property
    def cache_dir(self) -> Path:
        """Writable: the vision tower exported to ONNX on first start lives here."""
        return self.data_dir / "cache"


class Inventory(BaseModel):
    """A plant: its settings and its boxes. One or more gateway and vision boxes (more than one gateway needs
    plant.database), any number of retrieval boxes, at most one database box."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plant: Plant
    boxes: list[Box] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Inventory:
        names = [b.name for b in self.boxes]
        if len(set(names)) != len(names):
            raise ValueError(f"box names must be unique: {names}")
        addresses = [b.address for b in self.boxes]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"box addresses must be unique: {addresses}")
        for role, lo, hi in (("gateway", 1, None), ("vision", 1, None), ("stage", 1, None), ("database", 0, 1)):
            n = sum(1 for b in self.boxes if role in b.roles)
            if n < lo or (hi is not None and n > hi):
                want = f"exactly {lo}" if lo == hi else (f"at least {lo}" if hi is None else f"at most {hi}")
                raise ValueError(f"the inventory needs {want} box(es) with role {role}, found {n}")
        for b in self.boxes:
            if (Role.ingest in b.roles) != (b.cameras is not None):
                raise ValueError(f"box {b.name}: `cameras` is required with role ingest, and only with it")
            if Role.vision in b.roles and b.hailo and self.plant.vision_hef is None:
                raise ValueError(f"box {b.name} runs vision on Hailo: set plant.vision_hef")
        self._database_declared()
        by_name = {b.name: b for b in self.boxes}
        copied: dict[str, str] = {}
        for b in self.boxes:
            for r in b.replicas:
                if Role.stage not in b.roles:
                    raise ValueError(f"box {b.name} lists replicas but runs no decoder stage")
                if r not in by_name or Role.stage not in by_name[r].roles:
                    raise ValueError(f"box {b.name}: replica {r!r} is not a box with role stage")
                if r == b.name or by_name[r].replicas:
                    raise ValueError(f"box {b.name}: replica {r!r} must be another box that lists no replicas")
                if r in copied:
                    raise ValueError(f"box {r} is a replica of both {copied[r]} and {b.name}")
                copied[r] = b.name
        return self

    def _database_declared(self) -> None:
        """A gateway pair shares one PostgreSQL: run here (a box with role database) or external, not both."""
        db, run_here = self.plant.database, bool(self.boxes_with(Role.database))
        external = db is not None and db.external_dsn_file is not None
        if run_here and external:
            raise ValueError("plant.database.external_dsn_file and a box with role database: choose one")
        if run_here and db is None:
            raise ValueError("a box has role database: add a `database:` section to plant (`database: {}` will do)")
        if db is not None and not (run_here or external):
            raise ValueError("plant.database: give a box role database, or set external_dsn_file")
        for b in self.boxes_with(Role.database):
            if self.plant.tls and b.roles == [Role.database]:
                raise ValueError(
                    f"box {b.name}: role database alone gets no plant certificate for PostgreSQL's TLS; put it on "
                    "a box with another role (a gateway's) or set plant.tls: false"
                )
        n = len(self.boxes_with(Role.gateway))
        if n > 1 and db is None:
            raise ValueError(
                f"{n} gateways share one report store: add plant.database (a box with role database, or "
                "external_dsn_file); SQLite serves one gateway"
            )

    @property
    def shared_store(self) -> bool:
        """The gateways keep their reports in PostgreSQL (plant.database), not in SQLite on their box."""
        return self.plant.database is not None

    def boxes_with(self, role: Role) -> list[Box]:
        return [b for b in self.boxes if role in b.roles]

    def replica_boxes(self) -> set[str]:
        """Names of the boxes that run a copy of another box's layer range (not planned on their own)."""
        return {r for b in self.boxes for r in b.replicas}

    def planned_stage_boxes(self) -> list[Box]:
        """Stage boxes the planner gives a layer range each, in inventory order."""
        copies = self.replica_boxes()
        return [b for b in self.boxes_with(Role.stage) if b.name not in copies]

    def replicas_of(self, box: Box) -> list[Box]:
        by_name = {b.name: b for b in self.boxes}
        return [by_name[r] for r in box.replicas]


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def load_inventory(path: Path) -> Inventory:
    """Reads and validates an inventory YAML file."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: an inventory is a mapping with `plant` and `boxes`")
    return Inventory.model_validate(data)
