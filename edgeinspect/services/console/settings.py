"""The console's settings: which gateway it talks to, where it listens, what a shift is."""

from __future__ import annotations

from pydantic import Field

from edgeinspect.config import RoleSettings, TLSConfig


class ConsoleSettings(RoleSettings):
    # server.host / server.port / server.port_file are the HTTP listener (port 0 picks a free one).
    gateway: str = Field(
        default="127.0.0.1:50051", description="host:port of the gateway's public API; a pair as 'a:50051,b:50051'"
    )
    client_tls: TLSConfig | None = Field(default=None, description="TLS to the gateway (None: plaintext)")
    rpc_timeout_s: float = Field(
        default=10.0, gt=0, description="deadline of each call the console makes to the gateway"
    )
    refresh_s: float = Field(default=3.0, gt=0, description="how often the stations page polls for new reports")
    frames_per_station: int = Field(default=6, ge=1, le=50, description="latest frames shown per station")
    shift_hours: int = Field(default=8, ge=1, le=24, description="length of a shift (OK/NG counts are per shift)")
    shift_start_hour: int = Field(default=6, ge=0, le=23, description="the hour (console's local time) a shift starts")
    session_ttl_s: float = Field(default=12 * 3600.0, gt=0, description="a login lasts this long")
    export_limit: int = Field(default=20000, ge=1, description="most rows one CSV export holds")
