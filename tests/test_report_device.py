"""The report names the device and weight format that served each layer range (after a failover from a GPU box to
a CPU replica they differ); on this CPU-only stack every stage says cpu."""

from __future__ import annotations

from edgeinspect.assets import asset_path
from edgeinspect.services.client import InspectionClient


def test_the_report_names_the_device_that_served_each_layer_range(embedded_stack):
    with InspectionClient(embedded_stack.gateway_address, embedded_stack.api_token) as client:
        report = client.inspect(asset_path("part_ok.jpg").read_bytes(), max_new_tokens=4)
    served = list(report.model.served)
    assert [s.device for s in served] == ["cpu", "cpu"]
    assert all(s.weights for s in served)
    # the same route as `partition`, entry by entry
    assert [f"stage{k}={s.address}{s.layers}" for k, s in enumerate(served)] == list(report.model.partition)
