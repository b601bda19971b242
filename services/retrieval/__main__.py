"""`python -m edgeinspect.services.retrieval --config FILE`."""

from __future__ import annotations

from pathlib import Path

import typer

from edgeinspect.services.retrieval.server import main


def cli(
    config: Path | None = typer.Option(None, "--config", help="retrieval role YAML (EDGEINSPECT_* env overrides it)"),
) -> None:
    """Run the retrieval node."""
    main(config)


if __name__ == "__main__":
    typer.run(cli)
