"""One grpc.health.v1 Check of a server, light enough for a container HEALTHCHECK: it imports grpc and the health
stubs only. `edgeinspect healthcheck` runs the same check behind the whole CLI, whose imports took 19 s in a
container whose box was loading its models: past the 5 s a compose healthcheck waits, so the box never turned
healthy. The image's `edgeinspect-healthcheck` script is this module's `main`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

POLL_S = 0.25
# gRPC backs off reconnecting after refused connections (1 s growing by 1.6x to 120 s): polling one channel for a
# server that takes minutes to start would notice it up to minutes late. Cap the backoff near the poll interval.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def check(
    address: str,
    service: str = "",
    timeout_s: float = 3.0,
    wait_s: float = 0.0,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> tuple[bool, str]:
    """(serving, status in words) of the server at `address`; with `wait_s`, asks until SERVING or the time is up."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    serving = health_pb2.HealthCheckResponse.SERVING
    deadline = time.monotonic() + wait_s
    if ca is None:
        channel = grpc.insecure_channel(address, options=RECONNECT_OPTIONS)
    else:
        creds = grpc.ssl_channel_credentials(
            ca.read_bytes(), key.read_bytes() if key else None, cert.read_bytes() if cert else None
        )
        channel = grpc.secure_channel(address, creds, options=RECONNECT_OPTIONS)
    with channel:
        check = health_pb2_grpc.HealthStub(channel).Check  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Check
        while True:
            try:
                reply = check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
                status, ok = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), reply.status == serving
            except grpc.RpcError as err:
                status, ok = f"{err.code().name}: {err.details()}", False
            if ok or time.monotonic() + POLL_S > deadline:
                return ok, status
            time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    """`edgeinspect-healthcheck [--ca F --cert F --key F] HOST:PORT`: exit 0 when SERVING, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="edgeinspect-healthcheck", description=main.__doc__)
    parser.add_argument("address", help="host:port of an edgeinspect server")
    parser.add_argument("--service", default="", help="grpc.health.v1 service name ('' = the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for one answer")
    parser.add_argument("--wait", type=float, default=0.0, help="keep asking this many seconds until SERVING")
    parser.add_argument("--ca", type=Path, help="CA certificate: ask over TLS, verifying the server")
    parser.add_argument("--cert", type=Path, help="client certificate (an mTLS server requires one)")
    parser.add_argument("--key", type=Path, help="its private key")
    args = parser.parse_args(argv)
    ok, status = check(args.address, args.service, args.timeout, args.wait, args.ca, args.cert, args.key)
    print(f"{args.address}: {status}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
