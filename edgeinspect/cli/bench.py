"""`edgeinspect bench`: runs the benchmark suite of a source checkout (bench/run_all.py) and prints its summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

REPO = Path(__file__).resolve().parents[2]


def bench_command(
    only: str = typer.Option("", help="comma-separated benchmark names (bench/<name>.py stems) to run"),
    skip: str = typer.Option("", help="comma-separated benchmark names to leave out"),
    timeout: float = typer.Option(3600, help="seconds per benchmark before it is killed"),
    summary_only: bool = typer.Option(False, "--summary-only", help="only re-summarise bench/results/*.json"),
) -> None:
    """Run the benchmarks (each against its baseline in the same run); write bench/results/*.json + SUMMARY.md."""
    script = REPO / "bench" / "run_all.py"
    if not script.is_file():
        typer.echo(f"no benchmark suite at {script}: `edgeinspect bench` runs from a source checkout", err=True)
        raise typer.Exit(2)
    cmd = [sys.executable, str(script), "--only", only, "--skip", skip, "--timeout", str(timeout)]
    if summary_only:
        cmd.append("--summary-only")
    raise typer.Exit(subprocess.run(cmd, cwd=REPO, check=False).returncode)
