"""A kustomize base for k3s: one Deployment per role instance (one per layer range), Services, probes on
grpc.health.v1, node selectors per box type, hostPath storage, the API tokens from a Secret."""

from __future__ import annotations

import copy
from typing import Any

from edgeinspect.deploy import database, tls
from edgeinspect.deploy.compose import (
    CONFIG_DIR,
    HAILO_DEVICE,
    HEALTHCHECK,
    SECRET_OF_ROLE,
    SECRETS,
    VIDEO_GID,
    config_file,
    cpu_limit,
    image_for,
    mebibytes,
    memory_limit_bytes,
    memory_request_bytes,
    video_devices,
)
from edgeinspect.deploy.inventory import Box, Inventory, Role
from edgeinspect.deploy.topology import Instance

CONFIGMAP = "edgeinspect-config"  # kustomize appends the hash of its files: a config change rolls the pods
CONFIG_FOLDER = "config"  # k8s/config/: the files the ConfigMap is generated from
BOX_TYPE_LABEL = "edgeinspect.io/box-type"
GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's device plugin advertises it (Jetson included)
GPU_RUNTIME_CLASS = "nvidia"  # k3s registers it when it finds the NVIDIA container runtime on the node
UID = 10001


def labels(inv: Inventory, component: str, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "edgeinspect",
        "app.kubernetes.io/instance": inv.plant.name,
        "app.kubernetes.io/component": component,
        "edgeinspect.io/role": role,
    }


def _labels(inv: Inventory, inst: Instance) -> dict[str, str]:
    return labels(inv, inst.service, inst.role.value)


def selector(labels: dict[str, str]) -> dict[str, str]:
    """What a Deployment and its Service select their pods by."""
    return {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}


def _host_path(name: str, path: str, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def _storage(inv: Inventory, inst: Instance, cameras: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): the rendered settings from the ConfigMap, data folders from the box's disk."""
    plant = inv.plant
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": CONFIGMAP}}]
    mounts: list[dict[str, Any]] = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    # Checkpoints and the knowledge base are copied onto each box beforehand (they are gigabytes, read at start);
    # reports, the ONNX export and stages' compiled kernels are written where the pod is pinned.
    wanted = {
        Role.vision: [
            ("checkpoints", "Directory", True),
            ("cache", "DirectoryOrCreate", False),
            ("banks", "DirectoryOrCreate", False),
        ],
        Role.stage: [("checkpoints", "Directory", True), ("cache", "DirectoryOrCreate", False)],
        Role.gateway: [("checkpoints", "Directory", True), ("reports", "DirectoryOrCreate", False)],
        Role.retrieval: [("kb", "Directory", True)],
        Role.ingest: [("frames", "DirectoryOrCreate", False)],
    }[inst.role]
    for name, kind, ro in wanted:
        path = str(plant.data_dir / name)
        volumes.append(_host_path(name, path, kind))
        mounts.append({"name": name, "mountPath": path, "readOnly": ro})
    if inst.role is Role.vision and inst.box.hailo:
        volumes.append(_host_path("hailo", HAILO_DEVICE, "CharDevice"))
        mounts.append({"name": "hailo", "mountPath": HAILO_DEVICE})
    for dev in video_devices(cameras) if inst.role is Role.ingest else []:
        name = dev.removeprefix("/dev/").replace("video", "video-")
        volumes.append(_host_path(name, dev, "CharDevice"))
        mounts.append({"name": name, "mountPath": dev})
    if plant.tls:
        # The box's certificate, key and the plant CA; readable by the pod's group only (fsGroup).
        secret: dict[str, Any] = {"secretName": tls_secret(inv, inst.box), "defaultMode": 0o440}
        if inst.role is Role.ingest:  # ingest only verifies the gateway: the CA, not the box's key
            secret["items"] = [{"key": tls.CA_FILE, "path": tls.CA_FILE}]
        volumes.append({"name": "tls", "secret": secret})
        mounts.append({"name": "tls", "mountPath": tls.MOUNT, "readOnly": True})
    if inst.role is Role.gateway and inv.shared_store:  # the DSN, a file the settings name
        volumes.append(_store_secret_volume(database.DSN_FILE))
        mounts.append({"name": "store", "mountPath": database.MOUNT, "readOnly": True})
    return volumes, mounts


def _store_secret_volume(key: str) -> dict[str, Any]:
    items = [{"key": key, "path": key}]
    return {"name": "store", "secret": {"secretName": database.K8S_SECRET, "defaultMode": 0o440, "items": items}}


def tls_secret(inv: Inventory, box: Box) -> str:
    """The Secret holding `box`'s certificate (made by kustomize from k8s/secrets/tls/, never a rendered YAML)."""
    return f"edgeinspect-tls-{box.name}"


def _resources(inv: Inventory, inst: Instance) -> dict[str, Any]:
    """Requests that fit the node (what the role needs; a stage's planned weights, KV and runtime, within what the
    OS and the co-located roles leave) and limits where the kernel stops it; one GPU for a role on a GPU box."""
    requests = {"memory": mebibytes(memory_request_bytes(inv, inst)), "cpu": _cores(inst.box.role_cpus(inst.role))}
    limits = {"memory": mebibytes(memory_limit_bytes(inv, inst)), "cpu": _cores(cpu_limit(inst))}
    if inst.box.uses_gpu(inst.role):
        limits[GPU_RESOURCE] = "1"  # extended resources are limits only (the request follows)
    return {"requests": requests, "limits": limits}


def _cores(n: float) -> str:
    return f"{round(n * 1000)}m"


def _probes(inv: Inventory, inst: Instance) -> dict[str, Any]:
    if inst.port:
        if inv.plant.tls:  # kubelet's gRPC probe speaks no TLS: ask through the image's probe instead
            command = [*HEALTHCHECK, *tls.healthcheck_args(), f"127.0.0.1:{inst.port}"]
            check: dict[str, Any] = {"exec": {"command": command}}
        else:
            check = {"grpc": {"port": inst.port}}
    elif inst.metrics_port:  # ingest: its HTTP health on the metrics port (plain HTTP, like /metrics)
        check = {"httpGet": {"path": "/v2/health/ready", "port": "metrics"}}
    else:
        return {}
    return probes(check)


def probes(check: dict[str, Any]) -> dict[str, Any]:
    """Startup, readiness and liveness probes asking `check`."""
    return {
        # SERVING only once the model is loaded and a canary inference passed: minutes on a Pi.
        "startupProbe": {**copy.deepcopy(check), "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 60},
        "readinessProbe": {**copy.deepcopy(check), "periodSeconds": 10, "timeoutSeconds": 5},
        "livenessProbe": {**copy.deepcopy(check), "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
    }


def _container(
    inv: Inventory,
    inst: Instance,
    mounts: list[dict[str, Any]],
    cameras: list[str],
    line_ports: list[tuple[str, int]],
) -> dict[str, Any]:
    if inst.role is Role.ingest:
        args = ["ingest", "--config", f"{CONFIG_DIR}/{config_file(inst)}"]
    else:
        args = ["serve", inst.role.value, "--config", f"{CONFIG_DIR}/{config_file(inst)}"]
    env: list[dict[str, Any]] = [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TQDM_DISABLE", "value": "1"}]
    if inst.role in SECRET_OF_ROLE:
        var = SECRETS[SECRET_OF_ROLE[inst.role]][1]
        ref = {"name": inv.plant.api_tokens_secret, "key": var}
        env.append({"name": var, "valueFrom": {"secretKeyRef": ref}})
    c: dict[str, Any] = {
        "name": inst.role.value,
        "image": image_for(inv, inst.box, inst.role),
        "args": args,
        "env": env,
        "volumeMounts": mounts,
    }
    ports = [{"name": "grpc", "containerPort": inst.port}] if inst.port else []
    if inst.metrics_port:
        ports.append({"name": "metrics", "containerPort": inst.metrics_port})
    if inst.role is Role.gateway and len(inv.boxes_with(Role.gateway)) > 1:
        # A pair: each gateway on its own box's address, as compose publishes it (see service()).
        ports[0]["hostPort"] = inst.port
    for name, port in line_ports:
        # The PLC and the line's trigger reach ingest at its box's address, as with compose's published ports: the
        # pod is pinned to that box, so a host port is the address the line was configured with.
        ports.append({"name": name, "containerPort": port, "hostPort": port, "protocol": "TCP"})
    if ports:
        c["ports"] = ports
    c |= _probes(inv, inst)
    c["resources"] = _resources(inv, inst)
    if (inst.role is Role.vision and inst.box.hailo) or (inst.role is Role.ingest and video_devices(cameras)):
        # A character device (Hailo, V4L2 camera) needs the device cgroup opened; without a device plugin that is
        # privileged.
        c["securityContext"] = {"privileged": True}
    else:
        c["securityContext"] = {"allowPrivilegeEscalation": False}
    return c


def deployment(
    inv: Inventory,
    inst: Instance,
    cameras: list[str] | None = None,
    line_ports: list[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """The instance's Deployment; `cameras`: an ingest instance's camera sources (V4L2 ones get their device);
    `line_ports`: (name, port) an ingest instance serves the line on (trigger, OPC UA), published on its box."""
    cameras = cameras or []
    volumes, mounts = _storage(inv, inst, cameras)
    # Layer ranges and reserves were planned against this box's memory and speed: pin to it, and to its type.
    pod = pod_spec(inst.box, _container(inv, inst, mounts, cameras, line_ports or []), volumes)
    if inst.box.uses_gpu(inst.role):
        pod["runtimeClassName"] = GPU_RUNTIME_CLASS
    if inst.role is Role.ingest and video_devices(cameras):
        pod["securityContext"]["supplementalGroups"] = [VIDEO_GID]
    annotations = {}
    if inst.metrics_port:
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(inst.metrics_port)}
    return deployment_doc(inst.service, _labels(inv, inst), pod, annotations)


def pod_spec(box: Box, container: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """One container pinned to `box` (and its type) as the image's user, with a writable /tmp."""
    container["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
    return {
        "nodeSelector": {BOX_TYPE_LABEL: box.box_type, "kubernetes.io/hostname": box.name},
        "securityContext": {"runAsUser": UID, "runAsGroup": UID, "fsGroup": UID, "runAsNonRoot": True},
        "terminationGracePeriodSeconds": 10,
        "containers": [container],
        "volumes": volumes + [{"name": "tmp", "emptyDir": {}}],
    }


def deployment_doc(
    name: str, labels: dict[str, str], pod: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    template_meta: dict[str, Any] = {"labels": labels}
    if annotations:
        template_meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            # One model copy per box: never start the new pod beside the old one.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(labels)},
            "template": {"metadata": template_meta, "spec": pod},
        },
    }


def service(inv: Inventory, inst: Instance) -> dict[str, Any]:
    labels = _labels(inv, inst)
    ports = [{"name": "grpc", "port": inst.port, "targetPort": "grpc", "appProtocol": "grpc"}]
    if inst.metrics_port:
        ports.append({"name": "metrics", "port": inst.metrics_port, "targetPort": "metrics"})
    spec: dict[str, Any] = {"selector": selector(labels), "ports": ports}
    # The public API leaves the cluster through k3s' built-in ServiceLB; everything else stays inside. A gateway
    # pair is not load-balanced: clients hold both addresses and must reach the one they choose (a retry goes to
    # the other on purpose), and ServiceLB cannot give two Services one port. Each gateway is published on its
    # box's address (a host port) and has its own Service for the clients in the cluster.
    pair = len(inv.boxes_with(Role.gateway)) > 1
    spec["type"] = "LoadBalancer" if inst.role is Role.gateway and not pair else "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": inst.service, "labels": labels}, "spec": spec}


def kustomization(inv: Inventory, resources: list[str], config_files: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": f"edgeinspect-{inv.plant.name}",
        "resources": resources,
        "configMapGenerator": [{"name": CONFIGMAP, "files": [f"{CONFIG_FOLDER}/{name}" for name in config_files]}],
        # secrets.env (not rendered, never committed): EDGEINSPECT_API_TOKENS=[{"name": ..., "role": ..., "hash": ...}]
        # (`edgeinspect token create` prints each entry) for the gateway and
        # EDGEINSPECT_API_TOKEN=... for ingest.
        "secretGenerator": [{"name": inv.plant.api_tokens_secret, "envs": ["secrets.env"]}]
        + _tls_generators(inv)
        + _store_generators(inv),
    }


def _store_generators(inv: Inventory) -> list[dict[str, Any]]:
    """The Secret with the gateways' DSN (and PostgreSQL's password) from the files `deploy render` wrote into
    k8s/secrets/store/."""
    if not inv.shared_store:
        return []
    keys = [database.DSN_FILE] + ([database.PASSWORD_FILE] if inv.boxes_with(Role.database) else [])
    return [{"name": database.K8S_SECRET, "files": [f"{k}={database.SECRETS_DIR}/{k}" for k in keys]}]


def statefulset(inv: Inventory, inst: Instance) -> dict[str, Any]:
    """PostgreSQL for the gateway pair: one pod (postgres-0) pinned to the database box, its data on a
    PersistentVolumeClaim (k3s: local-path on that box), the password from the store Secret, TLS with the box's
    certificate."""
    labels = _labels(inv, inst)
    check = {"exec": {"command": database.ready_command(inv)}}
    mounts = [
        {"name": "data", "mountPath": database.DATA_DIR},
        {"name": "store", "mountPath": database.MOUNT, "readOnly": True},
        {"name": "run", "mountPath": "/var/run/postgresql"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes = [_store_secret_volume(database.PASSWORD_FILE), {"name": "run", "emptyDir": {}}]
    volumes.append({"name": "tmp", "emptyDir": {}})
    if database.uses_tls(inv):
        items = [{"key": k, "path": k} for k in (tls.CERT_FILE, tls.KEY_FILE)]
        secret = {"secretName": tls_secret(inv, inst.box), "defaultMode": 0o440, "items": items}
        volumes.append({"name": "tls", "secret": secret})
        mounts.append({"name": "tls", "mountPath": tls.MOUNT, "readOnly": True})
    container = {
        "name": "postgres",
        "image": database.declared(inv).image,
        "args": database.server_args(inv),
        "env": [{"name": k, "value": v} for k, v in database.environment(inv).items()],
        "ports": [{"name": "postgres", "containerPort": inst.port}],
        "volumeMounts": mounts,
        "startupProbe": {**copy.deepcopy(check), "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 60},
        "readinessProbe": {**copy.deepcopy(check), "periodSeconds": 10, "timeoutSeconds": 5},
        "livenessProbe": {**copy.deepcopy(check), "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        "resources": _resources(inv, inst),
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod = {
        "nodeSelector": {BOX_TYPE_LABEL: inst.box.box_type, "kubernetes.io/hostname": inst.box.name},
        "securityContext": {"runAsUser": UID, "runAsGroup": UID, "fsGroup": UID, "runAsNonRoot": True},
        "terminationGracePeriodSeconds": 30,
        "containers": [container],
        "volumes": volumes,
    }
    claim = {
        "metadata": {"name": "data", "labels": labels},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": f"{database.declared(inv).storage_gb}Gi"}},
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": inst.service, "labels": labels},
        "spec": {
            "serviceName": inst.service,
            "replicas": 1,
            "selector": {"matchLabels": selector(labels)},
            "template": {"metadata": {"labels": labels}, "spec": pod},
            "volumeClaimTemplates": [claim],
        },
    }


def headless_service(inv: Inventory, inst: Instance) -> dict[str, Any]:
    """The StatefulSet's governing Service: `postgres` resolves to its one pod, the name the DSN carries."""
    labels = _labels(inv, inst)
    spec = {
        "clusterIP": "None",
        "selector": selector(labels),
        "ports": [{"name": "postgres", "port": inst.port, "targetPort": "postgres"}],
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": inst.service, "labels": labels}, "spec": spec}


def _tls_generators(inv: Inventory) -> list[dict[str, Any]]:
    """One Secret per box from the files `deploy render` issued into k8s/secrets/tls/."""
    if not inv.plant.tls:
        return []
    d = tls.SECRETS_DIR
    return [
        {
            "name": tls_secret(inv, box),
            "files": [
                f"{tls.CA_FILE}={d}/{tls.CA_FILE}",
                f"{tls.CERT_FILE}={d}/{box.name}.crt",
                f"{tls.KEY_FILE}={d}/{box.name}.key",
            ],
        }
        for box in inv.boxes
    ]


def namespace(inv: Inventory) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"edgeinspect-{inv.plant.name}"}}
