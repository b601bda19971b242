"""`edgeinspect deploy smoke`: one inspection through a deployed gateway, with time to first token and per-token
time. The last step of the deployment guide, and the multi-box test's and network benchmark's client."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

# StageTiming names the gateway puts in every report (wire_ms carries the value, in ms).
TTFT_TIMING = "time_to_first_token"
PER_TOKEN_TIMING = "decode_per_token"
NETWORK_TIMING = "network_per_token"


def inspect_once(
    gateway: str,
    image: bytes,
    token: str,
    station: str,
    part: str,
    timeout_s: float,
    max_new_tokens: int = 0,
    ca: Path | None = None,
) -> dict:
    """Streams one inspection; returns the report's ids, tokens and partition, the gateway's TTFT and per-token
    time, and when the client saw its first text (seconds). Raises grpc.RpcError when the gateway refuses."""
    from edgeinspect.services.client import InspectionClient
    from edgeinspect.v1 import inspection_pb2

    arrivals: list[float] = []
    with InspectionClient(gateway, token, timeout_s=timeout_s, ca=ca) as client:
        start = time.perf_counter()
        report = client.inspect(
            image,
            station=station,
            part=part,
            max_new_tokens=max_new_tokens,
            on_delta=lambda _text: arrivals.append(time.perf_counter()),
        )
        total = time.perf_counter() - start
    if report is None:
        raise RuntimeError("the stream ended without a report")
    ms = {t.stage: t.wire_ms for t in report.timings}
    tokens = len(report.generated_token_ids)
    return {
        "report_id": report.report_id,
        "verdict": inspection_pb2.Verdict.Name(report.verdict),
        "token_ids": list(report.generated_token_ids),
        "tokens": tokens,
        "partition": list(report.model.partition),
        "codec": report.model.codec,
        # Measured at the gateway: image in -> first generated token (vision, prefill through every stage).
        "ttft_s": ms[TTFT_TIMING] / 1e3 if TTFT_TIMING in ms else None,
        "per_token_s": ms[PER_TOKEN_TIMING] / 1e3 if PER_TOKEN_TIMING in ms and tokens > 1 else None,
        "network_per_token_s": ms[NETWORK_TIMING] / 1e3 if NETWORK_TIMING in ms and tokens > 1 else None,
        # As this client sees it: request sent -> first streamed text (later than TTFT when the first tokens
        # decode to no text yet), and the whole call.
        "client_first_text_s": arrivals[0] - start if arrivals else None,
        "total_s": total,
    }


def _ms(seconds: float | None, digits: int = 0) -> str:
    return f"{seconds * 1e3:.{digits}f} ms" if seconds is not None else "-"


def smoke_command(
    gateway: str = typer.Option(..., "--gateway", "-g", help="host:port of the gateway, e.g. 10.20.7.10:50051"),
    image: Path = typer.Option(..., "--image", exists=True, dir_okay=False, help="a part photo (JPEG/PNG)"),
    token: str = typer.Option(
        "", "--token", envvar="EDGEINSPECT_API_TOKEN", help="bearer token (default: $EDGEINSPECT_API_TOKEN)"
    ),
    station: str = typer.Option("smoke-test", "--station", help="station recorded in the report"),
    part: str = typer.Option("", "--part", help="part number (filters the spec context)"),
    max_new_tokens: int = typer.Option(0, "--max-new-tokens", min=0, help="generation budget (0: the gateway's)"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds the whole inspection may take"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of a summary"),
    ca: Path | None = typer.Option(
        None, "--ca", envvar="EDGEINSPECT_CA", help="the plant CA certificate (a TLS gateway; plant.tls is the default)"
    ),
) -> None:
    """Run one inspection through the gateway and print the report id, verdict, TTFT and per-token time."""
    import grpc

    try:
        result = inspect_once(gateway, image.read_bytes(), token, station, part, timeout, max_new_tokens, ca)
    except grpc.RpcError as err:
        typer.echo(f"inspection through {gateway} failed: {err.code().name}: {err.details()}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(
        f"report {result['report_id']}: {result['verdict']}, {result['tokens']} tokens, "
        f"TTFT {_ms(result['ttft_s'])}, {_ms(result['per_token_s'], 1)}/token "
        f"(network {_ms(result['network_per_token_s'], 1)}/token), {result['total_s']:.2f} s in all"
    )
