"""The plant's Grafana dashboard and the optional `observability` compose profile (Prometheus + Grafana, official
images) that scrapes every role and is provisioned with it.

Every panel's PromQL is in PANELS: tests/test_observability.py runs each expression against a real Prometheus
scraping the embedded stack after a few inspections, so a renamed metric breaks a test, not a plant's dashboard.
"""

from __future__ import annotations

import json
from typing import Any

PROFILE = "observability"
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.0"
GRAFANA_IMAGE = "grafana/grafana:11.1.0"
DATASOURCE_UID = "edgeinspect-prometheus"
# Target label naming the instance a series came from (stage-0, gateway, ...): not `role` or `service`, which
# are labels of the metrics themselves.
INSTANCE_LABEL = "component"
FOLDER = "observability"  # beside compose.yaml in a rendered folder

# (title, unit, [(expr, legend)]); $__rate_interval is Grafana's (at least four scrape intervals).
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Inspections per minute by station and verdict",
        "short",
        [
            (
                "60 * sum by (station, verdict) (rate(edgeinspect_inspections_total[$__rate_interval]))",
                "{{station}} {{verdict}}",
            )
        ],
    ),
    (
        "Share not OK (NG + uncertain) by station",
        "percentunit",
        [
            (
                'sum by (station) (rate(edgeinspect_inspections_total{verdict!="OK"}[$__rate_interval])) '
                "/ sum by (station) (rate(edgeinspect_inspections_total[$__rate_interval]))",
                "{{station}}",
            )
        ],
    ),
    (
        "Inspection latency and time to first token (p50, p95)",
        "s",
        [
            (
                f"histogram_quantile({q}, sum by (le) (rate({name}_bucket[$__rate_interval])))",
                f"{label} p{int(q * 100)}",
            )
            for name, label in (
                ("edgeinspect_inspection_duration_seconds", "inspection"),
                ("edgeinspect_time_to_first_token_seconds", "first token"),
            )
            for q in (0.5, 0.95)
        ],
    ),
    (
        "Step time per decoder stage (p95)",
        "s",
        [
            (
                "histogram_quantile(0.95, "
                "sum by (le, stage) (rate(edgeinspect_stage_step_seconds_bucket[$__rate_interval])))",
                "{{stage}}",
            )
        ],
    ),
    (
        "KV cache held per decoder stage",
        "bytes",
        [('edgeinspect_kv_bytes{role="stage"}', f"{{{{stage}}}} {{{{{INSTANCE_LABEL}}}}}")],
    ),
    (
        "Failovers (sessions moved to another replica)",
        "short",
        [("sum by (stage) (increase(edgeinspect_failovers_total[$__rate_interval])) or on() vector(0)", "{{stage}}")],
    ),
    (
        "Admission: inspections running and queued",
        "short",
        [("sum by (state) (edgeinspect_inspections_admitted)", "{{state}}")],
    ),
    (
        "Queue wait (p95)",
        "s",
        [
            (
                "histogram_quantile(0.95, sum by (le) (rate(edgeinspect_queue_wait_seconds_bucket[$__rate_interval])))",
                "p95",
            )
        ],
    ),
    (
        "Complete route over the decoder stages (1 = serving)",
        "short",
        [(f'min(edgeinspect_route_complete{{{INSTANCE_LABEL}="gateway"}})', "route complete")],
    ),
    (
        "RPCs per second by role and method",
        "reqps",
        [
            (
                "sum by (role, method, code) (rate(edgeinspect_rpc_requests_total[$__rate_interval]))",
                "{{role}} {{method}} {{code}}",
            )
        ],
    ),
    ("Model in use", "short", [("edgeinspect_model_info", "{{plan}} {{fingerprint}}")]),
    # Camera health, from each ingest box: a camera that stopped delivering frames shows here before the line does.
    (
        "Camera: seconds since its last frame",
        "s",
        [("max by (camera) (edgeinspect_ingest_last_frame_age_seconds)", "{{camera}}")],
    ),
    (
        "Camera: frames read per second and stream reopens",
        "short",
        [
            ("sum by (camera) (rate(edgeinspect_ingest_frames_read_total[$__rate_interval]))", "{{camera}} frames/s"),
            ("sum by (camera) (increase(edgeinspect_ingest_reconnects_total[$__rate_interval]))", "{{camera}} reopens"),
        ],
    ),
]


def expressions() -> list[str]:
    return [expr for _, _, targets in PANELS for expr, _ in targets]


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard (JSON model), two panels per row."""
    panels = []
    for k, (title, unit, targets) in enumerate(PANELS):
        panels.append(
            {
                "id": k + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (k % 2), "y": 8 * (k // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
                        "expr": expr,
                        "legendFormat": legend,
                    }
                    for j, (expr, legend) in enumerate(targets)
                ],
            }
        )
    return {
        "uid": "edgeinspect-plant",
        "title": "edgeinspect plant",
        "tags": ["edgeinspect"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def prometheus_config(targets: dict[str, str], scrape_interval: str = "15s") -> dict[str, Any]:
    """prometheus.yml scraping every role's /metrics: {instance name: host:metrics_port}."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "edgeinspect",
                "static_configs": [
                    {"targets": [address], "labels": {INSTANCE_LABEL: name}} for name, address in targets.items()
                ],
            }
        ],
    }


def grafana_provisioning() -> dict[str, dict[str, Any]]:
    """{relative path under observability/grafana/: document}: the datasource and the dashboard provider."""
    return {
        "provisioning/datasources/prometheus.yaml": {
            "apiVersion": 1,
            "datasources": [
                {
                    "name": "Prometheus",
                    "type": "prometheus",
                    "uid": DATASOURCE_UID,
                    "access": "proxy",
                    "url": "http://prometheus:9090",
                    "isDefault": True,
                }
            ],
        },
        "provisioning/dashboards/edgeinspect.yaml": {
            "apiVersion": 1,
            "providers": [
                {
                    "name": "edgeinspect",
                    "type": "file",
                    "options": {"path": "/var/lib/grafana/dashboards"},
                }
            ],
        },
    }


def compose_services(publish_host: str) -> dict[str, dict[str, Any]]:
    """The profile's two services (`docker compose --profile observability up -d`); `publish_host`: the address
    their ports are published on ("" : every interface)."""
    prefix = f"{publish_host}:" if publish_host else ""
    logging = {"driver": "json-file", "options": {"max-size": "10m", "max-file": "3"}}
    return {
        "prometheus": {
            "image": PROMETHEUS_IMAGE,
            "profiles": [PROFILE],
            "restart": "unless-stopped",
            "command": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.retention.time=15d"],
            "ports": [f"{prefix}9090:9090"],
            "volumes": [
                {
                    "type": "bind",
                    "source": f"./{FOLDER}/prometheus.yml",
                    "target": "/etc/prometheus/prometheus.yml",
                    "read_only": True,
                },
                {"type": "volume", "source": "prometheus-data", "target": "/prometheus"},
            ],  # fmt: skip
            "healthcheck": {
                "test": ["CMD", "wget", "-q", "--spider", "http://127.0.0.1:9090/-/ready"],
                "interval": "15s",
                "timeout": "5s",
                "retries": 3,
            },
            "mem_limit": "1024m",
            "cpus": 1.0,
            "logging": logging,
        },
        "grafana": {
            "image": GRAFANA_IMAGE,
            "profiles": [PROFILE],
            "restart": "unless-stopped",
            "depends_on": {"prometheus": {"condition": "service_healthy"}},
            "healthcheck": {
                "test": ["CMD", "wget", "-q", "--spider", "http://127.0.0.1:3000/api/health"],
                "interval": "15s",
                "timeout": "5s",
                "retries": 3,
            },
            "ports": [f"{prefix}3000:3000"],
            "volumes": [
                {
                    "type": "bind",
                    "source": f"./{FOLDER}/grafana/provisioning",
                    "target": "/etc/grafana/provisioning",
                    "read_only": True,
                },
                {
                    "type": "bind",
                    "source": f"./{FOLDER}/grafana/dashboards",
                    "target": "/var/lib/grafana/dashboards",
                    "read_only": True,
                },
                {"type": "volume", "source": "grafana-data", "target": "/var/lib/grafana"},
            ],  # fmt: skip
            "mem_limit": "512m",
            "cpus": 1.0,
            "logging": logging,
        },
    }
