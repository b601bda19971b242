"""`edgeinspect healthcheck ADDRESS`: exit 0 when the server at ADDRESS reports SERVING on grpc.health.v1.

Container HEALTHCHECKs and compose `depends_on: service_healthy` run it; it imports nothing heavy. With `--wait`
it keeps asking until the server is SERVING or the time is up: one process that waits for a box to come up,
instead of a new process per poll.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

POLL_S = 0.25
# gRPC backs off reconnecting after refused connections (1 s growing by 1.6x to 120 s): polling one channel for a
# server that takes minutes to start would notice it up to minutes late. Cap the backoff near the poll interval.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def healthcheck_command(
    address: str = typer.Argument(..., help="host:port of an edgeinspect server, e.g. 127.0.0.1:50060"),
    service: str = typer.Option("", "--service", help="grpc.health.v1 service name ('' = the whole server)"),
    timeout: float = typer.Option(3.0, "--timeout", min=0.1, help="seconds to wait for one answer"),
    wait: float = typer.Option(
        0.0, "--wait", min=0.0, help="keep asking for up to this many seconds until SERVING (0: ask once)"
    ),
    ca: Path | None = typer.Option(None, "--ca", help="CA certificate: ask over TLS, verifying the server"),
    cert: Path | None = typer.Option(None, "--cert", help="client certificate (an mTLS server requires one)"),
    key: Path | None = typer.Option(None, "--key", help="its private key"),
) -> None:
    """Ask a server's grpc.health.v1 Check: exit 0 when SERVING, 1 otherwise (not serving, unreachable)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    serving = health_pb2.HealthCheckResponse.SERVING
    deadline = time.monotonic() + wait
    if ca is None:
        channel = grpc.insecure_channel(address, options=RECONNECT_OPTIONS)
    else:
        creds = grpc.ssl_channel_credentials(
            ca.read_bytes(), key.read_bytes() if key else None, cert.read_bytes() if cert else None
        )
        channel = grpc.secure_channel(address, creds, options=RECONNECT_OPTIONS)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
                status, ok = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), reply.status == serving
            except grpc.RpcError as err:
                status, ok = f"{err.code().name}: {err.details()}", False
            if ok or time.monotonic() + POLL_S > deadline:
                break
            time.sleep(POLL_S)
    typer.echo(f"{address}: {status}", err=not ok)
    if not ok:
        raise typer.Exit(1)
