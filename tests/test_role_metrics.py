"""Each role's /metrics shows its own families only: no KV gauges or route state on the vision node."""

from __future__ import annotations

import re
import urllib.request

import pytest

# Families only one kind of role has (the gateway's route and inspections, the stages' KV caches).
GATEWAY_ONLY = ("edgeinspect_route_complete", "edgeinspect_inspections_admitted", "edgeinspect_inspections")
STAGE_ONLY = ("edgeinspect_kv_sessions", "edgeinspect_kv_bytes", "edgeinspect_prefix_cache_lookups")


def families(url: str) -> set[str]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {name.removesuffix("_total") for name in re.findall(r"^# TYPE (\S+) ", text, re.M)}


@pytest.fixture(scope="module")
def exported(embedded_stack):
    names = ["vision", "stage0", "stage1", "gateway"]
    return {name: families(embedded_stack.metrics_url(name)) for name in names}


def test_vision_node_exports_no_kv_or_route_families(exported):
    vision = exported["vision"]
    assert not vision & {*GATEWAY_ONLY, *STAGE_ONLY}
    assert {"edgeinspect_build_info", "edgeinspect_rpc_requests", "edgeinspect_wire_bytes"} <= vision


def test_stages_and_gateway_export_their_own_families_only(exported):
    for stage in ("stage0", "stage1"):
        assert set(STAGE_ONLY) <= exported[stage] and not exported[stage] & set(GATEWAY_ONLY)
    gateway = exported["gateway"]
    assert set(GATEWAY_ONLY) <= gateway and not gateway & set(STAGE_ONLY)
    assert "edgeinspect_inspection_duration_seconds" in gateway
    for name, have in exported.items():
        assert {"edgeinspect_build_info", "edgeinspect_rpc_requests"} <= have, name
