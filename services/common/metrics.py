"""Prometheus metrics of every role, defined once (default registry), and the /metrics HTTP endpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

# 1 ms (a loopback unary) .. 60 s (a long generation stream).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

RPC_REQUESTS = Counter("edgeinspect_rpc_requests", "RPCs handled, by final status code", ["role", "method", "code"])
RPC_LATENCY = Histogram(
    "edgeinspect_rpc_latency_seconds",
    "RPC handling time (whole stream for streams)",
    ["role", "method"],
    buckets=LATENCY_BUCKETS,
)
WIRE_BYTES = Counter("edgeinspect_wire_bytes", "tensor payload bytes on the wire", ["role", "codec", "direction"])
TOKENS = Counter("edgeinspect_tokens", "tokens generated or processed", ["role"])
KV_SESSIONS = Gauge("edgeinspect_kv_sessions", "sessions holding a KV cache", ["role"])
KV_BYTES = Gauge("edgeinspect_kv_bytes", "bytes held by KV caches", ["role"])
PREFIX_CACHE = Counter(
    "edgeinspect_prefix_cache_lookups", "sessions asking to start from a cached prompt prefix", ["role", "result"]
)
INSPECTIONS = Counter("edgeinspect_inspections", "finished inspections by verdict", ["verdict"])
FAILOVERS = Counter(
    "edgeinspect_failovers", "sessions moved to another route after a stage failed or stalled", ["stage"]
)
DEGRADED = Counter("edgeinspect_degraded_reports", "reports produced without something optional", ["reason"])
ROUTE_COMPLETE = Gauge("edgeinspect_route_complete", "1 while a complete route over the decoder stages exists")
ADMISSION = Gauge("edgeinspect_inspections_admitted", "inspections running and waiting for a slot", ["state"])
REFUSED = Counter("edgeinspect_inspections_refused", "inspections refused at admission (gateway full)")


@dataclass
class MetricsHTTP:
    """A running /metrics endpoint."""

    port: int
    server: WSGIServer
    thread: Thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(port: int | None, host: str = "127.0.0.1") -> MetricsHTTP | None:
    """Starts the /metrics endpoint on host:port (0: a free port); None when port is None."""
    if port is None:
        return None
    server, thread = start_http_server(port, addr=host)
    bound = server.server_address[1]
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsHTTP(port=bound, server=server, thread=thread)


def start_metrics_http(port: int | None, host: str = "127.0.0.1") -> int | None:
    """Starts the /metrics endpoint for the life of the process; returns the bound port (None: disabled)."""
    running = serve_metrics(port, host)
    return running.port if running else None
