"""The web console in a rendered plant: one compose service beside each gateway (and in the all-in-one), one
Kubernetes Deployment and Service on the gateway's box; a client of the gateways' public API. It holds no token:
every operator signs in with their own API token, which the gateway checks, so the console is behind the same tokens
as the API."""

from __future__ import annotations

from typing import Any

from edgeinspect.deploy import compose, k8s, tls
from edgeinspect.deploy.inventory import Inventory, Role
from edgeinspect.deploy.settings import isolated
from edgeinspect.deploy.topology import Addressing, Instance
from edgeinspect.services.console.settings import ConsoleSettings

SERVICE = "console"
CONFIG = "console.yaml"
MEMORY_MB = (256, 512)  # reserved, limit: a FastAPI process holding gRPC channels


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
    svc |= {
        "mem_limit": f"{MEMORY_MB[1]}m",
        "mem_reservation": f"{MEMORY_MB[0]}m",
        "cpus": 1.0,
        "cpu_shares": 512,
        "logging": compose.LOGGING,
    }
    gateways = [i.service for i in local if i.role is Role.gateway]
    if gateways:  # started after its gateway, not waiting for it to be healthy: it shows what is down meanwhile
        svc["depends_on"] = {g: {"condition": "service_started"} for g in gateways}
    svc["stop_grace_period"] = "10s"
    return svc


def k8s_objects(inv: Inventory, everyone: list[Instance]) -> list[dict[str, Any]]:
    """The Deployment (the image every role runs, pinned to the first gateway's box, probes on /healthz, the plant CA
    from that box's TLS Secret and no key: it presents no certificate) and its Service on plant.ports.console for
    the operators' browsers, published as the gateways are: a LoadBalancer, or with a gateway pair (not
    load-balanced) a host port on that box. No token: operators sign in with their own (the API's Secret)."""
    box = next(i.box for i in everyone if i.role is Role.gateway)
    port = inv.plant.ports.console
    pair = len(inv.boxes_with(Role.gateway)) > 1
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": k8s.CONFIGMAP}}]
    mounts: list[dict[str, Any]] = [{"name": "config", "mountPath": compose.CONFIG_DIR, "readOnly": True}]
    if inv.plant.tls:
        ca = {
            "secretName": k8s.tls_secret(inv, box),
            "defaultMode": 0o440,
            "items": [{"key": tls.CA_FILE, "path": tls.CA_FILE}],
        }
        volumes.append({"name": "tls", "secret": ca})
        mounts.append({"name": "tls", "mountPath": tls.MOUNT, "readOnly": True})
    container = {
        "name": SERVICE,
        "image": inv.plant.image,
        "args": ["serve", "console", "--config", f"{compose.CONFIG_DIR}/{CONFIG}"],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "volumeMounts": mounts,
        "ports": [{"name": "http", "containerPort": port, **({"hostPort": port} if pair else {})}],
        **k8s.probes({"httpGet": {"path": "/healthz", "port": "http"}}),
        "resources": {
            "requests": {"memory": f"{MEMORY_MB[0]}Mi", "cpu": "500m"},
            "limits": {"memory": f"{MEMORY_MB[1]}Mi", "cpu": "1000m"},
        },
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    labels = k8s.labels(inv, SERVICE, SERVICE)
    svc_spec = {"type": "ClusterIP" if pair else "LoadBalancer", "selector": k8s.selector(labels),
                "ports": [{"name": "http", "port": port, "targetPort": "http"}]}  # fmt: skip
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "labels": labels}, "spec": svc_spec}
    return [k8s.deployment_doc(SERVICE, labels, k8s.pod_spec(box, container, volumes)), service]
