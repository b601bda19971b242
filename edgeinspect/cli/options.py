"""How every client command reaches the gateway, declared once: its address, the bearer token and the CA of a TLS
gateway. Defaults point at the embedded stack `edgeinspect up` runs; EDGEINSPECT_GATEWAY, EDGEINSPECT_TOKEN and
EDGEINSPECT_CA point them at a plant's gateway (services/client.py resolve_token reads the token's), and
EDGEINSPECT_WORKDIR at a stack `up --workdir` started elsewhere: `up` and every client read the same setting, so the
token file a client looks for is the one that stack wrote."""

from __future__ import annotations

import os
from pathlib import Path

import typer

DEFAULT_GATEWAY = "127.0.0.1:50051"
DEFAULT_WORKDIR = Path("var/embedded")
WORKDIR = Path(os.environ.get("EDGEINSPECT_WORKDIR") or DEFAULT_WORKDIR)  # `edgeinspect up`'s folder
TOKEN_FILE = WORKDIR / "api_token"  # written by `up` (0600)

GATEWAY = typer.Option(DEFAULT_GATEWAY, envvar="EDGEINSPECT_GATEWAY", help="gateway host:port")
TOKEN = typer.Option(
    "", help="bearer token (default: $EDGEINSPECT_TOKEN, else the --token-file `up` wrote)", show_default=False
)
TOKEN_FILE_OPTION = typer.Option(TOKEN_FILE, help="file holding the bearer token (`up` writes one, 0600)")
CA = typer.Option(
    None, envvar="EDGEINSPECT_CA", help="CA certificate of a TLS gateway (`up --tls`: WORKDIR/tls/ca.crt)"
)


def client_command(gateway: str, token_file: Path, ca: Path | None) -> str:
    """The `edgeinspect inspect` line that reaches a stack from here: only the options its defaults do not cover."""
    parts = ["edgeinspect inspect IMAGE"]
    if gateway != DEFAULT_GATEWAY:
        parts.append(f"--gateway {gateway}")
    if token_file.resolve() != TOKEN_FILE.resolve():
        parts.append(f"--token-file {token_file}")
    if ca is not None:
        parts.append(f"--ca {ca}")
    return " ".join(parts)
