"""`edgeinspect verify`: the A/B check before a line goes live (the check itself: edgeinspect/stack/verify.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from edgeinspect.cli.options import CA, GATEWAY, TOKEN, TOKEN_FILE_OPTION
from edgeinspect.errors import FailedPrecondition, InvalidInput
from edgeinspect.stack.verify import WIDE_BOUND, Format, VerifyResult, verify


def verify_command(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="the same checkpoint folder the cluster serves"),
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE_OPTION,
    ca: Path | None = CA,
    image: Path | None = typer.Option(None, help="image to send (default: the shipped sample part)"),
    prompt: str = typer.Option("Inspect the part in the image.", help="instruction text"),
    max_new_tokens: int = typer.Option(32, help="tokens the cluster generates (each one is checked)"),
    weights: Format | None = typer.Option(None, help="the stages' weight format (default: the cluster status's)"),
    tolerance: float | None = typer.Option(
        None, help="margin bound in logits at every position, instead of the one derived from the formats"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Check the running cluster's greedy tokens against a single-process reference, teacher-forced: exit 0 when
    every position is the reference's argmax or a near tie within the rounding bound, 1 when not, 2 when the
    cluster could not be asked."""
    import grpc

    from edgeinspect.assets import sample_image
    from edgeinspect.services.client import resolve_token

    image_bytes = (image or sample_image()).read_bytes()
    try:
        result = verify(
            gateway,
            resolve_token(token, token_file),
            checkpoint,
            image_bytes,
            prompt,
            max_new_tokens,
            weights=weights.value if weights else None,
            tolerance=tolerance,
            ca=ca,
        )
    except (grpc.RpcError, FailedPrecondition, InvalidInput) as err:  # nothing to judge by: not a mismatch (1)
        from edgeinspect.cli import user_error_message

        typer.echo(f"error: {user_error_message(err) or err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result.as_dict()))
    else:
        print_result(result)
    raise typer.Exit(0 if result.agree else 1)


def print_result(result: VerifyResult) -> None:
    """Human output: a summary, and on failure the positions beyond the bound (a rich table on a terminal)."""
    from rich.console import Console
    from rich.table import Table

    c = Console(highlight=False)
    c.print(f"checkpoint   {result.checkpoint}")
    c.print(f"fingerprint  local {result.fingerprint}, cluster {result.cluster_fingerprint}")
    bound = "--tolerance" if result.bound_per_rms is None else f"{result.bound_per_rms:.4g} x rms(logits)"
    c.print(
        f"cluster      {result.stages} stage(s), {result.wire} wire, {result.weights} weights: margin bound "
        f"{bound}; {result.compared} position(s) compared"
    )
    if (result.bound_per_rms or 0.0) > WIDE_BOUND:
        c.print(
            f"[yellow]note[/yellow]: a bound over {WIDE_BOUND} rms also admits many tokens of a wrong model; for a "
            "sharper check verify a route with fp32 weights and a lighter wire codec"
        )
    if result.agree:
        c.print(f"[green]AGREE[/green]: {result.verdict}")
        return
    shown = result.mismatches[:40]
    if shown:
        table = Table("position", "cluster token", "reference argmax", "margin", "bound", "", box=None)
        for p in shown:
            table.add_row(str(p.position), str(p.cluster_token), str(p.reference_token), f"{p.margin:.4g}",
                          f"{p.bound:.4g}", p.decision.value)  # fmt: skip
        c.print(table)
        if len(result.mismatches) > len(shown):
            c.print(f"... and {len(result.mismatches) - len(shown)} more (--json lists every one)")
    for reason in result.reasons:
        c.print(f"[red]DISAGREE[/red]: {reason}")
    c.print("check each box's checkpoint, library versions and drivers")
