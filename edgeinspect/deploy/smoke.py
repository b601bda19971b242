"""One inspection through a deployed gateway, with time to first token and per-token time: what
`edgeinspect deploy smoke` (edgeinspect/cli/deploy.py) runs, and the multi-box test's and network benchmark's client."""

from __future__ import annotations

import time
from pathlib import Path

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
