"""`edgeinspect serve | up | inspect | demo`: run roles, the embedded default, and the client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from enum import StrEnum
from pathlib import Path

import typer

DEFAULT_GATEWAY = "127.0.0.1:50051"
DEFAULT_TOKEN = "edgeinspect-local"
WORKDIR = Path("var/embedded")


class Role(StrEnum):
    vision = "vision"
    stage = "stage"
    retrieval = "retrieval"
    gateway = "gateway"
    console = "console"


def serve_command(
    role: Role = typer.Argument(..., help="which role this process serves"),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML settings; EDGEINSPECT_* env overrides"),
) -> None:
    """Serve one role (vision, stage, retrieval or gateway) until Ctrl-C / SIGTERM."""
    import importlib

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    importlib.import_module(f"edgeinspect.services.{role.value}.server").main(config)


def _stack_options(checkpoint, stages, codec, chained, port, workdir, kb):
    from edgeinspect.services.launcher import StackOptions

    return StackOptions(
        workdir=workdir.resolve(),
        checkpoint=checkpoint,
        stages=stages,
        codec=codec,
        chained=chained,
        gateway_port=port,
        kb_dir=kb,
    )


def _ensure_kb(workdir: Path) -> Path | None:
    """Indexes the shipped sample knowledge base on first run (None if the rag extra cannot load)."""
    from rich.console import Console

    from edgeinspect.rag import sample_kb_dir
    from edgeinspect.rag.embed import Embedder
    from edgeinspect.rag.indexer import build_index
    from edgeinspect.rag.store import current_version

    kb = (workdir / "kb").resolve()
    if current_version(kb) is None:
        Console(stderr=True).print(f"Indexing the sample knowledge base into {kb} ...")
        build_index(sample_kb_dir(), kb, Embedder())
    return kb


def up_command(
    checkpoint: Path | None = typer.Option(None, help="DeepSeek-VL checkpoint folder (default: generated tiny one)"),
    stages: int = typer.Option(2, help="decoder stages (processes) to split the language model into"),
    codec: str = typer.Option("fp16", help="tensor codec between nodes: fp32, fp16, int8"),
    chained: bool = typer.Option(False, help="stages forward to each other instead of through the gateway"),
    port: int = typer.Option(50051, help="gateway port"),
    workdir: Path = typer.Option(WORKDIR, help="folder for configs, logs, the report database and the KB"),
    no_kb: bool = typer.Option(False, "--no-kb", help="run without the retrieval node"),
) -> None:
    """Start every role on this box as separate processes (the embedded default); Ctrl-C stops them."""
    from rich.console import Console

    from edgeinspect.services.launcher import LocalStack

    console = Console()
    kb = None if no_kb else _ensure_kb(workdir)
    with LocalStack(_stack_options(checkpoint, stages, codec, chained, port, workdir, kb)) as stack:
        for role in stack.roles:
            console.print(
                f"  {role.name:<10} pid {role.proc.pid:<7} {stack.opts.host}:{role.port}  log {role.log_path}"
            )
        console.print(
            f"[green]edgeinspect is up[/green]: gateway {stack.gateway_address}, token {stack.api_token}. "
            "Ctrl-C stops it."
        )
        try:
            while all(r.proc.poll() is None for r in stack.roles):
                time.sleep(0.5)
            console.print("[red]a role exited; stopping the others[/red]")
        except KeyboardInterrupt:
            console.print("stopping ...")


def inspect_command(
    images: list[Path] = typer.Argument(..., help="image files to inspect"),
    gateway: str = typer.Option(DEFAULT_GATEWAY, envvar="EDGEINSPECT_GATEWAY", help="gateway host:port"),
    token: str = typer.Option(DEFAULT_TOKEN, envvar="EDGEINSPECT_API_TOKEN", help="bearer token"),
    station: str = typer.Option("", help="station id recorded in the report"),
    part: str = typer.Option("", help="part / product id (selects the specs)"),
    prompt: str = typer.Option("", help="instruction (default: the standard defect-report request)"),
    max_new_tokens: int = typer.Option(0, help="generation budget (0: the gateway's default)"),
    stream: bool = typer.Option(False, "--stream", help="print tokens as they arrive"),
    as_json: bool = typer.Option(False, "--json", help="print each report as JSON"),
) -> None:
    """Inspect images through a running gateway and print the reports."""
    from edgeinspect.services.client import InspectionClient, print_report, report_to_dict

    with InspectionClient(gateway, token) as client:
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


def demo_command(
    workdir: Path = typer.Option(WORKDIR, help="folder for configs, logs, the report database and the KB"),
    stages: int = typer.Option(2, help="decoder stages"),
    image: Path | None = typer.Option(None, help="image to inspect (default: the shipped sample part)"),
    ingest_reports: int = typer.Option(3, help="then ingest the sample conveyor video until this many reports"),
) -> None:
    """The embedded default end to end: start every role, inspect the sample part, ingest the sample video."""
    from rich.console import Console

    from edgeinspect.assets import sample_image
    from edgeinspect.services.client import InspectionClient, print_report
    from edgeinspect.services.launcher import LocalStack

    console = Console()
    kb = _ensure_kb(workdir)
    image = image or sample_image()
    with LocalStack(_stack_options(None, stages, "fp16", False, 0, workdir, kb)) as stack:
        console.print(
            f"[green]{len(stack.roles)} roles up[/green] (gateway {stack.gateway_address}); inspecting {image} ..."
        )
        with InspectionClient(stack.gateway_address, stack.api_token) as client:
            report = client.inspect(
                image.read_bytes(),
                station="station-3",
                part="HSG-210",
                on_delta=lambda t: console.print(t, end="", markup=False, highlight=False),
            )
            console.print()
            print_report(report)
        if ingest_reports > 0:
            console.print(f"[green]Ingesting the sample conveyor video[/green]: {ingest_reports} reports as they come")
            cameras = _demo_cameras(workdir.resolve(), stack.gateway_address, stack.api_token)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "edgeinspect.cli",
                    "ingest",
                    "--config",
                    str(cameras),
                    "--max-reports",
                    str(ingest_reports),
                    "--print",
                ],
                check=True,
            )


def _demo_cameras(workdir: Path, gateway: str, token: str) -> Path:
    """The packaged sample camera config, pointed at this stack's gateway, played once."""
    import yaml

    from edgeinspect.assets import asset_path

    cfg = yaml.safe_load(asset_path("cameras.sample.yaml").read_text())
    cfg.update(gateway=gateway, api_token=token, frames_dir=str(workdir / "frames"))
    for cam in cfg["cameras"]:
        cam["loop"] = False
        gating = cam.get("sampling", {}).get("gating", {})
        if "background" in gating:
            gating["background"] = str(asset_path(gating["background"]))
    path = workdir / "run" / "cameras.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
