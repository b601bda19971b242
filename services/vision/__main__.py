"""`python -m edgeinspect.services.vision --config FILE`."""

from __future__ import annotations

from pathlib import Path

import typer

from edgeinspect.services.vision.server import main


def cli(
    config: Path | None = typer.Option(None, "--config", help="vision role YAML (EDGEINSPECT_* env overrides it)"),
) -> None:
    """Run the vision node."""
    main(config)


if __name__ == "__main__":
    typer.run(cli)
