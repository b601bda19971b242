"""The console's settings: which gateway it talks to, where it listens, what a shift is."""

from __future__ import annotations

from pydantic import Field

from edgeinspect.config import RoleSettings, TLSConfig


class ConsoleSettings(RoleSettings):
    # server.host / server.port / server.port_file are the HTTP listener (port 0 picks a free one).
    gateway: str = Field(
        "127.0.0.1:50051", description="host:port of the gateway's public API; a pair as 'a:50051,b:50051'"
    )
    client_tls: TLSConfig | None = Field(None, description="TLS to the gateway (None: plaintext)")
    rpc_timeout_s: float = Field(10.0, gt=0, description="deadline of each call the console makes to the gateway")
    refresh_s: float = Field(3.0, gt=0, description="how often the stations page polls for new reports")
    frames_per_station: int = Field(6, ge=1, le=50, description="latest frames shown per station")
    shift_hours: int = Field(8, ge=1, le=24, description="length of a shift (OK/NG counts are per shift)")
    shift_start_hour: int = Field(6, ge=0, le=23, description="the hour (console's local time) a shift starts")
    session_ttl_s: float = Field(12 * 3600.0, gt=0, description="a login lasts this long")
    export_limit: int = Field(20000, ge=1, description="most rows one CSV export holds")
