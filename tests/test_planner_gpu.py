"""GPU nodes in the partition planner: a GPU earns layers by its bandwidth, holds them in its own memory, and a
Jetson's GPU shares the box's RAM (its budget is the lesser figure, never the sum)."""

from __future__ import annotations

import pytest

from edgeinspect.errors import InvalidInput, PlanInfeasible
from edgeinspect.models.planner import (
    GPU_READ_EFFICIENCY,
    REF_BYTES_PER_S,
    Gpu,
    GpuSpec,
    LayerCosts,
    Node,
    layer_costs_from_config,
    node_budget,
    node_rate,
    plan_partition,
)

GB = 10**9
TEXT_1_3B = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=102400,
)
ORIN_NX = Gpu(memory_bytes=16 * GB, bytes_per_s=102e9, unified=True)


def test_a_jetsons_budget_is_the_lesser_of_its_ram_and_gpu_figures_not_their_sum():
    jetson = Node("orin", "a:1", memory_bytes=9 * GB, gpu=ORIN_NX)
    assert node_budget(jetson) == 9 * GB  # the OS's share is off the RAM figure; the GPU cannot have it back
    tight_gpu = Node("orin", "a:1", memory_bytes=9 * GB, gpu=Gpu(6 * GB, 102e9, unified=True))
    assert node_budget(tight_gpu) == 6 * GB


def test_a_discrete_gpu_holds_the_layers_in_its_own_memory():
    box = Node("l4", "a:1", memory_bytes=2 * GB, gpu=Gpu(20 * GB, 300e9))
    assert node_budget(box) == 20 * GB


def test_a_gpu_node_reads_at_its_bandwidth_not_the_cpu_speed():
    cpu = Node("pi", "a:1", memory_bytes=GB, speed=1.0)
    gpu = Node("orin", "a:2", memory_bytes=GB, speed=1.0, gpu=ORIN_NX)
    assert node_rate(cpu) == REF_BYTES_PER_S
    assert node_rate(gpu) == pytest.approx(102e9 * GPU_READ_EFFICIENCY)


def test_a_jetson_gets_the_layers_its_gpu_bandwidth_earns():
    costs = layer_costs_from_config(TEXT_1_3B, "bf16")
    pi = dict(memory_bytes=5 * GB, speed=1.0)
    cpu_only = plan_partition(costs, [Node("orin", "a:1", memory_bytes=9 * GB, speed=3.0), Node("pi", "b:1", **pi)])
    on_gpu = plan_partition(costs, [Node("orin", "a:1", memory_bytes=9 * GB, gpu=ORIN_NX), Node("pi", "b:1", **pi)])
    assert on_gpu.stages[0].num_layers > cpu_only.stages[0].num_layers
    # the Pi keeps what the slower side must: the bottleneck is the Pi's share, not the Jetson's
    assert on_gpu.stages[1].est_seconds == pytest.approx(on_gpu.bottleneck_seconds)
    assert on_gpu.bottleneck_seconds < cpu_only.bottleneck_seconds


def test_the_jetsons_shared_memory_caps_its_layers_even_when_its_gpu_is_fast():
    costs = LayerCosts(layer_bytes=(GB,) * 8, hidden_size=8)
    fast = Gpu(memory_bytes=16 * GB, bytes_per_s=1e12, unified=True)
    plan = plan_partition(costs, [Node("orin", "a:1", 3 * GB, gpu=fast), Node("pi", "b:1", 8 * GB, speed=0.01)])
    assert plan.stages[0].num_layers == 3  # 3 GB of RAM budget, whatever the 16 GB the GPU reports


def test_a_model_too_big_for_the_gpu_names_the_gpu_budget():
    costs = LayerCosts(layer_bytes=(GB,) * 4, hidden_size=8)
    with pytest.raises(PlanInfeasible, match="offer 2.0 GB"):
        plan_partition(costs, [Node("l4", "a:1", 64 * GB, gpu=Gpu(2 * GB, 300e9))])


def test_a_gpu_without_bandwidth_is_refused():
    costs = LayerCosts(layer_bytes=(GB,) * 2, hidden_size=8)
    with pytest.raises(InvalidInput, match="GPU bandwidth"):
        plan_partition(costs, [Node("x", "a:1", 4 * GB, gpu=Gpu(4 * GB, 0.0))])


def test_the_files_gpu_entry_converts_in_the_files_unit_less_the_reserve():
    spec = GpuSpec(memory_gb=16, bandwidth_gb_s=102, unified=True)
    assert spec.to_gpu(1e9, reserve_bytes=GB) == Gpu(15 * GB, 102e9, True)
    with pytest.raises(ValueError):
        GpuSpec(memory_gb=16, bandwidth_gb_s=0)


def test_the_nodes_file_takes_a_gpu_entry_and_the_jetson_gets_the_layers_its_bandwidth_earns(tmp_path):
    from edgeinspect.models.nodes import read_nodes

    path = tmp_path / "nodes.yaml"
    path.write_text(
        "nodes:\n"
        "  - {name: pi, address: 'a:1', memory_gb: 5.0}\n"
        "  - {name: orin, address: 'b:1', memory_gb: 9.0,"
        " gpu: {memory_gb: 16.0, bandwidth_gb_s: 102, unified: true}}\n"
    )
    nodes, _ = read_nodes(path)
    assert nodes[0].gpu is None and nodes[1].gpu == Gpu(16 * GB, 102e9, unified=True)
    assert node_budget(nodes[1]) == 9 * GB  # one pool: the lesser figure
    plan = plan_partition(layer_costs_from_config(TEXT_1_3B, "bf16"), nodes)
    assert plan.stages[1].num_layers > plan.stages[0].num_layers, "the Orin's GPU should take most layers"
    path.write_text("nodes:\n  - {name: x, address: 'a:1', memory_gb: 1.0, gpu: {memory_gb: 1.0}}\n")
    with pytest.raises(ValueError, match="bandwidth_gb_s"):
        read_nodes(path)
