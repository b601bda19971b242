"""One way to run a role's gRPC server: interceptors, health, reflection, metrics, port file, stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from edgeinspect.config import ServerConfig
from edgeinspect.errors import Unavailable
from edgeinspect.services.common.interceptors import RequestCheck, ServerInterceptor
from edgeinspect.services.common.metrics import MetricsHTTP, register_role, serve_metrics
from edgeinspect.services.common.tls import peer_interceptors, server_credentials

logger = logging.getLogger(__name__)

HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


def server_options(max_message_mb: int) -> list[tuple[str, int]]:
    """Channel args of every server: message limits plus keepalive that tolerates our clients' pings."""
    limit = max_message_mb * 1024 * 1024
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        # Find dead clients (a stage box that lost power) within about a minute.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        # Clients ping every 30 s, also while idle (make_channel); accept that instead of sending GOAWAY.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        # grpc sets SO_REUSEPORT by default: a second server on a taken port would start and the kernel would
        # split clients between the two. Off, the second start fails naming the port.
        ("grpc.so_reuseport", 0),
    ]


class HealthState:
    """grpc.health.v1 status of one server: the overall "" entry and each registered service move together."""

    def __init__(self, service_names: Sequence[str]) -> None:
        self.servicer = grpc_health.aio.HealthServicer()  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's health stub omits aio
        self.service_names = ["", *service_names]
        self.serving = False

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.service_names:
            await self.servicer.set(name, status)
        self.serving = serving
        logger.info("health: %s", "SERVING" if serving else "NOT_SERVING")

    async def shutting_down(self) -> None:
        """NOT_SERVING from now on; later set_serving calls are ignored by the servicer."""
        await self.servicer.enter_graceful_shutdown()
        self.serving = False


@dataclass
class RunningServer:
    """A started server; `stop` ends it (health first, then in-flight calls get `grace` seconds)."""

    server: grpc.aio.Server
    port: int
    health: HealthState
    metrics_port: int | None
    metrics: MetricsHTTP | None = field(default=None, repr=False)
    servicer: object | None = field(default=None, repr=False)  # the role's servicer, for its serve() loop
    stopped: bool = False

    async def stop(self, grace: float | None = None) -> None:
        """Idempotent: a role's own close may call it again after serve_until_signal did."""
        if self.stopped:
            return
        self.stopped = True
        await self.health.shutting_down()
        await self.server.stop(grace)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
            self.metrics = None
        logger.info("server on port %d stopped", self.port)

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def write_port_file(path: Path, port: int) -> None:
    """Writes the port atomically, so a reader never sees an empty or partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


async def start_server(
    register: list[Callable[[grpc.aio.Server], None]],
    service_names: list[str],
    cfg: ServerConfig,
    *,
    role: str,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> RunningServer:
    """Builds, binds and starts a role's server; health starts NOT_SERVING until the role flips it."""
    server = grpc.aio.server(
        # outermost first: the caller checks run before RequestCheck refuses a malformed body (interceptors.py)
        interceptors=[ServerInterceptor(role), *peer_interceptors(role, cfg.tls), *interceptors, RequestCheck()],
        options=server_options(cfg.max_message_mb),
    )
    for add in register:
        add(server)
    health = HealthState(service_names)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    await health.set_serving(False)
    reflection.enable_server_reflection([*service_names, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], server)

    address = _bind_address(cfg.host, cfg.port)
    try:
        if cfg.tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, server_credentials(cfg.tls))
    except RuntimeError as exc:
        raise Unavailable(f"cannot bind {address}: port {cfg.port} is in use or {cfg.host} is not local") from exc
    if port == 0:
        raise Unavailable(f"cannot bind {address}: port {cfg.port} is in use or {cfg.host} is not local")
    await server.start()
    register_role(role)
    metrics = serve_metrics(cfg.metrics_port, cfg.metrics_host or cfg.host, ready=lambda: health.serving)
    if cfg.port_file is not None:
        write_port_file(Path(cfg.port_file), port)
    security = "plaintext" if cfg.tls is None else ("mTLS" if cfg.tls.require_client_auth else "TLS")
    logger.info("%s serving gRPC (%s) on %s", role or "server", security, _bind_address(cfg.host, port))
    return RunningServer(
        server=server,
        port=port,
        health=health,
        metrics_port=metrics.port if metrics else None,
        metrics=metrics,
    )


async def serve_until_signal(running: RunningServer, grace: float) -> None:
    """Runs until SIGINT/SIGTERM (then stops gracefully) or until the server terminates by itself."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        stopped = asyncio.create_task(stop.wait())
        terminated = asyncio.create_task(running.wait_for_termination())
        await asyncio.wait({stopped, terminated}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if stop.is_set():
            logger.info("signal received; stopping with %.1fs grace", grace)
            await running.stop(grace)
        # Never cancel this one: grpc's wait_for_termination awaits the very future that stop() completes.
        await terminated
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
