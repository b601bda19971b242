"""`edgeinspect inspect IMAGE...`: images through a running gateway, the reports printed as they come."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from edgeinspect.cli.options import CA, GATEWAY, TOKEN, TOKEN_FILE_OPTION


def inspect_command(
    images: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="image files to inspect"),
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE_OPTION,
    ca: Path | None = CA,
    station: str = typer.Option("", help="station id recorded in the report"),
    part: str = typer.Option("", help="part / product id (selects the specs)"),
    prompt: str = typer.Option("", help="instruction (default: the standard defect-report request)"),
    max_new_tokens: int = typer.Option(0, help="generation budget (0: the gateway's default)"),
    stream: bool = typer.Option(False, "--stream", help="print tokens as they arrive"),
    as_json: bool = typer.Option(False, "--json", help="print each report as JSON"),
) -> None:
    """Inspect images through a running gateway and print the reports."""
    from edgeinspect.services.client import InspectionClient, print_report, report_to_dict, resolve_token

    token = resolve_token(token, token_file)
    if not token:
        typer.echo(f"no token: pass --token, set EDGEINSPECT_TOKEN, or start `edgeinspect up` ({token_file})", err=True)
    with InspectionClient(gateway, token, ca=ca) as client:
        for image in images:
            report = client.inspect(
                image.read_bytes(),
                station=station,
                part=part,
                prompt=prompt,
                max_new_tokens=max_new_tokens,
                on_delta=(lambda t: print(t, end="", flush=True)) if stream else None,
            )
            if stream:
                print()
            if as_json:
                print(json.dumps(report_to_dict(report), indent=2))
            else:
                print_report(report)
