"""`edgeinspect ingest`: follow the configured cameras and send sampled frames to the gateway."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter, defaultdict
from pathlib import Path

import typer

from edgeinspect.errors import EdgeInspectError


def ingest_command(
    config: Path = typer.Option(..., "--config", "-c", help="cameras.yaml: cameras, gateway, token, frames dir"),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="no gateway: read the sources (files as fast as they decode, once) and show per camera which "
        "frames would be inspected and why",
    ),
    max_reports: int | None = typer.Option(
        None, "--max-reports", min=1, help="stop after this many reports (dry run: frames that would be inspected)"
    ),
    print_reports: bool = typer.Option(
        False, "--print", help="print one line per report as it arrives: camera, verdict, part, report id"
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="dry run: also list every skipped frame"),
) -> None:
    """Follow the cameras of a cameras.yaml and send sampled, change-gated frames to the gateway."""
    from rich.console import Console

    from edgeinspect.services.common.logging import configure_logging
    from edgeinspect.services.common.tracing import setup_tracing, tracing_var
    from edgeinspect.services.ingest.config import IngestSettings
    from edgeinspect.services.ingest.server import run

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich's default raises SystemExit, which silently ends the camera thread that printed and leaves
            # the run waiting for it forever; say() ends the run instead.
            self.quiet = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise BrokenPipeError

    console = PipeAwareConsole()
    stdout_closed = False

    def say(*args, **kwargs) -> None:
        """console.print, ending the run when stdout is closed (`ingest --dry-run -v | head`)."""
        nonlocal stdout_closed
        if stdout_closed:
            return
        try:
            console.print(*args, **kwargs)
        except BrokenPipeError:
            stdout_closed = True
            if loop is not None and ingestor is not None:
                loop.call_soon_threadsafe(ingestor.stop)  # decisions are printed from the camera threads

    try:
        settings = IngestSettings.load(config)
    except (FileNotFoundError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc
    configure_logging(settings.log_level, settings.log_json, role="ingest")
    if dry_run:
        for cam in settings.cameras:  # a dry run reads files once, as fast as they decode
            cam.realtime, cam.loop = False, False
    decisions: dict[str, list[tuple[int, float | None, bool, str]]] = defaultdict(list)
    would_inspect = 0

    def on_decision(camera: str, frame, decision) -> None:
        nonlocal would_inspect
        decisions[camera].append((frame.index, frame.pts_s, decision.inspect, decision.reason))
        if decision.inspect or verbose:
            at = f"t={frame.pts_s:7.2f}s" if frame.pts_s is not None else f"wall={frame.wall_time:.3f}"
            verdict = "[green]INSPECT[/]" if decision.inspect else "[dim]skip   [/]"
            say(f"{camera:12s} frame {frame.index:6d} {at}  {verdict}  {decision.reason}")
        if decision.inspect:
            would_inspect += 1
            if max_reports is not None and would_inspect >= max_reports and loop is not None and ingestor is not None:
                loop.call_soon_threadsafe(ingestor.stop)

    def on_report(report) -> None:
        if print_reports:
            say(
                f"{report.camera_id:12s} {report.verdict:9s} {report.part:16s} {report.report_id}"
                + (f"  {report.description[:80]}" if report.description else ""),
                markup=False,
            )

    def started(running) -> None:
        nonlocal loop, ingestor
        loop, ingestor = asyncio.get_running_loop(), running

    loop: asyncio.AbstractEventLoop | None = None
    ingestor = None
    tracing = None if dry_run else setup_tracing(settings.tracing, "ingest")
    tracing_var.set(tracing)  # before asyncio.run: its tasks copy this context
    try:
        result = asyncio.run(
            run(
                settings,
                dry_run=dry_run,
                max_reports=max_reports,
                on_report=on_report,
                on_decision=on_decision if dry_run else None,
                on_start=started,
            )
        )
    except EdgeInspectError as exc:
        say(f"[red]ingest failed:[/] {exc}")
        raise typer.Exit(1) from exc
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports the spans still queued
    for cid, state in result.states.items():
        say(f"camera {cid}: {state.value}", style="dim")
    if dry_run:
        _print_dry_run_summary(say, decisions)
    else:
        for line in failure_lines(result.failures, settings.gateway, delivered=len(result.reports)):
            say(f"[red]{line}[/]" if not result.reports else f"[yellow]{line}[/]", markup=True, soft_wrap=True)
    if stdout_closed:
        # The reader of our output has gone (`| head`): end quietly with a SIGPIPE'd tool's status (stdout
        # already points at /dev/null, so Python's flush at exit has nothing to report).
        raise typer.Exit(128 + signal.SIGPIPE)
    if not dry_run and result.failures and not result.reports:
        raise typer.Exit(1)


# What to check, by the status every failed frame ended with.
_HINTS = {
    "UNAUTHENTICATED": "check api_token",
    "PERMISSION_DENIED": "check api_token",
    "UNAVAILABLE": "is the gateway running at {gateway}?",
    "DEADLINE_EXCEEDED": "the gateway took longer than request_timeout_s",
    "RESOURCE_EXHAUSTED": "the gateway is full; fewer cameras or a lower sampling rate",
    "INVALID_ARGUMENT": "the gateway refused the request itself",
}


_VERBS = {"UNAVAILABLE": "gateway unreachable for", "DEADLINE_EXCEEDED": "gateway too slow for"}


def failure_lines(failures: dict[str, tuple[int, str]], gateway: str, delivered: int) -> list[str]:
    """One line per cause of failed frames: status, how many, an example message, what to check."""
    lines = []
    for code, (count, example) in sorted(failures.items(), key=lambda kv: -kv[1][0]):
        hint = _HINTS.get(code, "see the ingest log").format(gateway=gateway)
        which = "every frame" if not delivered and len(failures) == 1 else f"{count} frame{'s' if count > 1 else ''}"
        verb = _VERBS.get(code, "gateway refused")
        lines.append(f"{verb} {which}: {code} ({hint}): {example}")
    return lines


def _print_dry_run_summary(say, decisions: dict[str, list[tuple[int, float | None, bool, str]]]) -> None:
    for camera, rows in decisions.items():
        skipped = Counter(reason.split(" (")[0] for _, _, inspect, reason in rows if not inspect)
        reasons = ", ".join(f"{r}: {n}" for r, n in skipped.most_common()) or "none"
        inspected = sum(1 for r in rows if r[2])
        say(
            f"{camera}: {len(rows)} frames read, {inspected} would be inspected; skipped by reason: {reasons}",
            markup=False,
            soft_wrap=True,
        )
