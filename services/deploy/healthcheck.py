"""`edgeinspect healthcheck ADDRESS`: exit 0 when the server at ADDRESS reports SERVING on grpc.health.v1.

Container HEALTHCHECKs and compose `depends_on: service_healthy` run it; it imports nothing heavy.
"""

from __future__ import annotations

import typer


def healthcheck_command(
    address: str = typer.Argument(..., help="host:port of an edgeinspect server, e.g. 127.0.0.1:50060"),
    service: str = typer.Option("", "--service", help="grpc.health.v1 service name ('' = the whole server)"),
    timeout: float = typer.Option(3.0, "--timeout", min=0.1, help="seconds to wait for the answer"),
) -> None:
    """Ask a server's grpc.health.v1 Check: exit 0 when SERVING, 1 otherwise (not serving, unreachable)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            typer.echo(f"{address}: {err.code().name}: {err.details()}", err=True)
            raise typer.Exit(1) from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    typer.echo(f"{address}: {status}")
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        raise typer.Exit(1)
