"""Runs the partition planner over the inventory's decoder boxes."""

from __future__ import annotations

from pathlib import Path

from edgeinspect.config import WireCodec
from edgeinspect.deploy.inventory import CUDA_CONTEXT_GIB, GIB, Box, Inventory, Role
from edgeinspect.deploy.topology import StagePlacement

# Bytes per hidden-state value on the wire, per codec (block-int8: one fp16 scale per 32 int8 values).
WIRE_BYTES = {WireCodec.fp32: 4.0, WireCodec.fp16: 2.0, WireCodec.int8: 34 / 32}


def stage_node(box: Box, kv_bytes: int):
    """The planner's view of `box`'s stage. The planner budgets weights only: the KV cache comes off the box's share
    (off the GPU's on a GPU box, where the cache lives), and so does the CUDA context; on a Jetson (unified) both
    come off the one RAM pool the OS and the co-located roles already took their share of."""
    from edgeinspect.models import planner

    host = box.stage_budget_bytes() - kv_bytes
    if box.gpu is None:
        return planner.Node(box.name, box.address, max(host, 0), box.speed)
    cuda = int(CUDA_CONTEXT_GIB * GIB)
    if box.gpu.unified:
        host -= cuda
    return planner.Node(box.name, box.address, max(host, 0), box.speed, gpu=box.gpu.to_gpu(GIB, cuda + kv_bytes))


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
    kv = plant.kv_budget_mb * 2**20
    for k, box in enumerate(boxes):
        # A replica must hold the same range: plan against the smallest and slowest copy (a CPU copy of a GPU box's
        # range, mixed failover, plans the range at the CPU's pace).
        copies = [stage_node(b, kv) for b in [box, *inv.replicas_of(box)]]
        budget = min(planner.node_budget(n) for n in copies)
        speed = min(planner.node_rate(n) for n in copies) / planner.REF_BYTES_PER_S
        # the last range answers whichever gateway runs the session: plan for the slowest gateway's link
        nxt = [boxes[k + 1]] if k + 1 < len(boxes) else inv.boxes_with(Role.gateway)
        link = min(b.link_gbps for b in [box, *inv.replicas_of(box), *nxt]) * 1e9 / 8
        nodes.append(planner.Node(box.name, box.address, budget, speed, link))
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
