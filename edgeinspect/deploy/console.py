"""The web console in a rendered plant: one compose service beside each gateway (and in the all-in-one), a client of
the gateways' public API. It holds no token: every operator signs in with their own API token, which the gateway
checks, so the console is behind the same tokens as the API."""

from __future__ import annotations

from typing import Any

from edgeinspect.deploy import compose, tls
from edgeinspect.deploy.inventory import Inventory, Role
from edgeinspect.deploy.settings import isolated
from edgeinspect.deploy.topology import Addressing, Instance
from edgeinspect.services.console.settings import ConsoleSettings

SERVICE = "console"
CONFIG = "console.yaml"


def console_settings(inv: Inventory, everyone: list[Instance], addressing: Addressing) -> ConsoleSettings:
    """Listens on plant.ports.console; holds every gateway (it fails over between a pair), verified by the plant CA."""
    gateways = [i.address(addressing) for i in everyone if i.role is Role.gateway]
    data: dict[str, Any] = {
        "server": {"host": "0.0.0.0", "port": inv.plant.ports.console},
        "gateway": ",".join(gateways),
        "log_level": inv.plant.log_level,
    }
    if inv.plant.tls:
        data["client_tls"] = tls.public_ca()
    return isolated(ConsoleSettings, data)


def console_service(inv: Inventory, local: list[Instance]) -> dict[str, Any]:
    """The compose service: published on every interface (operators' browsers), healthy while /healthz answers."""
    port = inv.plant.ports.console
    svc: dict[str, Any] = {
        "image": inv.plant.image,
        "command": ["serve", "console", "--config", f"{compose.CONFIG_DIR}/{CONFIG}"],
        "restart": "unless-stopped",
        "init": True,
        "environment": {"HF_HUB_OFFLINE": "1"},
        "ports": [f"{port}:{port}"],
        "volumes": [{"type": "bind", "source": "./config", "target": compose.CONFIG_DIR, "read_only": True}],
    }
    if inv.plant.tls:  # the CA only: the console verifies the gateway and presents no certificate
        svc["secrets"] = [{"source": "tls_ca", "target": tls.mounted(tls.CA_FILE)}]
    svc["healthcheck"] = {
        "test": ["CMD", *compose.http_health_command(port, "/healthz")],
        "interval": "15s",
        "timeout": "10s",
        "retries": 3,
        "start_period": "1m",
    }
    svc |= {"mem_limit": "512m", "mem_reservation": "256m", "cpus": 1.0, "cpu_shares": 512, "logging": compose.LOGGING}
    gateways = [i.service for i in local if i.role is Role.gateway]
    if gateways:  # started after its gateway, not waiting for it to be healthy: it shows what is down meanwhile
        svc["depends_on"] = {g: {"condition": "service_started"} for g in gateways}
    svc["stop_grace_period"] = "10s"
    return svc
