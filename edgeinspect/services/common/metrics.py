"""Prometheus metrics shared by the roles, and the /metrics HTTP endpoint.

The families of the RPC layer and of the inspection path are defined here, unregistered; a role's server registers
its own (ROLE_FAMILIES) on the default registry when it starts, so a vision node's /metrics has no KV gauges and a
stage's no inspection histograms. The few that belong to one component are declared beside it and exist only in the
processes that import it: the vision encoder's (services/vision/encoder.py), the retrieval index's
(services/retrieval/server.py) and the line outputs' (services/outputs/fanout.py: gateway and ingest).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family

logger = logging.getLogger(__name__)

# A `_created` series per family doubles what every scrape stores and no dashboard reads it.
disable_created_metrics()

# 1 ms (a loopback unary) .. 60 s (a long generation stream).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# A whole inspection: 100 ms (a cached verification on a fast box) .. 5 min (a long report on a Pi).
INSPECTION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# One stage step: 0.5 ms (a decode step of a few tiny layers) .. 10 s (a long prefill chunk on a Pi).
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

RPC_REQUESTS = Counter(
    "edgeinspect_rpc_requests",
    "RPCs handled, by final status code",
    ["role", "service", "method", "code"],
    registry=None,
)
RPC_LATENCY = Histogram(
    "edgeinspect_rpc_latency_seconds",
    "RPC handling time (whole stream for streams)",
    ["role", "service", "method"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
WIRE_BYTES = Counter(
    "edgeinspect_wire_bytes", "tensor payload bytes on the wire", ["role", "codec", "direction"], registry=None
)
TOKENS = Counter("edgeinspect_tokens", "tokens generated or processed", ["role"], registry=None)
# stage: the layer range, as in edgeinspect_stage_step_seconds ("stage[0,3)"), so replicas and ranges show apart.
KV_SESSIONS = Gauge("edgeinspect_kv_sessions", "sessions holding a KV cache", ["role", "stage"], registry=None)
KV_BYTES = Gauge("edgeinspect_kv_bytes", "bytes held by KV caches", ["role", "stage"], registry=None)
PREFIX_CACHE = Counter(
    "edgeinspect_prefix_cache_lookups",
    "sessions asking to start from a cached prompt prefix",
    ["role", "result"],
    registry=None,
)
INSPECTIONS = Counter(
    "edgeinspect_inspections", "finished inspections by station and verdict", ["station", "verdict"], registry=None
)
INSPECTION_SECONDS = Histogram(
    "edgeinspect_inspection_duration_seconds",
    "one inspection once admitted, to its stored report (vision, retrieval, prefill, decode, store)",
    buckets=INSPECTION_BUCKETS,
    registry=None,
)
TTFT_SECONDS = Histogram(
    "edgeinspect_time_to_first_token_seconds",
    "from the start of an inspection to its first generated token (vision, retrieval, prefill)",
    buckets=INSPECTION_BUCKETS,
    registry=None,
)
STAGE_STEP_SECONDS = Histogram(
    "edgeinspect_stage_step_seconds",
    "compute time of one step in one decoder stage, as the stage reports it (stage: its layer range)",
    ["stage"],
    buckets=STEP_BUCKETS,
    registry=None,
)
QUEUE_WAIT_SECONDS = Histogram(
    "edgeinspect_queue_wait_seconds",
    "time an inspection waited for a free slot at admission",
    buckets=LATENCY_BUCKETS,
    registry=None,
)
BUILD_INFO = Info("edgeinspect_build", "the edgeinspect build this process runs", registry=None)
MODEL_INFO = Info(
    "edgeinspect_model", "the model the gateway's last report was made with (fingerprints, plan)", registry=None
)
FAILOVERS = Counter(
    "edgeinspect_failovers", "sessions moved to another route after a stage failed or stalled", ["stage"], registry=None
)
DEGRADED = Counter(
    "edgeinspect_degraded_reports", "reports produced without something optional", ["reason"], registry=None
)
JUMP_FORWARD_TOKENS = Counter(
    "edgeinspect_jump_forward_tokens",
    "tokens the report grammar forced, appended without a decode step of their own",
    registry=None,
)
ROUTE_COMPLETE = Gauge(
    "edgeinspect_route_complete", "1 while a complete route over the decoder stages exists", registry=None
)
ADMISSION = Gauge(
    "edgeinspect_inspections_admitted", "inspections running and waiting for a slot", ["state"], registry=None
)
REFUSED = Counter("edgeinspect_inspections_refused", "inspections refused at admission (gateway full)", registry=None)
DISK_FREE = Gauge("edgeinspect_disk_free_bytes", "free bytes on each disk the gateway writes", ["disk"], registry=None)
DISK_FLOOR = Gauge(
    "edgeinspect_disk_floor_bytes",
    "free space kept on each disk; below it inspections are refused",
    ["disk"],
    registry=None,
)
DISK_REFUSED = Counter(
    "edgeinspect_disk_refusals", "inspections refused because a disk was below its floor", ["disk"], registry=None
)
OUTBOX_FULL = Gauge(
    "edgeinspect_outbox_full",
    "1 while an output's queue for a station is at max_queued and the station's inspections are refused",
    ["output", "station"],
    registry=None,
)
OUTBOX_REFUSED = Counter(
    "edgeinspect_outbox_refusals",
    "inspections refused because an output's queue for their station was full",
    ["output"],
    registry=None,
)
# The gateway's vision and retrieval replicas (services/gateway/replicas/), per endpoint.
REPLICA_CALLS = Counter(
    "edgeinspect_replica_calls",
    "calls to a vision or retrieval replica by outcome (ok | retried | failed)",
    ["role", "endpoint", "outcome"],
    registry=None,
)
REPLICA_USABLE = Gauge(
    "edgeinspect_replica_usable",
    "1 while the replica is serving, handshaken and not banned",
    ["role", "endpoint"],
    registry=None,
)


def _build() -> dict[str, str]:
    import platform
    from importlib import metadata

    try:
        version = metadata.version("edgeinspect")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"version": version, "python": platform.python_version()}


BUILD_INFO.info(_build())

RPC_FAMILIES = (RPC_REQUESTS, RPC_LATENCY)  # every role with a gRPC server
# What each role exports besides build info and the RPC families; a family defined above that a role's code
# touches must be listed for it, or its samples never reach a scrape.
ROLE_FAMILIES: dict[str, tuple] = {
    "gateway": (
        TOKENS,
        INSPECTIONS,
        INSPECTION_SECONDS,
        TTFT_SECONDS,
        STAGE_STEP_SECONDS,
        QUEUE_WAIT_SECONDS,
        MODEL_INFO,
        FAILOVERS,
        DEGRADED,
        JUMP_FORWARD_TOKENS,
        ROUTE_COMPLETE,
        ADMISSION,
        REFUSED,
        DISK_FREE,
        DISK_FLOOR,
        DISK_REFUSED,
        OUTBOX_FULL,
        OUTBOX_REFUSED,
        REPLICA_CALLS,
        REPLICA_USABLE,
    ),
    "stage": (WIRE_BYTES, TOKENS, KV_SESSIONS, KV_BYTES, PREFIX_CACHE),
    "vision": (WIRE_BYTES,),
    "retrieval": (),
}


def register_families(families: tuple, registry: CollectorRegistry = REGISTRY) -> None:
    """Exports `families` on `registry`; one already there stays (a process may start several servers)."""
    for family in families:
        # ValueError "Duplicated timeseries": an earlier server of this process registered it
        with contextlib.suppress(ValueError):
            registry.register(family)


def register_role(role: str, registry: CollectorRegistry = REGISTRY) -> None:
    """The families a gRPC role's /metrics shows: build info, RPCs, and the role's own (ROLE_FAMILIES)."""
    register_families((BUILD_INFO, *RPC_FAMILIES, *ROLE_FAMILIES.get(role, ())), registry)


@dataclass
class MetricsHTTP:
    """A running /metrics endpoint."""

    port: int
    server: WSGIServer
    thread: Thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# HTTP health in the KServe v2 / Triton convention, for load balancers and probes that speak no gRPC.
LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a probe every few seconds is not news
        pass


def _app(ready: Callable[[], bool] | None) -> Callable[..., Iterable[bytes]]:
    """/metrics as prometheus_client serves it, plus live (the process answers) and ready (`ready()`: the role's
    grpc.health.v1 status is SERVING; always, for a role without a gRPC server); empty bodies, status is the
    answer."""
    metrics = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in (LIVE_PATH, READY_PATH):
            return metrics(environ, start_response)
        ok = path == LIVE_PATH or ready is None or ready()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Length", "0")])
        return [b""]

    return app


def serve_metrics(
    port: int | None, host: str = "127.0.0.1", ready: Callable[[], bool] | None = None
) -> MetricsHTTP | None:
    """Starts /metrics and /v2/health/{live,ready} on host:port (0: a free port); None when port is None.
    Build info is always exported; a gRPC role's families come from register_role (start_server)."""
    if port is None:
        return None
    register_families((BUILD_INFO,))
    family, addr = _get_best_family(host, port)

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(str(addr), port, _app(ready), Server, handler_class=_QuietHandler)
    thread = Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    bound = server.server_address[1]
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsHTTP(port=bound, server=server, thread=thread)


def start_metrics_http(port: int | None, host: str = "127.0.0.1") -> int | None:
    """Starts the /metrics endpoint for the life of the process; returns the bound port (None: disabled)."""
    running = serve_metrics(port, host)
    return running.port if running else None
