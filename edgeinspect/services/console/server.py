"""`edgeinspect serve console`: the web console on its own HTTP port, a client of the gateway's public API."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import uvicorn

from edgeinspect.errors import FailedPrecondition
from edgeinspect.services.common.entry import run_role
from edgeinspect.services.console.api import GatewayApi
from edgeinspect.services.console.app import create_app
from edgeinspect.services.console.settings import ConsoleSettings

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, SO_REUSEPORT off: a port another process holds fails the start, naming the port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only; never a second listener
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise FailedPrecondition(f"console cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(128)
    return sock


async def serve(cfg: ConsoleSettings) -> None:
    sock = bind(cfg.server.host, cfg.server.port)
    port = sock.getsockname()[1]
    api = GatewayApi(cfg.gateway, cfg.rpc_timeout_s)
    app = create_app(cfg, api)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5))
    if cfg.server.port_file:
        Path(cfg.server.port_file).write_text(str(port))
    log.info("console on http://%s:%d (gateway %s)", cfg.server.host, port, cfg.gateway)
    await server.serve(sockets=[sock])


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve until SIGINT / SIGTERM."""
    run_role(ConsoleSettings, serve, "console", config_path)
