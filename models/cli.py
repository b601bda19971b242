"""`edgeinspect model ...` and `edgeinspect plan`."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


def plan_command(
    nodes: Path = typer.Option(..., "--nodes", help="YAML file listing the decoder nodes (see compose/nodes.example.yaml)"),
) -> None:
    """Plan contiguous layer ranges over the decoder nodes and print them as a table."""
    raise typer.Exit(2)
