"""The gateway's settings: orchestration, the report store, frames and disk floors, the anomaly gate per station,
outputs to the line. Loaded like every role's (edgeinspect/config.py RoleSettings: YAML, then EDGEINSPECT_* env)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, Field, field_serializer, field_validator
from pydantic_settings import NoDecode

from edgeinspect.config import CHAINED_RETIRED, ApiToken, RoleSettings, TLSConfig, WireCodec
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.services.store.settings import StoreSettings


class FrameSettings(BaseModel):
    """The gateway's frame store: every inspected image kept beside its report, pruned oldest first."""

    keep: bool = Field(default=True, description="store each inspected frame (False: reports only)")
    dir: Path | None = Field(
        default=None, description="folder for frames and thumbnails (None: 'frames' beside db_path)"
    )
    max_bytes: int = Field(
        default=2 << 30, ge=0, description="frames + thumbnails beyond this are pruned, oldest first"
    )
    max_age_s: float = Field(
        default=30 * 86400.0, ge=0, description="frames older than this are pruned (0: no age limit)"
    )
    thumbnail_px: int = Field(default=256, ge=16, le=2048, description="longest side of the list thumbnails")


class DiskSettings(BaseModel):
    """Free space the gateway keeps on its disks. Below a floor it refuses new inspections (RESOURCE_EXHAUSTED with
    pushback) and keeps serving reads; frames are pruned first (services/gateway/disk.py)."""

    frames_min_free_mb: float = Field(
        default=256.0,
        ge=0,
        description="free space kept on the frames folder's disk (0: unchecked); frames expire first",
    )
    store_min_free_mb: float = Field(
        default=128.0, ge=0, description="free space kept on the SQLite store's disk (db_path's folder; 0: unchecked)"
    )
    logs_min_free_mb: float = Field(
        default=64.0,
        ge=0,
        description="free space kept on the log file's disk (log_file's folder; 0 or no log_file: unchecked)",
    )
    headroom: float = Field(
        default=0.25,
        ge=0,
        description="pruning frames for space frees up to this share of the floor beyond it, so one "
        "prune lasts more than one inspection",
    )
    pushback_s: float = Field(
        default=10.0,
        gt=0,
        description="a caller refused for disk space is told to retry after this (grpc-retry-pushback-ms)",
    )


class AnomalyPolicy(StrEnum):
    """How a station uses the anomaly gate (services/gateway/gate.py)."""

    gate = "gate"  # the gate decides good parts alone (no decoder step); flagged frames go to the VLM
    vlm = "vlm"  # every frame gets a VLM report; the gate's score is recorded beside it
    off = "off"  # no Score at all


class StationGate(BaseModel):
    """One station's use of the anomaly gate."""

    policy: AnomalyPolicy = Field(
        default=AnomalyPolicy.gate,
        description="gate | vlm | off; a part with no bank yet runs the VLM whatever this says (the report notes it)",
    )
    vlm_may_clear: bool = Field(
        default=False,
        description="the VLM may answer OK for a frame the gate flagged (said in verdict_reason); off: a flagged "
        "frame is never OK",
    )
    vlm_when_gate_fails: bool = Field(
        default=False,
        description="under gate: a Score that fails (vision unavailable, timed out) falls back to a full VLM report "
        "instead of answering UNAVAILABLE; off because a line sized for the gate cannot absorb VLM-speed reports",
    )


class GatewayAnomalySettings(BaseModel):
    """The gateway's use of the vision node's anomaly gate: a policy per station and where heatmaps go."""

    default: StationGate = Field(
        default_factory=StationGate,
        description="every station not named in `stations` (default gate: nothing changes until a part is taught)",
    )
    stations: dict[str, StationGate] = Field(default_factory=dict, description="per-station overrides, by name")
    heatmaps: bool = Field(default=True, description="store the gate's heatmap PNG beside the frame (GetReportImage)")
    score_timeout_s: float = Field(default=10.0, gt=0, description="the Score hop's share of the inspection's deadline")

    def for_station(self, station: str) -> StationGate:
        return self.stations.get(station, self.default)


def endpoints(value: str | list[str] | None) -> list[str]:
    """host:port endpoints from a list or one comma-separated string ("", None: none)."""
    items = value.split(",") if isinstance(value, str) else value or []
    return [e.strip() for e in items if e.strip()]


class GatewaySettings(RoleSettings):
    retired: ClassVar[dict[str, str | None]] = {"chained": CHAINED_RETIRED}

    checkpoint: Path = Field(..., description="checkpoint folder (tokenizer, processor, fingerprints)")
    vision: Annotated[list[str], NoDecode] = Field(
        ...,
        min_length=1,
        description="host:port of every vision replica (a list, or one string 'a:1,b:2'); each request goes to a "
        "healthy one holding our checkpoint (and, for the anomaly gate, the part's newest bank)",
    )
    stages: list[str] = Field(
        ...,
        description="host:port of every decoder-stage endpoint, any order; several may serve one layer range "
        "(replicas): each endpoint's range is learned from its handshake",
    )
    retrieval: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="host:port of every retrieval replica (a list, or one string 'a:1,b:2'; empty: no spec context)",
    )
    retrieval_index: str = Field(
        default="",
        description="the KB index every retrieval replica must serve: a version name (v000007) or fingerprint "
        "(`edgeinspect status` shows both); empty: the newest any replica serves. A replica on another is not searched",
    )
    codec: WireCodec = Field(default=WireCodec.fp16, description="tensor codec between nodes")
    zstd: bool = Field(default=False, description="zstd on top of the codec")
    prefill_chunk_tokens: int = Field(
        default=128,
        ge=0,
        description="prompt chunk size for pipelined prefill: stages work on different chunks at once (0: whole)",
    )
    prefix_cache: bool = Field(
        default=True,
        description="reuse the stages' cached system prompt + spec context instead of prefilling it per frame",
    )
    micro_batches: int = Field(
        default=0,
        ge=0,
        description="session groups a stage pass keeps apart so several stages work at once (0: one per stage; "
        "1: all sessions batch together, better where all stages share one box's memory bus)",
    )
    db_path: Path = Field(default=Path("var/reports.sqlite"), description="SQLite file every report is stored in")
    frames: FrameSettings = Field(default_factory=FrameSettings, description="frame store and its retention")
    disk: DiskSettings = Field(
        default_factory=DiskSettings, description="free-space floors of the frames, store and log disks"
    )
    store: StoreSettings = Field(
        default_factory=StoreSettings, description="the report database: SQLite at db_path, or a shared PostgreSQL"
    )
    api_tokens: list[ApiToken] = Field(
        default_factory=list, description="bearer tokens accepted on the public API (hashes; none: refuse to start)"
    )
    allow_unauthenticated: bool = Field(
        default=False, description="with no api_tokens, serve every caller as admin (loopback development only)"
    )
    token_rate_per_s: float = Field(default=20.0, gt=0, description="calls per second per token (token bucket)")
    token_burst: int = Field(default=40, ge=1, description="calls a token may make at once before the rate applies")
    client_tls: TLSConfig | None = Field(
        default=None, description="mTLS to vision, retrieval and the stages (None: plaintext)"
    )
    max_new_tokens: int = Field(
        default=256, description="generation budget per report (the report schema's lengths are sized to fit it)"
    )
    spec_chunks: int = Field(default=3, description="spec chunks put into the prompt")
    structured_output: bool = Field(
        default=True, description="constrain generation to the report JSON schema built from the part's specs"
    )
    jump_forward_tokens: int = Field(
        default=32,
        ge=0,
        le=64,
        description="grammar jump-forward (structured, greedy): tokens the schema forces after a sampled one are "
        "appended in the same decode step, at most this many per step (0: off; output is the same either way)",
    )
    upstream_timeout_s: float = Field(
        default=120.0,
        description="deadline for one inspection across all hops when the caller sets none (or a longer one)",
    )
    vision_timeout_s: float = Field(default=30.0, gt=0, description="the vision hop's share of the deadline")
    retrieval_timeout_s: float = Field(
        default=3.0,
        gt=0,
        description="the retrieval hop's share; a slower or down retrieval node gives a report without specs",
    )
    max_inflight: int = Field(
        default=0, ge=0, description="inspections running at once (0: two per batch slot of the stages' thinnest range)"
    )
    max_queued: int = Field(
        default=0, ge=0, description="inspections waiting for a slot (0: as many as run); beyond: refused"
    )
    max_failovers: int = Field(default=3, ge=0, description="stage failures one inspection survives by replay")
    stall_min_s: float = Field(
        default=2.0,
        gt=0,
        description="a decode step with no answer after max(this, stall_factor x its usual time) has stalled",
    )
    stall_factor: float = Field(default=20.0, ge=1, description="see stall_min_s")
    prefill_stall_s: float = Field(
        default=60.0, gt=0, description="a prefill with no answer after this long has stalled"
    )
    replan: bool = Field(
        default=True,
        description="when a layer range has no healthy stage, surviving stages with the memory take it over",
    )
    replan_settle_s: float = Field(
        default=10.0,
        ge=0,
        description="a returned stage must stay healthy this long before the normal plan is restored",
    )
    outputs: OutputsConfig = Field(
        default_factory=OutputsConfig, description="where each stored report goes next (MQTT, webhooks)"
    )
    anomaly: GatewayAnomalySettings = Field(
        default_factory=GatewayAnomalySettings, description="the anomaly gate per station (policy, VLM clearing)"
    )
    explain_with_evidence: bool = Field(
        default=True,
        description="a gate-flagged part's explanation shows the VLM the flagged region cut from the full-resolution "
        "frame and a good frame of the part beside the frame (False: the frame alone)",
    )

    @field_validator("vision", "retrieval", mode="before")
    @classmethod
    def _endpoints(cls, value: Any) -> Any:
        return endpoints(value) if value is None or isinstance(value, str) else value

    @field_serializer("vision", "retrieval")
    def _endpoints_text(self, value: list[str]) -> str | None:
        """Written as one 'a:1,b:2' string (None: none), so a one-endpoint config reads as it always did."""
        return ",".join(value) or None
