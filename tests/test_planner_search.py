"""The partition planner finds the optimal contiguous split under memory budgets, follows node speeds, and names
the shortfall when the model does not fit."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from edgeinspect.errors import InvalidInput, PlanInfeasible
from edgeinspect.models.planner import (
    LayerCosts,
    Node,
    NodeTimings,
    layer_costs_from_checkpoint,
    layer_costs_from_config,
    plan_partition,
)

GB = 10**9
REF = 1e9  # bytes per second at speed 1.0, for the hand-built cases

# DeepSeek-VL 1.3B's language model, as its config.json gives it.
TEXT_1_3B = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=102400,
)


def _splits(n_layers: int, n_nodes: int):
    """Every way to cut [0, n_layers) into n_nodes non-empty contiguous ranges."""
    for cuts in itertools.combinations(range(1, n_layers), n_nodes - 1):
        b = (0, *cuts, n_layers)
        yield [(b[k], b[k + 1]) for k in range(n_nodes)]


def _brute_force(costs: LayerCosts, nodes: list[Node], wire: float) -> tuple[float, float] | None:
    """(bottleneck, total) of the best split by enumeration, written independently of the planner."""
    best: tuple[float, float] | None = None
    last = len(nodes) - 1
    for split in _splits(costs.num_layers, len(nodes)):
        times = []
        for k, (a, b) in enumerate(split):
            node = nodes[k]
            mem = sum(costs.layer_bytes[a:b])
            mem += (costs.head_bytes if k == 0 else 0) + (costs.tail_bytes if k == last else 0)
            mem -= costs.shared_bytes if last == 0 else 0
            if mem > node.memory_bytes:
                break
            m = costs.measured.get(node.name)
            if m is not None:
                t = sum(m.layer_seconds[a:b]) + (m.head_seconds if k == 0 else 0) + (m.tail_seconds if k == last else 0)
            else:
                read = sum(costs.layer_bytes[a:b])
                read += (costs.head_read_bytes if k == 0 else 0) + (costs.tail_bytes if k == last else 0)
                t = read / (REF * node.speed)
            t += node.link_latency_s + (costs.hidden_size * wire / node.link_bytes_per_s if k < last else 0)
            times.append(t)
        else:
            cand = (max(times), sum(times))
            if best is None or cand[0] < best[0] - 1e-12 or (abs(cand[0] - best[0]) <= 1e-12 and cand[1] < best[1]):
                best = cand
    return best


def _random_case(rng: random.Random) -> tuple[LayerCosts, list[Node]]:
    n_layers = rng.randint(2, 10)
    n_nodes = rng.choice([1, 2, 3, 3, 4, 4]) if n_layers >= 4 else rng.randint(1, n_layers)
    layer_bytes = tuple(rng.randint(50, 150) for _ in range(n_layers))
    nodes = [
        Node(
            name=f"n{k}",
            address=f"10.0.0.{k}:50060",
            memory_bytes=rng.randint(100, 900),
            speed=rng.choice([0.5, 1.0, 1.0, 2.0, 3.0]),
            link_bytes_per_s=rng.choice([1e3, 1e5, math.inf]),
            link_latency_s=rng.choice([0.0, 1e-7]),
        )
        for k in range(n_nodes)
    ]
    measured = {}
    if rng.random() < 0.3:
        k = rng.randrange(n_nodes)
        measured[f"n{k}"] = NodeTimings(
            layer_seconds=tuple(rng.uniform(1e-8, 2e-7) for _ in range(n_layers)),
            head_seconds=rng.uniform(0, 1e-7),
            tail_seconds=rng.uniform(0, 1e-7),
        )
    costs = LayerCosts(
        layer_bytes=layer_bytes,
        head_bytes=rng.randint(0, 200),
        tail_bytes=rng.randint(0, 200),
        head_read_bytes=rng.randint(0, 5),
        shared_bytes=0,
        hidden_size=rng.randint(1, 64),
        measured=measured,
    )
    return costs, nodes


@pytest.mark.parametrize("seed", range(300))
def test_plan_matches_brute_force_optimum(seed: int) -> None:
    costs, nodes = _random_case(random.Random(seed))
    wire = 2.0
    expected = _brute_force(costs, nodes, wire)
    if expected is None:
        with pytest.raises(PlanInfeasible):
            plan_partition(costs, nodes, wire_bytes_per_value=wire, ref_bytes_per_s=REF)
        return
    plan = plan_partition(costs, nodes, wire_bytes_per_value=wire, ref_bytes_per_s=REF)
    assert plan.bottleneck_seconds == pytest.approx(expected[0], rel=1e-9, abs=1e-15)
    assert plan.total_seconds == pytest.approx(expected[1], rel=1e-9, abs=1e-15)
    # contiguous, covering, one non-empty range per node in order, within every budget
    assert [s.node for s in plan.stages] == nodes
    assert plan.stages[0].layer_start == 0 and plan.stages[-1].layer_end == costs.num_layers
    for a, b in itertools.pairwise(plan.stages):
        assert a.layer_end == b.layer_start
    for s in plan.stages:
        assert s.layer_end > s.layer_start and s.weight_bytes <= s.node.memory_bytes


def test_speeds_3_1_1_give_the_fast_node_three_fifths_of_the_layers() -> None:
    costs = LayerCosts(layer_bytes=(100,) * 25)
    nodes = [Node("jetson", "a", 10**6, speed=3.0), Node("pi-a", "b", 10**6), Node("pi-b", "c", 10**6)]
    plan = plan_partition(costs, nodes, ref_bytes_per_s=REF)
    assert [s.num_layers for s in plan.stages] == [15, 5, 5]


def test_jetson_and_two_pis_at_1_3b_follow_the_speeds_and_count_the_lm_head() -> None:
    costs = layer_costs_from_config(TEXT_1_3B, "bf16", aligner_in_features=1024)
    nodes = [
        Node("jetson", "10.0.0.1:50060", 9 * GB, speed=3.0, link_bytes_per_s=125e6),
        Node("pi-a", "10.0.0.2:50060", 5 * GB, speed=1.0, link_bytes_per_s=125e6),
        Node("pi-b", "10.0.0.3:50060", 5 * GB, speed=1.0, link_bytes_per_s=125e6),
    ]
    plan = plan_partition(costs, nodes)
    jetson, pi_a, pi_b = (s.num_layers for s in plan.stages)
    assert jetson >= 2 * pi_a
    # the last Pi also reads the 210M-parameter lm_head (~4 layers' worth) every token
    assert pi_b < pi_a
    assert sum(s.weight_bytes for s in plan.stages) == costs.total_bytes


def test_memory_limit_moves_layers_off_the_fast_node() -> None:
    costs = LayerCosts(layer_bytes=(100,) * 10)
    free = plan_partition(costs, [Node("fast", "a", 10**4, 4.0), Node("slow", "b", 10**4)], ref_bytes_per_s=REF)
    tight = plan_partition(costs, [Node("fast", "a", 500, 4.0), Node("slow", "b", 10**4)], ref_bytes_per_s=REF)
    assert free.stages[0].num_layers == 8
    assert tight.stages[0].num_layers == 5 and tight.stages[0].weight_bytes == 500


def test_measured_times_override_the_speed_estimate() -> None:
    costs = LayerCosts(
        layer_bytes=(100,) * 6,
        measured={"b": NodeTimings(layer_seconds=(1e-9,) * 6)},  # far faster than its declared speed
    )
    plan = plan_partition(costs, [Node("a", "x", 10**4), Node("b", "y", 10**4)], ref_bytes_per_s=REF)
    assert [s.num_layers for s in plan.stages] == [1, 5]


def test_total_shortfall_is_named_in_the_error() -> None:
    costs = LayerCosts(layer_bytes=(GB,) * 6, head_bytes=GB, tail_bytes=GB // 2)
    nodes = [Node("jetson", "a", 3 * GB), Node("pi-a", "b", 2 * GB), Node("pi-b", "c", GB)]
    with pytest.raises(PlanInfeasible, match=r"needs 7\.5 GB of weights, the nodes offer 6\.0 GB: 1\.5 GB short"):
        plan_partition(costs, nodes)


def test_node_that_cannot_hold_its_minimal_share_is_named() -> None:
    costs = LayerCosts(layer_bytes=(GB,) * 4, head_bytes=2 * GB, tail_bytes=GB)
    nodes = [Node("pi-a", "a", int(2.5 * GB)), Node("jetson", "b", 10 * GB)]
    with pytest.raises(
        PlanInfeasible,
        match=r"node pi-a \(2\.5 GB\) cannot hold even its minimal share: "
        r"embeddings \+ 1 layer = 3\.0 GB",
    ):
        plan_partition(costs, nodes)


def test_fragmented_budgets_are_infeasible_with_an_explanation() -> None:
    # 2 + 2 + 2 GB fits 6 GB overall, but no contiguous cut gives each node whole layers within budget
    costs = LayerCosts(layer_bytes=(int(1.5 * GB),) * 4)
    nodes = [Node("a", "x", 2 * GB), Node("b", "y", 2 * GB), Node("c", "z", 2 * GB)]
    with pytest.raises(PlanInfeasible, match="no contiguous split of 4 layers fits"):
        plan_partition(costs, nodes)


def test_more_nodes_than_layers_is_infeasible() -> None:
    with pytest.raises(PlanInfeasible, match="3 nodes but only 2 layers"):
        plan_partition(LayerCosts(layer_bytes=(1, 1)), [Node(n, n, 10) for n in "abc"])


def test_duplicate_node_names_are_refused() -> None:
    with pytest.raises(InvalidInput, match="unique"):
        plan_partition(LayerCosts(layer_bytes=(1, 1)), [Node("a", "x", 10), Node("a", "y", 10)])


def test_single_node_holds_tied_embeddings_once() -> None:
    costs = LayerCosts(layer_bytes=(10,), head_bytes=50, tail_bytes=51, shared_bytes=50)
    plan = plan_partition(costs, [Node("solo", "x", 61)])
    assert plan.stages[0].weight_bytes == 61


def test_layer_costs_from_config_counts_the_1_3b_parts() -> None:
    c = layer_costs_from_config(TEXT_1_3B, 4)
    assert c.layer_bytes == (4 * (4 * 2048 * 2048 + 3 * 2048 * 5632 + 2 * 2048),) * 24
    assert c.tail_bytes == 4 * (102400 * 2048 + 2048)  # lm_head ~ 4 layers' worth
    assert 4 * c.layer_bytes[0] < c.tail_bytes < 5 * c.layer_bytes[0]
    tied = layer_costs_from_config({**TEXT_1_3B, "tie_word_embeddings": True}, "bf16")
    assert tied.shared_bytes == 2 * 102400 * 2048


def test_layer_costs_from_checkpoint_match_the_safetensors(tiny_checkpoint) -> None:
    from safetensors import safe_open

    sizes: dict[str, int] = {}
    for f in sorted(tiny_checkpoint.glob("*.safetensors")):
        with safe_open(f, "np") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                sizes[name] = math.prod(st.get_slice(name).get_shape())
    lm = {k: v for k, v in sizes.items() if "vision_model" not in k}
    layer0 = sum(v for k, v in lm.items() if ".language_model.layers.0." in k)
    costs = layer_costs_from_checkpoint(tiny_checkpoint, "fp32")
    assert costs.layer_bytes[0] == 4 * layer0
    assert costs.total_bytes == 4 * sum(lm.values())


@pytest.mark.cpu_paths
@pytest.mark.parametrize("weights", ["int8", "int6", "int4"])
def test_packed_formats_cost_what_a_loaded_stage_reads_per_step(tiny_checkpoint, weights) -> None:
    import torch

    from edgeinspect.models.checkpoint import open_checkpoint
    from edgeinspect.models.int4 import Int4Linear
    from edgeinspect.models.quant import Int8Linear
    from edgeinspect.models.stage import LayerRange, load_stage

    ckpt = open_checkpoint(tiny_checkpoint)
    module = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), weights)
    costs = layer_costs_from_checkpoint(tiny_checkpoint, weights)

    def read(part: torch.nn.Module) -> int:  # what a decode step streams (bench/perf_decode.py's step_bytes)
        if isinstance(part, (Int8Linear, Int4Linear)):
            return part.weight_bytes()
        own = sum(p.numel() * p.element_size() for p in part.parameters(recurse=False))
        return own + sum(read(child) for child in part.children())

    def zero_points(part: torch.nn.Module) -> int:  # torch's int4 layout, where this CPU picks it; the plan counts ours
        return sum(2 * m.scales.numel() for m in part.modules() if isinstance(m, Int4Linear) and m.kernel == "torch")

    assert costs.layer_read_bytes == tuple(read(layer) - zero_points(layer) for layer in module.layers)
    assert costs.tail_read_bytes == read(module.norm) + read(module.lm_head)
    assert all(held > r for held, r in zip(costs.layer_bytes, costs.layer_read_bytes, strict=True))


def test_int6_reads_less_than_int8_and_holds_more_and_auto_cannot_be_planned() -> None:
    int8, int6, int4 = (layer_costs_from_config(TEXT_1_3B, w) for w in ("int8", "int6", "int4"))
    assert int4.layer_read_bytes[0] < int6.layer_read_bytes[0] < int8.layer_read_bytes[0]
    assert 0.80 < int6.layer_read_bytes[0] / int8.layer_read_bytes[0] < 0.83  # 26 bytes per 32 weights
    assert int8.layer_bytes[0] < int4.layer_bytes[0] < int6.layer_bytes[0]  # the int8 prompt copy is held too
    assert int8.head_bytes == 4 * 102400 * 2048  # packed stages keep the embeddings fp32
    with pytest.raises(InvalidInput, match="picked by each stage at start-up"):
        layer_costs_from_config(TEXT_1_3B, "auto")
