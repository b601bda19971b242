"""`edgeinspect status`: the cluster as the gateway sees it, plus local pids when `up` runs on this box."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import typer
from google.protobuf.json_format import MessageToDict

from edgeinspect.cli.options import CA, GATEWAY, TOKEN, TOKEN_FILE_OPTION, WORKDIR

STACK_FILE = Path("run") / "stack.json"  # written by `up` under its workdir


def local_roles(workdir: Path) -> dict[str, dict]:
    """address -> role entry of the stack `up` runs from `workdir` (empty when none does)."""
    path = workdir / STACK_FILE
    try:
        roles = json.loads(path.read_text()).get("roles", [])
    except (OSError, ValueError):
        return {}
    return {r.get("address", ""): r for r in roles}


def status_command(
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE_OPTION,
    ca: Path | None = CA,
    workdir: Path = typer.Option(WORKDIR, help="the `up` workdir, for local pids"),
    as_json: bool = typer.Option(False, "--json", help="print the status as JSON"),
) -> None:
    """Every decoder-stage endpoint (range, health, ban reason, load), the plan in force, every vision and
    retrieval replica (health, load, which served last, banks) and the inspections in flight, as the gateway sees
    them. Exit 1 when the gateway is not serving."""
    from rich.console import Console
    from rich.table import Table

    from edgeinspect.services.client import InspectionClient, resolve_token
    from edgeinspect.v1 import inspection_pb2

    console = Console()
    try:
        with InspectionClient(gateway, resolve_token(token, token_file), ca=ca) as client:
            status = client.call("GetClusterStatus", inspection_pb2.ClusterStatusRequest(), timeout_s=10)
    except grpc.RpcError as err:
        typer.echo(f"cannot read the cluster status from {gateway}: {err.code().name}: {err.details()}", err=True)
        raise typer.Exit(2) from None
    pids = local_roles(workdir)
    if as_json:
        data = MessageToDict(status, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        for entry in (*data["stages"], *data["vision_replicas"], *data["retrieval_replicas"]):
            entry["pid"] = pids.get(entry["address"], {}).get("pid")
        print(json.dumps(data, indent=2))
        raise typer.Exit(0 if status.serving else 1)
    state = "[green]SERVING[/green]" if status.serving else "[red]NOT SERVING[/red]"
    if status.serving and status.degraded:
        state = "[yellow]SERVING, degraded[/yellow]"
    console.print(f"gateway {gateway}: {state}   plan: {status.plan}   normal: {' '.join(status.normal_plan)}")
    console.print(
        f"vision {status.vision}   retrieval {status.retrieval or '-'}   inspections {status.inflight} running, "
        f"{status.queued} queued (limits {status.max_inflight} + {status.max_queued})   failovers {status.failovers}"
    )
    table = Table("endpoint", "pid", "layers", "home", "state", "sessions", "KV", "last step", "why")
    for s in status.stages:
        kv = f"{s.kv_bytes / 2**20:.0f}/{s.kv_budget_bytes / 2**20:.0f} MiB" if s.kv_budget_bytes else "-"
        colour = {"healthy": "green", "banned": "yellow", "connecting": "yellow"}.get(s.state, "red")
        table.add_row(
            s.address,
            str(pids.get(s.address, {}).get("pid", "-")),
            f"[{s.layer_start},{s.layer_end})" if s.layer_end > 0 else "?",
            f"[{s.home_start},{s.home_end})" if s.home_end > 0 else "?",
            f"[{colour}]{s.state}[/{colour}]",
            f"{s.sessions} ({s.live_sessions} live)",
            kv,
            f"{s.last_step_ms:.1f} ms" if s.last_step_ms else "-",
            s.reason,
        )
    console.print(table)
    replicas = Table("vision / retrieval", "pid", "state", "in flight", "served", "last", "banks", "why")
    for role, reps in (("vision", status.vision_replicas), ("retrieval", status.retrieval_replicas)):
        for r in reps:
            colour = {"healthy": "green", "banned": "yellow", "connecting": "yellow"}.get(r.state, "red")
            behind = f" (behind: {', '.join(r.behind)})" if r.behind else ""
            replicas.add_row(
                f"{role} {r.address}",
                str(pids.get(r.address, {}).get("pid", "-")),
                f"[{colour}]{r.state}[/{colour}]",
                str(r.inflight),
                str(r.served),
                f"<- {r.last_ms:.0f} ms" if r.last else "",
                " ".join(sorted(r.banks.values())) + behind,
                r.reason,
            )
    console.print(replicas)
    for note in status.notes:
        console.print(f"  - {note}")
    raise typer.Exit(0 if status.serving else 1)
