"""Runs the partition planner over the inventory's decoder boxes."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.config import WireCodec
from edgeinspect.services.deploy.inventory import Inventory, Role
from edgeinspect.services.deploy.topology import StagePlacement

# Bytes per hidden-state value on the wire, per codec (block-int8: one fp16 scale per 32 int8 values).
WIRE_BYTES = {WireCodec.fp32: 4.0, WireCodec.fp16: 2.0, WireCodec.int8: 34 / 32}


def plan_stages(inv: Inventory, checkpoint: Path | None = None) -> list[StagePlacement]:
    """Layer ranges for the decoder boxes, in inventory order: costs from a local checkpoint copy when given,
    else from the inventory's model sizes. Raises PlanInfeasible when the layers do not fit."""
    from edgeinspect.models import planner

    plant = inv.plant
    boxes = inv.planned_stage_boxes()
    if checkpoint is not None:
        costs = planner.layer_costs_from_checkpoint(checkpoint, plant.weights.value)
    else:
        m = plant.model
        text_config = {
            "num_hidden_layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "intermediate_size": m.intermediate_size,
            "vocab_size": m.vocab_size,
            "num_attention_heads": m.num_attention_heads,
            "num_key_value_heads": m.num_key_value_heads,
        }
        costs = planner.layer_costs_from_config(
            text_config, plant.weights.value, aligner_in_features=m.vision_hidden_size, tie_word_embeddings=False
        )
    nodes = []
    for k, box in enumerate(boxes):
        # The planner budgets weights only: the KV cache this stage is allowed comes off the box's share.
        # A replica must hold the same range: plan against the smallest and slowest copy.
        copies = [box, *inv.replicas_of(box)]
        weights_budget = min(b.stage_budget_bytes() for b in copies) - plant.kv_budget_mb * 2**20
        nxt = boxes[k + 1] if k + 1 < len(boxes) else inv.only(Role.gateway)
        link = min(min(b.link_gbps for b in copies), nxt.link_gbps) * 1e9 / 8
        speed = min(b.speed for b in copies)
        nodes.append(planner.Node(box.name, box.address, max(weights_budget, 0), speed, link))
    plan = planner.plan_partition(costs, nodes, wire_bytes_per_value=WIRE_BYTES[plant.codec])
    by_name = {b.name: b for b in boxes}
    return [
        StagePlacement(
            index=k,
            box=by_name[st.node.name],
            layer_start=st.layer_start,
            layer_end=st.layer_end,
            weight_bytes=st.weight_bytes,
        )
        for k, st in enumerate(plan.stages)
    ]
