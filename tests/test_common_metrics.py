"""The /metrics endpoint on its own: port 0 picks a free port, None disables it, closing frees it."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from edgeinspect.services.common.metrics import KV_BYTES, register_role, serve_metrics, start_metrics_http


def test_no_port_means_no_endpoint():
    assert start_metrics_http(None) is None
    assert serve_metrics(None) is None


def test_port_zero_serves_every_metric_on_a_free_port_until_closed():
    KV_BYTES.labels("metrics-test", "stage[0,3)").set(1234)
    register_role("stage")  # what a stage's and a gateway's start_server register
    register_role("gateway")
    running = serve_metrics(0, "127.0.0.1")
    url = f"http://127.0.0.1:{running.port}/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        running.close()
    assert running.port > 0
    assert 'edgeinspect_kv_bytes{role="metrics-test",stage="stage[0,3)"} 1234.0' in text
    for name in (
        "edgeinspect_rpc_requests",
        "edgeinspect_rpc_latency_seconds",
        "edgeinspect_wire_bytes",
        "edgeinspect_tokens",
        "edgeinspect_kv_sessions",
        "edgeinspect_inspections",
    ):
        assert f"# TYPE {name}" in text
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
