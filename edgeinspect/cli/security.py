"""`edgeinspect certs ...` (the plant CA) and `edgeinspect token create` (public API tokens)."""

from __future__ import annotations

from pathlib import Path

import typer

from edgeinspect.config import TokenRole

PKI = Path("pki")
PKI_HELP = "folder holding the plant CA (ca.crt, ca.key) and the certificates issued from it"

certs_app = typer.Typer(no_args_is_help=True)
token_app = typer.Typer(no_args_is_help=True)


@certs_app.command("init")
def init_command(
    out: Path = typer.Option(PKI, "--out", "-o", envvar="EDGEINSPECT_PKI", help=PKI_HELP),
    name: str = typer.Option("edgeinspect plant CA", help="the CA's common name"),
    days: int = typer.Option(3650, min=1, help="validity in days"),
    force: bool = typer.Option(False, "--force", help="replace an existing CA (every certificate must be reissued)"),
) -> None:
    """Make the plant CA: OUT/ca.crt (copy to every box) and OUT/ca.key (0600; keep it off the boxes)."""
    from edgeinspect import certs

    if (out / certs.CA_CERT).exists() and not force:
        typer.echo(f"{out / certs.CA_CERT} exists; --force replaces it (and invalidates every certificate)", err=True)
        raise typer.Exit(1)
    paths = certs.write_ca(out, certs.make_ca(name, days))
    typer.echo(f"CA certificate {paths.cert}\nCA key         {paths.key} (0600: keep it off the boxes)")


@certs_app.command("issue")
def issue_command(
    role: list[str] = typer.Option(..., "--role", "-r", help="role(s) of the box: gateway vision retrieval stage ..."),
    host: list[str] = typer.Option(..., "--host", help="DNS name(s) the box is reached by; the first names the files"),
    ip: list[str] = typer.Option([], "--ip", help="IP address(es) the box is reached by"),
    ca: Path = typer.Option(PKI, "--ca", envvar="EDGEINSPECT_PKI", help=PKI_HELP),
    out: Path | None = typer.Option(None, "--out", "-o", help="where to write NAME.crt and NAME.key (default: --ca)"),
    days: int = typer.Option(825, min=1, help="validity in days (never past the CA's)"),
) -> None:
    """Issue a box certificate with its roles in SAN URIs (edgeinspect://role/ROLE)."""
    from edgeinspect import certs

    try:
        issued = certs.issue(certs.load_ca(ca), host[0], role, hosts=host[1:], ips=ip, days=days)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    paths = certs.write_issued(out or ca, host[0], issued, ca / certs.CA_CERT)
    typer.echo(f"certificate {paths.cert}\nkey         {paths.key} (0600)\nroles       {', '.join(role)}")


@certs_app.command("check")
def check_command(
    paths: list[Path] = typer.Argument(None, help="certificates or folders (default: the --ca folder)"),
    ca: Path = typer.Option(PKI, "--ca", envvar="EDGEINSPECT_PKI", help=PKI_HELP),
    warn_days: int = typer.Option(30, "--warn-days", min=0, help="exit 1 when a certificate expires sooner"),
) -> None:
    """Days to expiry of every certificate; exit 1 when one has expired or expires within --warn-days."""
    from rich.console import Console
    from rich.table import Table

    from edgeinspect import certs

    files = sorted(
        f for p in (paths or [ca]) for f in ([p] if p.is_file() else p.glob("**/*.crt")) if f.suffix == ".crt"
    )
    if not files:
        typer.echo(f"no certificates (*.crt) under {', '.join(map(str, paths or [ca]))}", err=True)
        raise typer.Exit(2)
    table = Table(title=f"certificates (warn under {warn_days} days)")
    for col in ("file", "subject", "roles", "days left"):
        table.add_column(col)
    failing = 0
    for f in files:
        pem = f.read_bytes()
        left = certs.days_left(pem)
        bad = left < warn_days
        failing += bad
        style = "red" if left < 0 else ("yellow" if bad else "green")
        table.add_row(str(f), certs.subject_name(pem), ", ".join(certs.roles_of(pem)), f"[{style}]{left:.0f}[/]")
    Console().print(table)
    if failing:
        typer.echo(f"{failing} certificate(s) expired or expiring within {warn_days} days", err=True)
        raise typer.Exit(1)


@token_app.command("create")
def create_command(
    role: TokenRole = typer.Option(..., "--role", help="inspect: inspect + read; read: reports only; admin: all"),
    name: str = typer.Option(..., "--name", help="who holds it (line-3-ingest, qa-console): logs and reviews"),
) -> None:
    """Print a new token once, and the line to paste under the gateway's api_tokens (its hash, not the token)."""
    import json

    from edgeinspect.services.common.auth import hash_token, new_token

    token = new_token()
    entry = {"name": name, "role": role.value, "hash": hash_token(token)}
    typer.echo(f"token (shown once; give it to {name}, e.g. in EDGEINSPECT_TOKEN or a 0600 file):\n  {token}\n")
    typer.echo("paste under api_tokens in the gateway's settings:")
    typer.echo(f"  - {json.dumps(entry)}")
