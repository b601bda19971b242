"""`edgeinspect eval DATASET`: a labelled set through the running cluster -> rates with intervals, a report, and
the regression gate against a stored baseline (exit 1 when escape or overkill got worse)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import typer

DEFAULT_GATEWAY = "127.0.0.1:50051"
DEFAULT_TOKEN = "edgeinspect-local"
EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def eval_command(
    dataset: Path = typer.Argument(..., help="MVTec-layout folder (<part>/test/good, <part>/test/<defect>) or CSV"),
    part: str = typer.Option("", "--part", help="the part (MVTec category) to evaluate; sent as the report's part"),
    baseline: Path | None = typer.Option(None, "--baseline", help="a stored result.json to gate against"),
    tolerance: float = typer.Option(
        0.0, help="absolute allowance above the baseline's 95% upper bound before the gate fails (0.02 = 2 points)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the result JSON (stable key order) to stdout"),
    out: Path | None = typer.Option(None, "--out", help="results folder (default var/eval/<dataset name>)"),
    fresh: bool = typer.Option(False, "--fresh", help="forget earlier results in --out and measure again"),
    gateway: str = typer.Option(DEFAULT_GATEWAY, envvar="EDGEINSPECT_GATEWAY", help="gateway host:port"),
    token: str = typer.Option(DEFAULT_TOKEN, envvar="EDGEINSPECT_API_TOKEN", help="bearer token"),
    concurrency: int = typer.Option(2, min=1, help="inspections in flight"),
    class_map: list[str] = typer.Option([], "--class-map", help="DATASET_CLASS=SPEC_CLASS (repeatable)"),
    station: str = typer.Option("eval", help="station id recorded in the reports"),
    prompt: str = typer.Option("", help="instruction (default: the gateway's standard one)"),
    max_new_tokens: int = typer.Option(0, help="generation budget (0: the gateway's default)"),
) -> None:
    """Measure escape, overkill and UNCERTAIN rates (with 95% intervals) on labelled parts; resumable."""
    from rich.console import Console

    from edgeinspect.errors import EdgeInspectError
    from edgeinspect.services.evaluation import gate
    from edgeinspect.services.evaluation.datasets import load_dataset, parse_class_map
    from edgeinspect.services.evaluation.evaluate import dump
    from edgeinspect.services.evaluation.report import write_markdown
    from edgeinspect.services.evaluation.runner import EvalOptions

    err = Console(stderr=True)
    out = out or Path("var/eval") / (dataset.stem + (f"-{part}" if part else ""))
    try:
        mapping = parse_class_map(class_map)
        layout, samples = load_dataset(dataset, part, mapping)
        base = json.loads(baseline.read_text()) if baseline else None
    except (EdgeInspectError, OSError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from exc
    if fresh and out.exists():
        shutil.rmtree(out)
    opts = EvalOptions(gateway, token, concurrency, station, prompt, max_new_tokens)
    settings = {
        "gateway": gateway,
        "concurrency": concurrency,
        "station": station,
        "prompt": prompt,
        "max_new_tokens": max_new_tokens,
        "class_map": dict(sorted(mapping.items())),
    }
    try:
        result = _run_with_progress(samples, layout, dataset, part, opts, out, settings, err)
    except EdgeInspectError as exc:
        err.print(f"[red]error:[/red] {exc}\nresults so far are kept in {out}: rerun to resume")
        raise typer.Exit(EXIT_UNAVAILABLE) from exc
    regressions = None
    if base is not None:
        regressions = [r.describe() for r in gate.check(result, base, tolerance)]
        for note in gate.differences(result, base):
            err.print(f"[dim]baseline differs: {note}[/dim]")
    report = write_markdown(result, out, dataset if dataset.is_dir() else dataset.parent, regressions)
    if as_json:
        sys.stdout.write(dump(result))
    else:
        _print_summary(result)
    err.print(f"result {out / 'result.json'}, report {report}")
    if regressions:
        for r in regressions:
            err.print(f"[red]GATE FAILED[/red]: {r}")
        raise typer.Exit(EXIT_GATE_FAILED)
    if regressions is not None:
        err.print(f"[green]gate passed[/green] against {baseline}")


def _run_with_progress(samples, layout, dataset, part, opts, out, settings, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from edgeinspect.services.evaluation.evaluate import evaluate

    with Progress(
        TextColumn("inspecting"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    ) as progress:
        task = progress.add_task("eval", total=len(samples))

        def on_start(total: int, done: int) -> None:
            progress.update(task, total=total, completed=done)

        def on_done(rec: dict) -> None:
            progress.advance(task)

        return evaluate(
            samples,
            layout=layout,
            dataset=dataset,
            part=part,
            opts=opts,
            out=out,
            settings=settings,
            on_start=on_start,
            on_done=on_done,
        )


def _print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = result["metrics"]
    table = Table(title=f"{m['counts']['images']} parts: {m['counts']['good']} good, {m['counts']['defect']} defective")
    for col in ("metric", "value", "count", "95% CI"):
        table.add_column(col)
    for name in ("escape", "overkill", "uncertain"):
        r = m[name]
        if r["value"] is None:
            table.add_row(name, "n/a", f"0/{r['n']}", "")
        else:
            table.add_row(name, f"{r['value']:.1%}", f"{r['k']}/{r['n']}", f"{r['low']:.1%}-{r['high']:.1%}")
    for q in ("p50", "p99"):
        lat = m["latency_ms"][q]
        if lat["value"] is not None:
            table.add_row(
                f"latency {q}",
                f"{lat['value']:.0f} ms",
                str(m["latency_ms"]["n"]),
                f"{lat['low']:.0f}-{lat['high']:.0f} ms",
            )
    Console().print(table)
