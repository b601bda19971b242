"""`edgeinspect rollout start|status|promote|rollback`: a candidate model version in shadow beside the live one,
compared on the same frames, promoted (canary stations first, or all) and rolled back. A client of the gateway's
RolloutService (admin token)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import typer

from edgeinspect.cli.options import CA, GATEWAY, TOKEN_FILE_OPTION

app = typer.Typer(no_args_is_help=True, help="Model versions: shadow a candidate, promote it, roll it back.")

GatewayOpt = GATEWAY
TokenOpt = typer.Option("", help="admin bearer token (default: $EDGEINSPECT_TOKEN, else --token-file)")
TokenFileOpt = TOKEN_FILE_OPTION
CaOpt = CA
JsonOpt = typer.Option(False, "--json", help="print the status as JSON")


def _call(gateway: str, token: str, token_file: Path, ca: Path | None, method: str, request):
    from edgeinspect.services.client import resolve_token
    from edgeinspect.v1 import rollout_pb2_grpc

    token = resolve_token(token, token_file)
    if ca is None:
        channel = grpc.insecure_channel(gateway)
    else:
        channel = grpc.secure_channel(gateway, grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes()))
    with channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        metadata = [("authorization", f"Bearer {token}")] if token else []
        try:
            return getattr(stub, method)(request, metadata=metadata, timeout=180)
        except grpc.RpcError as exc:
            typer.echo(f"{method}: {exc.code().name}: {exc.details()}", err=True)
            raise typer.Exit(1) from exc


def status_dict(status) -> dict:
    """RolloutStatus as plain JSON types (counts as numbers, every field present, enums by name)."""
    from google.protobuf.json_format import MessageToDict

    from edgeinspect.v1 import inspection_pb2, rollout_pb2

    def version(v) -> dict | None:
        return MessageToDict(v, preserving_proto_field_name=True, always_print_fields_with_no_presence=True) or None

    return {
        "state": rollout_pb2.RolloutState.Name(status.state),
        "live": version(status.live),
        "candidate": version(status.candidate) if status.HasField("candidate") else None,
        "previous": version(status.previous) if status.HasField("previous") else None,
        "canary_stations": list(status.canary_stations),
        "started": status.started.ToJsonString() if status.HasField("started") else None,
        "shadowed": status.shadowed,
        "agreed": status.agreed,
        "agreement": status.agreement,
        "skipped": status.skipped,
        "shadow_failed": status.shadow_failed,
        "pending": status.pending,
        "disagreements": [
            {
                "live_report_id": d.live_report_id,
                "shadow_report_id": d.shadow_report_id,
                "station": d.station,
                "image_sha256": d.image_sha256,
                "live_verdict": inspection_pb2.Verdict.Name(d.live_verdict),
                "shadow_verdict": inspection_pb2.Verdict.Name(d.shadow_verdict),
                "live_classes": list(d.live_classes),
                "shadow_classes": list(d.shadow_classes),
            }
            for d in status.disagreements
        ],
    }


def _show(status, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(status_dict(status), indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    from edgeinspect.services.evaluation.stats import rate
    from edgeinspect.v1 import inspection_pb2, rollout_pb2

    table = Table(title=f"rollout: {rollout_pb2.RolloutState.Name(status.state).removeprefix('ROLLOUT_STATE_')}")
    table.add_column("")
    table.add_column("")
    for label, ver in (("live", status.live), ("candidate", status.candidate), ("previous", status.previous)):
        if ver.name:
            table.add_row(label, f"{ver.name}  checkpoint {ver.checkpoint_fingerprint}  stages {', '.join(ver.stages)}")
    if status.canary_stations:
        table.add_row("canary stations", ", ".join(status.canary_stations))
    if status.shadowed:
        r = rate(status.agreed, status.shadowed)
        table.add_row("agreement", f"{r.k}/{r.n} = {r.value:.1%} (95% CI {r.low:.1%}-{r.high:.1%})")
    else:
        table.add_row("agreement", "no shadow reports yet")
    table.add_row("shadow", f"{status.pending} waiting, {status.skipped} skipped, {status.shadow_failed} failed")
    console = Console()
    console.print(table)
    if status.disagreements:
        dis = Table(title="disagreements (newest first)")
        for col in ("live report", "station", "live", "shadow"):
            dis.add_column(col)
        for d in status.disagreements:
            live = inspection_pb2.Verdict.Name(d.live_verdict).removeprefix("VERDICT_")
            shadow = inspection_pb2.Verdict.Name(d.shadow_verdict).removeprefix("VERDICT_")
            dis.add_row(
                d.live_report_id,
                d.station,
                f"{live} {', '.join(d.live_classes)}",
                f"{shadow} {', '.join(d.shadow_classes)}",
            )
        console.print(dis)


@app.command("start")
def start_command(
    checkpoint: Path = typer.Option(..., help="the candidate's checkpoint folder (as seen by the gateway)"),
    vision: str = typer.Option(..., help="host:port of the candidate's vision node"),
    stage: list[str] = typer.Option(..., "--stage", help="host:port of each candidate decoder stage, in layer order"),
    retrieval: str = typer.Option("", help="host:port of the candidate's retrieval node (default: the live one's)"),
    prompt: str = typer.Option("", help="the candidate's instruction for requests that bring none"),
    name: str = typer.Option("", help="version name (default: the checkpoint folder's name)"),
    in_flight: int = typer.Option(1, min=1, help="shadow inspections at once (the spare capacity it may use)"),
    queue: int = typer.Option(64, min=1, help="live reports waiting for their shadow run; beyond, skipped"),
    gateway: str = GatewayOpt,
    token: str = TokenOpt,
    token_file: Path = TokenFileOpt,
    ca: Path | None = CaOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Connect a candidate version and shadow every station with it (its reports never reach the line)."""
    from edgeinspect.v1 import rollout_pb2

    candidate = rollout_pb2.ModelVersion(
        name=name, checkpoint=str(checkpoint), vision=vision, stages=stage, retrieval=retrieval, prompt=prompt
    )
    request = rollout_pb2.StartRolloutRequest(candidate=candidate, shadow_in_flight=in_flight, shadow_queue=queue)
    _show(_call(gateway, token, token_file, ca, "StartRollout", request), as_json)


@app.command("status")
def status_command(
    disagreements: int = typer.Option(20, min=1, help="disagreements to list"),
    gateway: str = GatewayOpt,
    token: str = TokenOpt,
    token_file: Path = TokenFileOpt,
    ca: Path | None = CaOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The versions, the state, and how the shadow agrees with the live version (with its 95% interval)."""
    from edgeinspect.v1 import rollout_pb2

    request = rollout_pb2.RolloutStatusRequest(max_disagreements=disagreements)
    _show(_call(gateway, token, token_file, ca, "GetRolloutStatus", request), as_json)


@app.command("promote")
def promote_command(
    station: list[str] = typer.Option([], "--station", help="canary station (repeatable); none: every station"),
    gateway: str = GatewayOpt,
    token: str = TokenOpt,
    token_file: Path = TokenFileOpt,
    ca: Path | None = CaOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Make the candidate live: for the canary stations given, or for every station (traffic, configuration and
    weights switch together; the replaced version stays connected for a rollback)."""
    from edgeinspect.v1 import rollout_pb2

    request = rollout_pb2.PromoteRolloutRequest(stations=station)
    _show(_call(gateway, token, token_file, ca, "PromoteRollout", request), as_json)


@app.command("rollback")
def rollback_command(
    gateway: str = GatewayOpt,
    token: str = TokenOpt,
    token_file: Path = TokenFileOpt,
    ca: Path | None = CaOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Make the version that was live before the rollout live again for every station."""
    from edgeinspect.v1 import rollout_pb2

    _show(_call(gateway, token, token_file, ca, "RollbackRollout", rollout_pb2.RollbackRolloutRequest()), as_json)
