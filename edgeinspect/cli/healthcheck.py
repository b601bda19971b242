"""`edgeinspect healthcheck ADDRESS`: exit 0 when the server at ADDRESS reports SERVING on grpc.health.v1.

The check itself is services/common/health_probe.py; container HEALTHCHECKs run it as `edgeinspect-healthcheck`,
which skips the CLI's imports. With `--wait`
it keeps asking until the server is SERVING or the time is up: one process that waits for a box to come up,
instead of a new process per poll.
"""

from __future__ import annotations

from pathlib import Path

import typer


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
    from edgeinspect.services.common.health_probe import check

    ok, status = check(address, service, timeout, wait, ca, cert, key)
    typer.echo(f"{address}: {status}", err=not ok)
    if not ok:
        raise typer.Exit(1)
