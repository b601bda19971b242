"""`edgeinspect eval DATASET`: a labelled set through the running cluster -> rates with intervals, a report, and
the regression gate against a stored baseline (exit 1 when escape, overkill or the UNCERTAIN rate got worse)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import grpc
import typer

from edgeinspect.cli.options import CA, GATEWAY, TOKEN, TOKEN_FILE_OPTION

EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def eval_command(
    dataset: Path = typer.Argument(
        ...,
        help="MVTec-layout folder (<part>/test/good, <part>/test/<defect>), a CSV manifest (path,label,classes), "
        "or reviews:[STATION] for the operator-reviewed reports stored by the gateway",
    ),
    part: str = typer.Option("", "--part", help="the part (MVTec category) to evaluate; sent as the report's part"),
    baseline: Path | None = typer.Option(None, "--baseline", help="a stored result.json to gate against"),
    tolerance: float = typer.Option(
        0.0, help="absolute allowance above the baseline's 95% upper bound before the gate fails (0.02 = 2 points)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the result JSON (stable key order) to stdout"),
    out: Path | None = typer.Option(None, "--out", help="results folder (default var/eval/<dataset name>)"),
    fresh: bool = typer.Option(False, "--fresh", help="forget earlier results in --out and measure again"),
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE_OPTION,
    ca: Path | None = CA,
    concurrency: int = typer.Option(2, min=1, help="inspections in flight"),
    class_map: list[str] = typer.Option([], "--class-map", help="DATASET_CLASS=SPEC_CLASS (repeatable)"),
    station: str = typer.Option("eval", help="station id recorded in the reports"),
    prompt: str = typer.Option("", help="instruction (default: the gateway's standard one)"),
    max_new_tokens: int = typer.Option(0, help="generation budget (0: the gateway's default)"),
) -> None:
    """Measure escape, overkill and UNCERTAIN rates (with 95% intervals) on labelled parts; resumable."""
    from rich.console import Console

    from edgeinspect.errors import EdgeInspectError
    from edgeinspect.services.client import resolve_token
    from edgeinspect.services.evaluation import gate
    from edgeinspect.services.evaluation.datasets import parse_class_map
    from edgeinspect.services.evaluation.evaluate import dump
    from edgeinspect.services.evaluation.report import write_markdown
    from edgeinspect.services.evaluation.runner import EvalOptions

    err = Console(stderr=True)
    name = str(dataset).replace(":", "-").strip("-") if is_reviews(dataset) else dataset.stem
    out = out or Path("var/eval") / (name + (f"-{part}" if part else ""))
    if fresh and out.exists():
        shutil.rmtree(out)
    opts = EvalOptions(gateway, resolve_token(token, token_file), concurrency, station, prompt, max_new_tokens, ca=ca)
    try:
        mapping = parse_class_map(class_map)
        layout, samples, image_root = _load(dataset, part, mapping, out, opts, err)
        base = json.loads(baseline.read_text()) if baseline else None
    except (EdgeInspectError, OSError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from exc
    except grpc.RpcError as exc:
        err.print(f"[red]error:[/red] the gateway at {gateway} answered {exc.code().name}: {exc.details()}")
        raise typer.Exit(EXIT_UNAVAILABLE) from exc
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
    report = write_markdown(result, out, image_root, regressions)
    if as_json:
        sys.stdout.write(dump(result))
    else:
        _print_summary(result)
    err.print(f"result {out / 'result.json'}, report {report}")
    if (result.get("anomaly") or {}).get("roc_png"):
        err.print(f"anomaly gate ROC {out / result['anomaly']['roc_png']}")
    if regressions:
        for r in regressions:
            err.print(f"[red]GATE FAILED[/red]: {r}")
        raise typer.Exit(EXIT_GATE_FAILED)
    if regressions is not None:
        err.print(f"[green]gate passed[/green] against {baseline}")


def is_reviews(dataset: Path) -> bool:
    from edgeinspect.services.evaluation.reviews import is_reviews as _is

    return _is(str(dataset))


def _load(dataset: Path, part: str, mapping: dict, out: Path, opts, console):
    """(layout, samples, folder the samples' rel paths start from)."""
    from edgeinspect.services.evaluation.datasets import load_dataset

    if not is_reviews(dataset):
        layout, samples = load_dataset(dataset, part, mapping)
        return layout, samples, dataset if dataset.is_dir() else dataset.parent
    from edgeinspect.services.client import InspectionClient
    from edgeinspect.services.evaluation.reviews import load_reviews

    with InspectionClient(opts.gateway, opts.token, ca=opts.ca) as client:
        samples, skipped = load_reviews(client, str(dataset), out, part, mapping)
    if skipped:
        console.print(f"[yellow]{skipped} reviewed reports left out: the gateway no longer keeps their frames[/yellow]")
    return "reviews", samples, out


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
    if "anomaly" in result:
        _print_anomaly(result["anomaly"])


def _print_anomaly(a: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"anomaly gate ({', '.join(a['bank_ids']) or 'no bank'}): {a['n_good']} good, "
                  f"{a['n_defect']} defective scored")  # fmt: skip
    for col in ("figure", "value", "count", "95% CI"):
        table.add_column(col)
    auroc = "n/a" if a["image_auroc"] is None else f"{a['image_auroc']:.3f}"
    table.add_row("image AUROC", auroc, f"{a['n_good']}+{a['n_defect']}", "")
    for name, k, n in (("escape", "escaped", "n_defect"), ("overkill", "flagged_good", "n_good")):
        if a[name] is None:
            table.add_row(f"gate {name}", "n/a", f"0/{a[n]}", "")
        else:
            low, high = a[f"{name}_ci95"]
            table.add_row(f"gate {name}", f"{a[name]:.1%}", f"{a[k]}/{a[n]}", f"{low:.1%}-{high:.1%}")
    alone = a["decided_by_gate_alone"]
    if alone["value"] is not None:
        table.add_row("decided by the gate alone", f"{alone['value']:.1%}", f"{alone['k']}/{alone['n']}", "")
    threshold = a["threshold"] if a["threshold"] is not None else "several: " + ", ".join(map(str, a["thresholds"]))
    table.add_row("threshold", str(threshold), "", "")
    pixel = a.get("pixel_auroc")
    table.add_row("pixel AUROC", "-" if pixel is None else f"{pixel:.4f}", "", a.get("pixel_auroc_note") or "")
    Console().print(table)
