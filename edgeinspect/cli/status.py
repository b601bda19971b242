"""`edgeinspect status`: the cluster as the gateway sees it, plus local pids when `up` runs on this box."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import typer
from google.protobuf.json_format import MessageToDict

from edgeinspect.cli.options import CA, GATEWAY, TOKEN, TOKEN_FILE_OPTION, WORKDIR

if TYPE_CHECKING:
    from edgeinspect.services.client import InspectionClient
    from edgeinspect.services.cluster_view import GatewayRow

STACK_FILE = Path("run") / "stack.json"  # written by `up` under its workdir
GATEWAY_SERVICE = "edgeinspect.v1.InspectionService"  # the gateway's health is this service's
HEALTH_TIMEOUT_S = 2.0
STATE_COLOURS = {"healthy": "green", "banned": "yellow", "connecting": "yellow", "behind": "yellow"}


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
    """Every vision, decoder-stage and retrieval replica (health: healthy, down, banned, behind on a bank or the KB
    index; load; which one served last; what it serves), the plan in force, the inspections in flight, and the
    gateways this client holds, as the gateway sees them. Exit 1 when the gateway is not serving."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from edgeinspect.services.client import InspectionClient, resolve_token
    from edgeinspect.services.cluster_view import replica_rows
    from edgeinspect.v1 import inspection_pb2

    console = Console()
    try:
        with InspectionClient(gateway, resolve_token(token, token_file), ca=ca) as client:
            status = client.call("GetClusterStatus", inspection_pb2.ClusterStatusRequest(), timeout_s=10)
            gateways = gateway_rows(client)
    except grpc.RpcError as err:
        typer.echo(f"cannot read the cluster status from {gateway}: {err.code().name}: {err.details()}", err=True)
        raise typer.Exit(2) from None
    pids = local_roles(workdir)
    if as_json:
        data = MessageToDict(status, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        for entry in (*data["stages"], *data["vision_replicas"], *data["retrieval_replicas"]):
            entry["pid"] = pids.get(entry["address"], {}).get("pid")
        data["gateways"] = [asdict(g) for g in gateways]
        print(json.dumps(data, indent=2))
        raise typer.Exit(0 if status.serving else 1)
    state = "[green]SERVING[/green]" if status.serving else "[red]NOT SERVING[/red]"
    if status.serving and status.degraded:
        state = "[yellow]SERVING, degraded[/yellow]"
    console.print(f"gateway {gateway}: {state}   plan: {status.plan}   normal: {' '.join(status.normal_plan)}")
    console.print(
        f"vision {status.vision}   retrieval {status.retrieval or '-'}"
        + (f" on index {status.retrieval_index}" if status.retrieval_index else "")
        + f"   inspections {status.inflight} running, {status.queued} queued (limits {status.max_inflight} + "
        f"{status.max_queued})   failovers {status.failovers}"
    )
    table = Table("role", "endpoint", "pid", "state", "last", "load", "serves", "why")
    for row in replica_rows(status):
        colour = STATE_COLOURS.get(row.state, "red")
        table.add_row(
            row.role,
            row.address,
            str(pids.get(row.address, {}).get("pid", "-")),
            f"[{colour}]{row.state}[/{colour}]",
            "<- last" if row.last else "",
            row.load,
            escape(row.version),
            escape(row.why),
        )
    console.print(table)
    held = Table("gateway", "state", "this client's")
    for g in gateways:
        colour = "green" if g.state == "serving" else "red"
        held.add_row(g.address, f"[{colour}]{g.state}[/{colour}]", "<- current" if g.current else "")
    console.print(held)
    gates = Table("station", "gate policy", "a flagged frame")
    for g in status.stations:
        gates.add_row("(every other)" if g.station == "*" else g.station, g.policy, g.flagged or "-")
    console.print(gates)
    for d in status.drift:
        if d.frames >= 20:
            mark = "[red]drifting toward the OK cut[/red]" if d.drifting else "clear"
            console.print(f"  {d.station} / {d.part}: passed parts' p90 score {100 * d.p90_ratio:.0f}% of the "
                          f"threshold over {d.frames} frames: {mark}")  # fmt: skip
    if status.explaining:
        console.print(f"  {status.explaining} explanation(s) running after their decision went to the line")
    for note in status.notes:
        console.print(f"  - {escape(note)}")
    raise typer.Exit(0 if status.serving else 1)


def gateway_rows(client: InspectionClient) -> list[GatewayRow]:
    """Each gateway `client` holds: its health, and whether it is the one the client calls now."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from edgeinspect.services.cluster_view import GatewayRow

    current = client.gateways.order()[0]
    rows = []
    for i, (address, channel) in enumerate(zip(client.gateways.addresses, client.channels, strict=True)):
        request = health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE)
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            check = stub.Check  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Check
            answer = check(request, timeout=HEALTH_TIMEOUT_S)
            state = "serving" if answer.status == health_pb2.HealthCheckResponse.SERVING else "not serving"
        except grpc.RpcError as exc:
            state = f"unreachable ({exc.code().name.lower()})"
        rows.append(GatewayRow(address, state, i == current))
    return rows
