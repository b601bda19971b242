"""`edgeinspect line plc-sim`: play the PLC side of the handshake against a station, before the real PLC is wired."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("plc-sim")
def plc_sim_command(
    endpoint: str = typer.Option("opc.tcp://127.0.0.1:4840/edgeinspect/", "--endpoint", help="the station server"),
    station: str = typer.Option(..., "--station", help="station object (the camera's `station` in cameras.yaml)"),
    cycles: int = typer.Option(10, "--cycles", min=1, help="handshakes to run"),
    recipe: str = typer.Option("", "--recipe", help="Recipe input: part number (empty: the camera's part)"),
    lot: str = typer.Option("", "--lot", help="LotId input, recorded with each cycle"),
    timeout_s: float = typer.Option(30.0, "--timeout", help="give up on a cycle's ResultReady after this long"),
    skip_ack: bool = typer.Option(False, "--no-ack", help="never set ResultAck (watch Error=ack_timeout)"),
    namespace: str = typer.Option("urn:edgeinspect:line", "--namespace", help="namespace URI of the stations"),
    certificate: Path | None = typer.Option(None, "--cert", help="client certificate (Basic256Sha256)"),
    private_key: Path | None = typer.Option(None, "--key", help="its private key"),
) -> None:
    """Run CYCLES handshakes: wait TriggerReady, set Trigger, wait ResultReady, read the results, ack; one row each."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from edgeinspect.errors import Unavailable
    from edgeinspect.services.line.plcsim import PlcSim

    console = Console()
    table = Table(title=f"{station} @ {endpoint}")
    for column in ("cycle", "line", "defect class", "report id", "error", "trigger→result ms", "ack→ready ms"):
        table.add_column(column, justify="right" if "ms" in column or column == "cycle" else "left")
    colors = {"OK": "green", "NG": "red", "RECHECK": "yellow"}
    done = []

    async def run() -> None:
        async with PlcSim(endpoint, station, namespace, certificate=certificate, private_key=private_key) as plc:
            with Live(table, console=console, refresh_per_second=8):
                for _ in range(cycles):
                    c = await plc.cycle(ack=not skip_ack, result_timeout_s=timeout_s, recipe=recipe, lot_id=lot)
                    done.append(c)
                    table.add_row(
                        str(c.cycle),
                        f"[{colors.get(c.line, 'white')}]{c.line}[/]",
                        c.defect_class or "-",
                        c.report_id or "-",
                        "-" if c.error == 0 else f"[red]{c.error} {c.error_name}[/]",
                        f"{c.trigger_to_result_ms:.1f}",
                        "-" if c.ack_to_ready_ms is None else f"{c.ack_to_ready_ms:.1f}",
                    )
                    if skip_ack:  # let the station time the ack out before the next trigger
                        await plc.wait("TriggerReady", True, timeout_s)

    try:
        asyncio.run(run())
    except Unavailable as exc:
        console.print(f"[red]plc-sim:[/] {exc}")
        raise typer.Exit(2) from exc
    except TimeoutError as exc:
        console.print(f"[red]plc-sim: cycle {len(done) + 1} stuck:[/] {exc}")
        raise typer.Exit(1) from exc
    times = [c.trigger_to_result_ms for c in done]
    counts = {word: sum(c.line == word for c in done) for word in ("OK", "NG", "RECHECK")}
    console.print(
        f"{len(done)} cycles: " + ", ".join(f"{k} {v}" for k, v in counts.items())
        + f"; errors {sum(c.error != 0 for c in done)}; trigger→result median {statistics.median(times):.1f} ms,"
        f" max {max(times):.1f} ms"
    )  # fmt: skip
