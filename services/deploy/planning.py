"""Runs the partition planner over the inventory's decoder boxes."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.services.deploy.inventory import Inventory, Role
from edgeinspect.services.deploy.topology import StagePlacement


def plan_stages(inv: Inventory, checkpoint: Path | None = None) -> list[StagePlacement]:
    """Layer ranges for the decoder boxes: costs from a local checkpoint copy when given, else from the
    inventory's model sizes."""
    from edgeinspect.models import planner

    boxes = {b.name: b for b in inv.boxes_with(Role.stage)}
    if checkpoint is not None:
        costs = planner.layer_costs_from_checkpoint(checkpoint, inv.plant.weights)
    else:
        m = inv.plant.model
        costs = planner.layer_costs_from_config(
            num_layers=m.num_layers,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            vocab_size=m.vocab_size,
            weights_dtype=inv.plant.weights,
        )
    nodes = [
        planner.Node(
            name=b.name,
            address=b.address,
            memory_bytes=b.stage_budget_bytes(),
            speed=b.speed,
            link_bytes_per_s=b.link_gbps * 1e9 / 8,
        )
        for b in boxes.values()
    ]
    plan = planner.plan_partition(costs, nodes)
    return [
        StagePlacement(index=i, box=boxes[st.node.name], layer_start=st.layer_start, layer_end=st.layer_end)
        for i, st in enumerate(plan.stages)
    ]
