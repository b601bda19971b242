"""`edgeinspect serve | up | demo`: run one role, or every role on this box (the embedded default)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from enum import StrEnum
from pathlib import Path

import typer

from edgeinspect.cli.options import WORKDIR, client_command
from edgeinspect.config import WireCodec
from edgeinspect.services.gateway.settings import AnomalyPolicy


class Role(StrEnum):
    vision = "vision"
    stage = "stage"
    retrieval = "retrieval"
    gateway = "gateway"
    console = "console"
    ingest = "ingest"


def serve_command(
    role: Role = typer.Argument(..., help="which role this process serves"),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML settings; EDGEINSPECT_* env overrides"),
) -> None:
    """Serve one role (vision, stage, retrieval, gateway, console or ingest) until Ctrl-C / SIGTERM."""
    import importlib

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    importlib.import_module(f"edgeinspect.services.{role.value}.server").main(config)


def _stack_options(checkpoint, stages, codec, port, workdir, kb, **more):
    from edgeinspect.stack.launcher import StackOptions

    return StackOptions(
        workdir=workdir.resolve(),
        checkpoint=checkpoint,
        stages=stages,
        codec=codec,
        gateway_port=port,
        kb_dir=kb,
        **more,
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


def _indexed_kb(kb: Path) -> Path:
    """A knowledge base the user indexed (`edgeinspect kb index`), checked before any role starts."""
    from edgeinspect.rag.store import current_version

    kb = kb.resolve()
    if current_version(kb) is None:
        raise typer.BadParameter(f"{kb} holds no index; build one with `edgeinspect kb index SPECS --kb {kb}`")
    return kb


def up_command(
    checkpoint: Path | None = typer.Option(None, help="DeepSeek-VL checkpoint folder (default: generated tiny one)"),
    stages: int = typer.Option(2, min=1, help="decoder stages: layer ranges the language model is split into"),
    replicas: int = typer.Option(1, min=1, help="processes serving each layer range (each its own port)"),
    vision_replicas: int = typer.Option(
        1, min=1, help="vision processes (each its own port; the gateway uses a healthy one, retries on another)"
    ),
    retrieval_replicas: int = typer.Option(1, min=1, help="retrieval processes over the same knowledge base"),
    gateways: int = typer.Option(
        1, min=1, help="gateway processes serving the public API (> 1: a pair; needs --store-dsn, PostgreSQL)"
    ),
    store_dsn: str = typer.Option(
        "",
        "--store-dsn",
        envvar="EDGEINSPECT_STORE_DSN",
        help="PostgreSQL the gateways share (postgresql://USER:PASS@HOST/DB); default: SQLite in the workdir",
    ),
    codec: WireCodec = typer.Option(WireCodec.fp16, help="tensor codec between nodes"),
    port: int = typer.Option(50051, help="gateway port"),
    workdir: Path = typer.Option(
        WORKDIR, help="folder for configs, logs, the report database and the KB (default: $EDGEINSPECT_WORKDIR)"
    ),
    kb: Path | None = typer.Option(
        None, "--kb", help="knowledge base folder from `edgeinspect kb index` (default: the sample KB, indexed once)"
    ),
    no_kb: bool = typer.Option(False, "--no-kb", help="run without the retrieval node"),
    tls: bool = typer.Option(False, "--tls", help="mTLS between the roles, TLS on the public API (CA in WORKDIR/tls)"),
    allow_unauthenticated: bool = typer.Option(
        False, "--allow-unauthenticated", help="the gateway takes calls without a token (loopback development only)"
    ),
    restart: bool = typer.Option(
        True, "--restart/--no-restart", help="restart a crashed role on its port with backoff (off: any exit stops all)"
    ),
    mqtt: str | None = typer.Option(
        None, "--mqtt", help="publish every result to this broker: mqtt://HOST:PORT (mqtts:// for TLS)"
    ),
    console_port: int = typer.Option(8080, help="web console HTTP port (0: a free one; -1: no console)"),
    anomaly: AnomalyPolicy = typer.Option(
        AnomalyPolicy.gate, "--anomaly", help="every station's anomaly gate policy (a part with no bank runs the VLM)"
    ),
    gate_station: list[str] = typer.Option(
        [], "--gate-station", help="a station that uses the gate whatever --anomaly says (repeatable)"
    ),
    banks: Path | None = typer.Option(None, "--banks", help="anomaly banks folder (default: WORKDIR/banks)"),
) -> None:
    """Start every role on this box as separate processes (the embedded default); Ctrl-C, SIGTERM or SIGHUP stops
    them all. run/stack.json in the workdir lists every role's pid and address while it runs."""
    from rich.console import Console

    from edgeinspect.services.common.lifecycle import signals_as_interrupt, signals_ignored
    from edgeinspect.stack.launcher import LocalStack

    if kb is not None and no_kb:
        raise typer.BadParameter("--kb and --no-kb exclude each other")
    outputs_env = _mqtt_env(mqtt)  # a bad URL fails before the KB is indexed or a process starts
    console = Console()
    _log_to(console)
    kb_dir = None if no_kb else _indexed_kb(kb) if kb is not None else _ensure_kb(workdir)
    stack = LocalStack(
        _stack_options(
            checkpoint,
            stages,
            codec,
            port,
            workdir,
            kb_dir,
            replicas=replicas,
            vision_replicas=vision_replicas,
            retrieval_replicas=retrieval_replicas,
            gateways=gateways,
            store_dsn=store_dsn,
            supervise=restart,
            tls=tls,
            allow_unauthenticated=allow_unauthenticated,
            extra_env=outputs_env,
            console_port=None if console_port < 0 else console_port,
            anomaly=anomaly.value,
            gate_stations=tuple(gate_station),
            banks_dir=banks.resolve() if banks else None,
        )
    )
    code = 0
    try:
        # A background `up` started by a script ignores SIGINT: SIGTERM/SIGHUP must stop it the same way.
        with signals_as_interrupt():
            stack.start()
            _print_banner(console, stack)
            if stack.console_url:
                console.print(f"  web console {stack.console_url} (log in with the token)", highlight=False)
            if mqtt:
                console.print(f"  every result to {mqtt}: edgeinspect/<station>/<camera>/result", highlight=False)
            code = _serve_until_stopped(stack, console)
    except KeyboardInterrupt:
        console.print("stopping ...")
    finally:
        with signals_ignored():  # a second Ctrl-C must not leave half the roles running
            stack.stop()
    if code:
        raise typer.Exit(code)


def _mqtt_env(url: str | None) -> dict[str, str]:
    from edgeinspect.errors import InvalidInput
    from edgeinspect.services.outputs.config import mqtt_outputs_env

    try:
        return mqtt_outputs_env(url) if url else {}
    except InvalidInput as exc:
        raise typer.BadParameter(str(exc), param_hint="--mqtt") from exc


def _log_to(console) -> None:
    """The launcher's records (restarts, give-ups) on the terminal; the roles log to their own files."""
    import logging

    from rich.logging import RichHandler

    handler = RichHandler(console=console, show_path=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("edgeinspect")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _print_banner(console, stack) -> None:
    for role in stack.roles:
        layers = f"layers [{role.layers[0]}, {role.layers[1]})" if role.layers else ""
        console.print(
            f"  {role.name:<10} pid {role.pid:<7} {stack.address_of(role.name):<21} {layers:<15} log {role.log_path}",
            highlight=False,
        )
        if stack.metrics_url(role.name):
            console.print(f"  {'':<10} metrics {stack.metrics_url(role.name)}", highlight=False)
    restarts = "crashed roles restart" if stack.opts.supervise else "any role exiting stops all"
    console.print(
        f"[green]edgeinspect is up[/green]: gateway {','.join(stack.gateway_addresses)}; "
        f"pids in {stack.stack_file}. Ctrl-C stops it; {restarts}."
    )
    _print_security(console, stack)


def _print_security(console, stack) -> None:
    """Says how the stack is secured, so plaintext or an open gateway is never a surprise."""
    o = stack.opts
    if o.tls:
        console.print(f"  mTLS between the roles, TLS on the public API; CA {stack.client_ca}", highlight=False)
    else:
        console.print(
            f"  [yellow]plaintext[/yellow] on {o.host}: any local process can call the internal roles "
            "(`up --tls` for mTLS)",
            highlight=False,
        )
    if o.allow_unauthenticated:
        console.print("  [yellow]allow_unauthenticated set[/yellow]: the gateway serves callers without a token")
    else:
        command = client_command(
            ",".join(stack.gateway_addresses), stack.creds.token_file, stack.client_ca if o.tls else None
        )
        console.print(f"  token in {stack.creds.token_file} (0600); a client from here: `{command}`", highlight=False)


def _serve_until_stopped(stack, console) -> int:
    """Blocks until a signal stops `up` (KeyboardInterrupt) or the stack cannot go on; returns the exit code."""
    while True:
        time.sleep(0.5)
        if not stack.opts.supervise:
            if any(r.proc.poll() is not None for r in stack.roles):
                console.print("[red]a role exited; stopping the others[/red]")
                return 1
        elif any(r.given_up and r.role == "gateway" for r in stack.roles):
            # Other roles given up on leave a degraded stack the gateway reports; without it nothing serves.
            console.print("[red]the gateway keeps crashing; stopping the stack[/red]")
            return 1


def demo_command(
    workdir: Path = typer.Option(
        WORKDIR, help="folder for configs, logs, the report database and the KB (default: $EDGEINSPECT_WORKDIR)"
    ),
    stages: int = typer.Option(2, help="decoder stages"),
    image: Path | None = typer.Option(None, help="image to inspect (default: the shipped sample part)"),
    ingest_reports: int = typer.Option(3, help="then ingest the sample conveyor video until this many reports"),
    gate: bool = typer.Option(True, "--gate/--no-gate", help="teach a drawn sample part, inspect a good and a bad one"),
) -> None:
    """The embedded default end to end: start every role, inspect the sample part, ingest the sample video; then the
    anomaly gate: teach a drawn sample part from good frames and inspect a good and a defective one (--no-gate skips
    it)."""
    from rich.console import Console

    from edgeinspect.assets import sample_image
    from edgeinspect.services.client import InspectionClient, print_report
    from edgeinspect.services.common.lifecycle import signals_as_interrupt
    from edgeinspect.stack.launcher import LocalStack

    console = Console()
    kb = _ensure_kb(workdir)
    image = image or sample_image()
    # SIGTERM/SIGHUP end the demo as Ctrl-C does: LocalStack's exit stops every role.
    with signals_as_interrupt(), LocalStack(_stack_options(None, stages, "fp16", 0, workdir, kb)) as stack:
        console.print(
            f"[green]{len(stack.roles)} roles up[/green] (gateway {stack.gateway_address}); inspecting {image} ..."
        )
        with InspectionClient(stack.gateway_address, stack.api_token, ca=stack.client_ca) as client:
            report = client.inspect(
                image.read_bytes(),
                station="station-3",
                part="HSG-210",
                on_delta=lambda t: console.print(t, end="", markup=False, highlight=False),
            )
            console.print()
            print_report(report)
        if gate:
            from edgeinspect.stack.gate_demo import show_gate

            show_gate(console, stack, workdir.resolve())
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
    from edgeinspect.certs import write_secret

    cfg = yaml.safe_load(asset_path("cameras.sample.yaml").read_text())
    cfg.update(gateway=gateway, api_token=token, frames_dir=str(workdir / "frames"))
    for cam in cfg["cameras"]:
        cam["loop"] = False
        gating = cam.get("sampling", {}).get("gating", {})
        if "background" in gating:
            gating["background"] = str(asset_path(gating["background"]))
    path = workdir / "run" / "cameras.yaml"
    write_secret(path, yaml.safe_dump(cfg, sort_keys=False).encode())  # it holds the stack's token
    return path
