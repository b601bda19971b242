"""The floor of every role's settings: RoleSettings (YAML file, overridden by EDGEINSPECT_* environment variables),
the server, TLS and tracing blocks, the wire codecs and weight formats, the public API's tokens. Each role's own
settings class lives beside it (services/<role>/settings.py); its serve(cfg) takes exactly one of them, and
`edgeinspect serve ROLE --config FILE` loads it.

Precedence (highest first): explicit keyword arguments, environment, the YAML file, defaults. Nested fields use
`__` in the environment: EDGEINSPECT_SERVER__PORT=50061.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

CHAINED_RETIRED = "chained mode was retired: stages are driven by the gateway"


def refuse_retired(data: Any, retired: Mapping[str, str | None], env_prefix: str | None = None) -> Any:
    """Stops a load whose `data` (or, given `env_prefix`, environment) still asks for a retired setting (`retired`:
    name -> why it went), saying what to do: a file would otherwise get pydantic's bare "extra inputs are not
    permitted", and an environment variable nothing at all (unknown ones are ignored). A retired key that asks for
    nothing (`chained: false`, `next_stage: null`, as older rendered configs hold) is dropped: an upgrade reads them.
    A `why` of None marks a leftover that is harmless whatever it says: always dropped. Returns `data` without those
    keys."""
    environ = {k.upper(): v for k, v in os.environ.items()}
    for key, why in retired.items():
        if isinstance(data, Mapping) and key in data:
            if why is None or data[key] in (None, False, "", "false", "False", "0", 0):
                data = {k: v for k, v in data.items() if k != key}
            else:
                raise ValueError(f"{why}; remove `{key}`")
        var = f"{env_prefix}{key}".upper() if env_prefix is not None else ""
        if why and var in environ and environ[var].strip().lower() not in ("", "false", "0", "null", "none"):
            raise ValueError(f"{why}; remove {var} from the environment")
    return data


class WeightsDtype(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"  # decoder stages: int8 weights with per-channel scales (models/quant.py)
    int4 = "int4"  # decoder stages: q4_0-grid int4 weights for decode, int8 for prompts (models/int4.py)
    int6 = "int6"  # decoder stages: q6-grid 6-bit weights for decode (0.81 of int8's bytes), int8 for prompts
    # decoder stages: the fastest format measured on this CPU at start-up among those within the accuracy bound
    # (models/autoformat.py; cached per CPU and checkpoint)
    auto = "auto"


class WireCodec(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"


class TLSConfig(BaseModel):
    """Certificate files of one end of a TLS connection (PEM; `edgeinspect certs` makes them)."""

    cert: Path | None = Field(
        default=None, description="this process's certificate (server: presented to callers; client: to servers)"
    )
    key: Path | None = Field(default=None, description="its private key (keep it 0600, mounted as a secret)")
    ca: Path | None = Field(
        default=None,
        description="CA that signs the peers (server: client certificates; client: the server's); None: system",
    )
    require_client_auth: bool = Field(
        default=True,
        description="servers: only callers with a certificate from `ca` (False: the public API, tokens instead)",
    )
    allowed_roles: list[str] | None = Field(
        default=None,
        description="servers: caller roles admitted (None: the role's callers, services/common/tls.py CALLERS)",
    )


class ServerConfig(BaseModel):
    host: str = Field(default="127.0.0.1", description="address to bind; 0.0.0.0 on a box that serves others")
    port: int = Field(default=0, description="gRPC port; 0 picks a free one (tests)")
    metrics_port: int | None = Field(default=None, description="Prometheus /metrics port; None disables it")
    metrics_host: str | None = Field(
        default=None, description="address /metrics binds (None: `host`); the box's internal address in a plant"
    )
    grace_s: float = Field(default=5.0, description="seconds in-flight calls get on shutdown")
    max_message_mb: int = Field(default=64, description="largest gRPC message accepted or sent")
    port_file: Path | None = Field(default=None, description="write the bound port here once serving (port 0)")
    tls: TLSConfig | None = Field(default=None, description="serve over TLS (None: plaintext, loopback only)")


class TraceExporter(StrEnum):
    none = "none"
    otlp = "otlp"  # a collector over OTLP/gRPC
    jsonl = "jsonl"  # one span per line in a file: a box without a collector


class TracingConfig(BaseModel):
    """OpenTelemetry traces of one role (services/common/tracing.py); off unless an exporter is named."""

    exporter: TraceExporter = Field(default=TraceExporter.none, description="none | otlp | jsonl")
    endpoint: str = Field(
        default="http://127.0.0.1:4317", description="otlp: the collector's OTLP/gRPC address (https://...: TLS)"
    )
    jsonl_path: Path = Field(
        default=Path("var/traces/{role}.jsonl"),
        description="jsonl: spans are appended here, one per line ({role} and {pid} are filled in)",
    )
    sample_rate: float = Field(
        default=1.0, ge=0, le=1, description="share of new traces recorded; a call joins its caller's decision"
    )
    decode_every: int = Field(
        default=8, ge=1, description="trace every Nth decode step of a session (prefill: every chunk)"
    )


class RoleSettings(BaseSettings):
    """Base for every role's settings: YAML file + environment."""

    model_config = SettingsConfigDict(env_prefix="EDGEINSPECT_", env_nested_delimiter="__", extra="forbid")
    retired: ClassVar[dict[str, str | None]] = {}  # settings the role no longer has: name -> why (refuse_retired)

    server: ServerConfig = Field(default_factory=ServerConfig)
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING, ERROR")
    log_json: bool = Field(default=True, description="JSON log lines (False: human-readable console)")
    log_file: Path | None = Field(
        default=None,
        description="write logs to this file, rotated by size (None: stderr, for journald or a container log)",
    )
    log_max_mb: float = Field(default=20.0, gt=0, description="log_file: rotate once it reaches this many MB")
    log_backups: int = Field(
        default=3, ge=1, description="log_file: rotated files kept (FILE.1 ... FILE.N), oldest dropped"
    )
    tracing: TracingConfig = Field(default_factory=TracingConfig, description="OpenTelemetry traces (off by default)")

    @model_validator(mode="before")
    @classmethod
    def _refuse_retired(cls, data: Any) -> Any:
        return refuse_retired(data, cls.retired)

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
        refuse_retired({}, cls.retired, cls.model_config.get("env_prefix"))
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


class TokenRole(StrEnum):
    inspect = "inspect"  # Inspect, InspectStream, GetReport, ListReports
    read = "read"  # GetReport, ListReports
    admin = "admin"  # everything, operator RPCs included (services/common/auth.py METHOD_ROLES)


class ApiToken(BaseModel):
    """One bearer token the public API accepts, stored as its hash (`edgeinspect token create` prints both)."""

    name: str = Field(..., min_length=1, description="who holds it (logs, reviews record it)")
    role: TokenRole = Field(..., description="inspect | read | admin")
    hash: str = Field(..., pattern=r"^sha256:[0-9a-f]{64}$", description="sha256 of the token, 'sha256:<hex>'")
    revoked: bool = Field(default=False, description="refused from now on (kept so the logs can name it)")
    rate_per_s: float | None = Field(
        default=None, gt=0, description="calls per second (None: the gateway's token_rate_per_s)"
    )
