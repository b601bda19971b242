"""One settings object per role: YAML file, overridden by EDGEINSPECT_* environment variables.

Precedence (highest first): explicit keyword arguments, environment, the YAML file, defaults. Nested fields use
`__` in the environment: EDGEINSPECT_SERVER__PORT=50061.
"""

from __future__ import annotations

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


class WireCodec(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"


class ServerConfig(BaseModel):
    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 on a box that serves others")
    port: int = Field(0, description="gRPC port; 0 picks a free one (tests)")
    metrics_port: int | None = Field(None, description="Prometheus /metrics port; None disables it")
    grace_s: float = Field(5.0, description="seconds in-flight calls get on shutdown")
    max_message_mb: int = Field(64, description="largest gRPC message accepted or sent")
    port_file: Path | None = Field(None, description="write the bound port here once serving (port 0)")


class RoleSettings(BaseSettings):
    """Base for every role's settings: YAML file + environment."""

    model_config = SettingsConfigDict(env_prefix="EDGEINSPECT_", env_nested_delimiter="__", extra="forbid")

    server: ServerConfig = Field(default_factory=ServerConfig)
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR")
    log_json: bool = Field(True, description="JSON log lines (False: human-readable console)")

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
    """Writes settings as YAML that `load` reads back (secrets included: keep such files out of images)."""
    import yaml

    data = settings.model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
