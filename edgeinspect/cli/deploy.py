"""`edgeinspect deploy ...`: turn a plant inventory into compose files, role settings and k3s manifests."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from edgeinspect.deploy.render import Target
from edgeinspect.deploy.smoke import inspect_once

app = typer.Typer(no_args_is_help=True)


RENDER_HELP = (
    "Plan layer ranges over the decoder boxes and write every box's compose file and role settings.\n\n"
    "Every address, port, layer range and codec is filled in from the inventory: nobody edits layer ranges by "
    "hand. Every internal hop is mTLS (plant.tls, on by default): one certificate per box is issued from the plant "
    "CA (--ca; made there on first use) into each folder's secrets/tls/ and mounted as compose secrets or a "
    "Kubernetes Secret. API tokens are never written: the gateway reads their hashes from secrets/api_tokens.json "
    "(compose) or from the Secret made from k8s/secrets.env (Kubernetes). A gateway pair's database DSN and password "
    "go to secrets/store/ the same way. Re-run after any inventory change and "
    "copy each box's folder to that box (guide: compose/DEPLOY.md)."
)
EXAMPLE = "Example: edgeinspect deploy render -i compose/plant.example.yaml -o /tmp/plant --target all"


@app.command("render", help=RENDER_HELP, epilog=EXAMPLE)
def render_command(
    inventory: Path = typer.Option(
        ...,
        "--inventory",
        "-i",
        exists=True,
        dir_okay=False,
        help="plant inventory YAML: plant-wide settings and every box (see compose/plant.example.yaml)",
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", file_okay=False, help="folder to write into (one sub-folder per box, all-in-one/, k8s/)"
    ),
    target: Target = typer.Option(
        Target.compose,
        "--target",
        "-t",
        help="compose: one compose file per box + all-in-one; k8s: a kustomize base for k3s; all: both",
    ),
    checkpoint: Path | None = typer.Option(
        None,
        "--checkpoint",
        exists=True,
        file_okay=False,
        help="a local copy of the checkpoint to plan from (default: the inventory's model sizes)",
    ),
    ca: Path = typer.Option(
        Path("pki"), "--ca", envvar="EDGEINSPECT_PKI", help="plant CA folder (`edgeinspect certs init`; made if absent)"
    ),
    issue_certs: bool = typer.Option(
        True, "--certs/--no-certs", help="issue the box certificates (--no-certs: settings and manifests only)"
    ),
) -> None:
    """Plan layer ranges and write every box's files (help text: RENDER_HELP)."""
    from rich.console import Console
    from rich.table import Table

    from edgeinspect.deploy import render
    from edgeinspect.deploy.inventory import load_inventory
    from edgeinspect.deploy.planning import plan_stages

    inv = load_inventory(inventory)
    cameras = {b.name: (inventory.parent / b.cameras).read_text() for b in inv.boxes if b.cameras is not None}
    # files a cameras file names (background pictures) travel with it, from the folder it is in
    assets = {
        b.name: render.referenced_files(cameras[b.name], (inventory.parent / b.cameras).parent)
        for b in inv.boxes
        if b.cameras is not None
    }
    stages = plan_stages(inv, checkpoint)
    rendering = render.render(inv, stages, target, cameras, assets)
    written = render.write(rendering, out)
    if inv.plant.tls and issue_certs:
        from edgeinspect import certs

        made = not (ca / certs.CA_CERT).exists()
        written += render.write_certs(inv, rendering, out, certs.ensure_ca(ca))
        if made:
            typer.echo(f"made the plant CA in {ca} (keep {ca / certs.CA_KEY} off the boxes)", err=True)
    if issue_certs:  # a gateway pair's database DSN and password, the API tokens (0600), never in a rendered file
        written += render.write_store_secrets(inv, rendering, out, inventory.parent)
        written += render.write_token_secrets(inv, rendering, out)
    console = Console()
    table = Table(title=f"plant {inv.plant.name}: {len(written)} files in {out}")
    for col in ("service", "box", "address", "layers"):
        table.add_column(col)
    for inst in rendering.instances:
        layers = f"[{inst.stage.layer_start}, {inst.stage.layer_end})" if inst.stage else ""
        address = f"{inst.box.address}:{inst.port}" if inst.port else "(client)"
        table.add_row(inst.service, inst.box.name, address, layers)
    console.print(table)
    if issue_certs:
        from edgeinspect.deploy.next_steps import next_steps

        compose, k8s = target in (Target.compose, Target.all), target in (Target.k8s, Target.all)
        console.print(f"Next steps (compose/DEPLOY.md); the admin token is in {out / 'secrets' / 'admin_token'}:")
        for line in next_steps(inv, out, compose, k8s, ca if inv.plant.tls else None):
            console.print(line, highlight=False, soft_wrap=True)


def _ms(seconds: float | None, digits: int = 0) -> str:
    return f"{seconds * 1e3:.{digits}f} ms" if seconds is not None else "-"


@app.command("smoke")
def smoke_command(
    gateway: str = typer.Option(..., "--gateway", "-g", help="host:port of the gateway, e.g. 10.20.7.10:50051"),
    image: Path = typer.Option(..., "--image", exists=True, dir_okay=False, help="a part photo (JPEG/PNG)"),
    token: str = typer.Option(
        "", "--token", envvar="EDGEINSPECT_API_TOKEN", help="bearer token (default: $EDGEINSPECT_API_TOKEN)"
    ),
    station: str = typer.Option("smoke-test", "--station", help="station recorded in the report"),
    part: str = typer.Option("", "--part", help="part number (filters the spec context)"),
    max_new_tokens: int = typer.Option(0, "--max-new-tokens", min=0, help="generation budget (0: the gateway's)"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds the whole inspection may take"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of a summary"),
    ca: Path | None = typer.Option(
        None, "--ca", envvar="EDGEINSPECT_CA", help="the plant CA certificate (a TLS gateway; plant.tls is the default)"
    ),
) -> None:
    """Run one inspection through the gateway and print the report id, verdict, TTFT and per-token time."""
    import grpc

    try:
        result = inspect_once(gateway, image.read_bytes(), token, station, part, timeout, max_new_tokens, ca)
    except grpc.RpcError as err:
        typer.echo(f"inspection through {gateway} failed: {err.code().name}: {err.details()}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(
        f"report {result['report_id']}: {result['verdict']}, {result['tokens']} tokens, "
        f"TTFT {_ms(result['ttft_s'])}, {_ms(result['per_token_s'], 1)}/token "
        f"(network {_ms(result['network_per_token_s'], 1)}/token), {result['total_s']:.2f} s in all"
    )
