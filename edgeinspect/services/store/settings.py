"""Where the report database lives: SQLite beside one gateway, or a PostgreSQL database that a gateway pair shares
(the `store:` block of the gateway's settings)."""

from __future__ import annotations

import socket
from enum import StrEnum
from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, SecretStr, field_serializer, field_validator, model_validator


class StoreBackend(StrEnum):
    sqlite = "sqlite"  # a file at db_path: one gateway (the embedded default)
    postgres = "postgres"  # a PostgreSQL database that a gateway pair shares


class StoreSettings(BaseModel):
    """Where the gateway keeps its reports (services/store/database.py)."""

    backend: StoreBackend = Field(
        default=StoreBackend.sqlite, description="sqlite (db_path) | postgres (dsn or dsn_file)"
    )
    dsn: SecretStr | None = Field(
        default=None,
        description="postgres: libpq conninfo or postgresql:// URL, e.g. from EDGEINSPECT_STORE__DSN (never logged)",
    )
    dsn_file: Path | None = Field(default=None, description="postgres: a file holding the DSN (a mounted secret)")
    instance: str = Field(
        default="",
        max_length=128,
        description="postgres: this gateway's name among those sharing the database, stable across its restarts "
        "(a restart fails only its own pending rows); '': the host name. Two gateways on one host need their own",
    )
    connect_timeout_s: int = Field(default=10, ge=1, description="postgres: seconds to wait for a connection")
    owner_lease_s: float = Field(
        default=10.0,
        ge=1.0,
        le=600.0,
        description="postgres: a gateway of the pair silent (no heartbeat) this long is gone, and another gateway "
        "takes over the inspections it was running when a client retries them there",
    )
    advertise: str = Field(
        default="",
        max_length=255,
        description="postgres: host:port at which the other gateways of the pair reach this one's public API, to "
        "read the frames it holds ('': server.host and the bound port). A server bound to 0.0.0.0 or :: needs it: "
        "without it the frames this gateway holds cannot be read through the other one",
    )

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

    @field_validator("advertise")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, _, port = value.strip().rpartition(":")
        if value and not (host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"store.advertise must be host:port, got {value!r}")
        return value.strip()

    def advertised(self, host: str, port: int) -> str:
        """The address this gateway's heartbeat names: advertise, else host:port unless host binds every
        interface (then '': the other gateway cannot know which one reaches this box)."""
        if self.advertise:
            return self.advertise
        if host.strip("[]") in ("0.0.0.0", "::", ""):
            return ""
        return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"

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
