"""`edgeinspect deploy smoke`: one inspection through a deployed gateway, with time to first token and per-token
time as the caller sees them. The last step of the deployment guide, and the multi-box test's client."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer


def inspect_once(gateway: str, image: bytes, token: str, station: str, part: str, timeout_s: float) -> dict:
    """Streams one inspection; returns the report's ids and tokens plus client-side timings (seconds)."""
    import grpc

    from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

    request = inspection_pb2.InspectRequest(image=image, station=station, part=part)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(gateway) as channel:
        stub = inspection_pb2_grpc.InspectionServiceStub(channel)
        start = time.perf_counter()
        arrivals: list[float] = []
        report = None
        for event in stub.InspectStream(request, metadata=metadata, timeout=timeout_s):
            if event.HasField("delta"):
                arrivals += [time.perf_counter()] * len(event.delta.token_ids)
            else:
                report = event.report
    if report is None:
        raise RuntimeError("the stream ended without a report")
    total = time.perf_counter() - start
    n = len(arrivals)
    return {
        "report_id": report.report_id,
        "verdict": inspection_pb2.Verdict.Name(report.verdict),
        "token_ids": list(report.generated_token_ids),
        "ttft_s": arrivals[0] - start if arrivals else None,
        "per_token_s": (arrivals[-1] - arrivals[0]) / (n - 1) if n > 1 else None,
        "tokens": n,
        "total_s": total,
    }


def smoke_command(
    gateway: str = typer.Option(..., "--gateway", "-g", help="host:port of the gateway, e.g. 10.20.7.10:50051"),
    image: Path = typer.Option(..., "--image", exists=True, dir_okay=False, help="a part photo (JPEG/PNG)"),
    token: str = typer.Option(
        "", "--token", envvar="EDGEINSPECT_API_TOKEN", help="bearer token (default: $EDGEINSPECT_API_TOKEN)"
    ),
    station: str = typer.Option("smoke-test", "--station", help="station recorded in the report"),
    part: str = typer.Option("", "--part", help="part number (filters the spec context)"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds the whole inspection may take"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of a summary"),
) -> None:
    """Run one inspection through the gateway and print the report id, verdict, TTFT and per-token time."""
    result = inspect_once(gateway, image.read_bytes(), token, station, part, timeout)
    if as_json:
        typer.echo(json.dumps(result))
        return
    ttft = f"{result['ttft_s'] * 1e3:.0f} ms" if result["ttft_s"] is not None else "-"
    per = f"{result['per_token_s'] * 1e3:.1f} ms" if result["per_token_s"] is not None else "-"
    typer.echo(
        f"report {result['report_id']}: {result['verdict']}, {result['tokens']} tokens, "
        f"TTFT {ttft}, {per}/token, {result['total_s']:.2f} s in all"
    )
