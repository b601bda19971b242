"""Role settings for every instance, built with the real settings classes so they load with XSettings.load."""

from __future__ import annotations

import logging
from typing import Any, TypeVar, cast

from pydantic_settings import BaseSettings

from edgeinspect.config import RoleSettings
from edgeinspect.deploy import database, tls
from edgeinspect.deploy.inventory import Inventory, Role
from edgeinspect.deploy.topology import Addressing, Instance
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.retrieval.settings import RetrievalSettings
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.services.vision.settings import VisionBackend, VisionSettings

log = logging.getLogger(__name__)

S = TypeVar("S", bound=RoleSettings)

INGEST_METRICS_PORT = 9108  # the ingest role's /metrics and HTTP health when the cameras file names none


def isolated(cls: type[S], data: dict[str, Any]) -> S:
    """Validates `data` with `cls` without reading the renderer's own EDGEINSPECT_* environment or files."""

    def only_init(settings_cls: type[BaseSettings], *sources: Any, **named: Any) -> tuple[Any, ...]:
        return (named["init_settings"] if "init_settings" in named else sources[0],)

    bound = type(cls.__name__, (cls,), {"settings_customise_sources": classmethod(only_init)})
    return cast(S, bound(**data))  # a subclass of cls made here: pyright cannot follow type()


def role_settings(inv: Inventory, inst: Instance, everyone: list[Instance], addressing: Addressing) -> RoleSettings:
    """The settings object one instance is started with. Secrets (API tokens) are left out: they come from the
    environment at start (compose secrets, Kubernetes Secrets, an env file)."""
    plant = inv.plant
    # 0.0.0.0 inside the container; the compose file publishes internal ports on the box's own address only.
    server: dict[str, Any] = {"host": "0.0.0.0", "port": inst.port}
    if inst.metrics_port:
        server["metrics_port"] = inst.metrics_port
    if plant.tls:
        server["tls"] = tls.server_tls(inst)
    common: dict[str, Any] = {"server": server, "log_level": plant.log_level}
    stages = sorted((i for i in everyone if i.stage is not None), key=lambda i: i.stage_placement.index)

    if inst.role is Role.vision:
        # the banks in the box's folder, not the container's: taught ones survive recreating the container
        data = {**common, "checkpoint": plant.checkpoint_path, "anomaly": {"banks_dir": plant.banks_dir}}
        if plant.regions:  # where each part sits in its camera's frame: a Teach tiles that region only
            data["anomaly"]["regions"] = {part: list(box) for part, box in plant.regions.items()}
        if inst.box.hailo:
            if plant.vision_hef is None:  # Inventory refuses this already
                raise ValueError(f"box {inst.box.name} runs vision on Hailo: set plant.vision_hef")
            data |= {"backend": VisionBackend.hailo, "hef_path": plant.data_dir / "checkpoints" / plant.vision_hef}
        else:
            data |= {
                "backend": VisionBackend.onnxruntime,
                "onnx_path": plant.cache_dir / f"{plant.checkpoint}-vision.onnx",
            }
        if inst.box.uses_gpu(Role.vision):
            data["device"] = "cuda"  # the torch tower there, or ONNX Runtime's TensorRT / CUDA providers
        return isolated(VisionSettings, data)
    if inst.role is Role.stage:
        st = inst.stage_placement
        data = {
            **common,
            "checkpoint": plant.checkpoint_path,
            "layer_start": st.layer_start,
            "layer_end": st.layer_end,
            "weights": plant.weights,
            "kv_budget_mb": plant.kv_budget_mb,
        }
        if inst.box.uses_gpu(Role.stage):
            data["device"] = "cuda"
        return isolated(StageSettings, data)
    if inst.role is Role.retrieval:
        return isolated(RetrievalSettings, {**common, "kb_dir": plant.kb_dir})
    if inst.role is Role.gateway:
        # every replica of vision and retrieval: the gateway sends each request to a healthy one
        peers = {r: [i.address(addressing) for i in everyone if i.role is r] for r in (Role.vision, Role.retrieval)}
        data = {
            **common,
            "checkpoint": plant.checkpoint_path,
            "vision": peers[Role.vision],
            "stages": [s.address(addressing) for s in stages],
            "codec": plant.codec,
            "zstd": plant.zstd,
            "db_path": plant.reports_dir / "reports.sqlite",
            "max_new_tokens": plant.max_new_tokens,
            # one micro-batch group per box that holds stages: stages on one box share its memory bus, and decode
            # there gains more from one bigger batch than from groups taking turns (bench/NOTES.md, perf_pipeline)
            "micro_batches": len({s.box.name for s in stages if s.stage_placement.replica == 0}),
        }
        if peers[Role.retrieval]:
            data["retrieval"] = peers[Role.retrieval]
        if inv.shared_store:
            data["store"] = database.store_settings(inv, inst, addressing)
        if plant.tls:
            data["client_tls"] = tls.client_tls()
        if plant.outputs.enabled:
            data["outputs"] = plant.outputs.model_dump(mode="json", exclude_none=True)
        if "anomaly" in plant.model_fields_set:  # the stations' gate policies, as the inventory names them
            data["anomaly"] = plant.anomaly.model_dump(mode="json", exclude_unset=True)
        return isolated(GatewaySettings, data)
    raise ValueError(f"role {inst.role} has no settings class")


def ingest_settings(
    inv: Inventory, inst: Instance, everyone: list[Instance], addressing: Addressing, cameras_yaml: str
) -> RoleSettings:
    """The plant engineer's cameras file with the gateway addresses, frames folder and log level filled in; its
    token is dropped (it comes from EDGEINSPECT_API_TOKEN at start)."""
    import yaml

    from edgeinspect.services.ingest.config import IngestSettings

    data = yaml.safe_load(cameras_yaml) or {}
    if not isinstance(data, dict):
        raise ValueError(f"box {inst.box.name}: the cameras file is not a mapping")
    data.pop("api_token", None)
    # every gateway of the plant: ingest holds the list, and retries a frame on another by its idempotency key
    data["gateway"] = ",".join(i.address(addressing) for i in everyone if i.role is Role.gateway)
    data["frames_dir"] = str(inv.plant.frames_dir)
    if inv.plant.tls:
        data["gateway_tls"] = tls.public_ca()
    data.setdefault("log_level", inv.plant.log_level)
    # Always a metrics port: the container's healthcheck and the Kubernetes probes ask its /v2/health/ready.
    server = data.setdefault("server", {})
    if isinstance(server, dict):
        server.setdefault("host", "0.0.0.0")  # inside the container: reached through the published port
        if not server.get("metrics_port"):
            server["metrics_port"] = INGEST_METRICS_PORT
    # Keep the pipeline full: with S decoder stages, at least S inspections must be in flight or stages idle
    # while another works; two per stage leave each stage a queued step while its last one crosses the wire.
    n_stages = sum(1 for i in everyone if i.role is Role.stage)
    data.setdefault("max_in_flight", max(IngestSettings.model_fields["max_in_flight"].default, 2 * n_stages))
    if data["max_in_flight"] < n_stages:
        log.warning(
            "box %s: max_in_flight %s is below the %d decoder stages: some stages will idle",
            inst.box.name,
            data["max_in_flight"],
            n_stages,
        )
    # The line's journal and outboxes live beside the saved frames: the ingest role's one writable volume.
    line_dir = inv.plant.frames_dir / "line"
    if isinstance(data.get("opcua"), dict):
        data["opcua"].setdefault("journal", str(line_dir / "cycles.sqlite"))
    if isinstance(data.get("outputs"), dict):
        data["outputs"].setdefault("outbox_dir", str(line_dir / "outbox"))
    return isolated(IngestSettings, data)


def settings_yaml(settings: RoleSettings, header: str) -> str:
    """YAML of the fields the renderer set (defaults stay defaults), under a comment header."""
    import yaml

    from edgeinspect.deploy.compose import PlainDumper

    data = settings.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.dump(data, Dumper=PlainDumper, sort_keys=False)
