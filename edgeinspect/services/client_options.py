"""How every client command reaches the gateway, declared once: its address, the bearer token and the CA of a TLS
gateway. Defaults point at the embedded stack `edgeinspect up` runs; EDGEINSPECT_GATEWAY, EDGEINSPECT_TOKEN and
EDGEINSPECT_CA point them at a plant's gateway (services/client.py resolve_token reads the token's)."""

from __future__ import annotations

from pathlib import Path

import typer

DEFAULT_GATEWAY = "127.0.0.1:50051"
WORKDIR = Path("var/embedded")  # `edgeinspect up`'s default folder
TOKEN_FILE = WORKDIR / "api_token"  # written by `up` (0600)

GATEWAY = typer.Option(DEFAULT_GATEWAY, envvar="EDGEINSPECT_GATEWAY", help="gateway host:port")
TOKEN = typer.Option(
    "", help="bearer token (default: $EDGEINSPECT_TOKEN, else the --token-file `up` wrote)", show_default=False
)
TOKEN_FILE_OPTION = typer.Option(TOKEN_FILE, help="file holding the bearer token (`up` writes one, 0600)")
CA = typer.Option(
    None, envvar="EDGEINSPECT_CA", help="CA certificate of a TLS gateway (`up --tls`: WORKDIR/tls/ca.crt)"
)
