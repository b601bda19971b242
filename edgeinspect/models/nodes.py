"""The nodes file `edgeinspect plan` reads: the decoder nodes in pipeline order (memory, speed, link), with optional
per-node measurements that replace the cost model's estimate for that node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from edgeinspect.models.planner import GpuSpec, LayerCosts, Node, NodeTimings, layer_costs_from_config


class MeasuredSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layer_ms: float | list[float] = Field(..., description="ms per token per layer: one value or one per layer")
    head_ms: float = Field(default=0.0, ge=0, description="embedding lookup (+ aligner) on the first stage")
    tail_ms: float = Field(default=0.0, ge=0, description="final norm + lm_head + sampling on the last stage")


class NodeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    address: str
    memory_gb: float = Field(..., gt=0, description="decimal GB (1e9 bytes) this stage may spend on weights")
    speed: float = Field(default=1.0, gt=0, description="relative decode speed (1.0 = 7.5 GB/s of weight reads)")
    link_gbps: float = Field(default=1.0, gt=0, description="link to the next node, Gbit/s")
    link_latency_ms: float = Field(default=0.3, ge=0, description="one message to the next node (gRPC stream ~0.2 ms)")
    gpu: GpuSpec | None = Field(
        default=None,
        description="the stage runs on this GPU: memory_gb (decimal GB it may spend on weights), bandwidth_gb_s, "
        "unified (a Jetson: one memory pool with the OS)",
    )
    measured: MeasuredSpec | None = None


class NodesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeSpec] = Field(..., min_length=1)


def read_nodes(path: Path) -> tuple[list[Node], dict[str, MeasuredSpec]]:
    """Nodes in pipeline order and any per-node measurements, from a nodes YAML file (compose/nodes.example.yaml).
    Raises yaml.YAMLError or pydantic.ValidationError on a malformed file."""
    spec = NodesFile.model_validate(yaml.safe_load(path.read_text()))
    nodes = [
        Node(
            name=n.name,
            address=n.address,
            memory_bytes=int(n.memory_gb * 1e9),
            speed=n.speed,
            link_bytes_per_s=n.link_gbps * 1e9 / 8,
            link_latency_s=n.link_latency_ms / 1e3,
            gpu=n.gpu.to_gpu(1e9) if n.gpu else None,
        )
        for n in spec.nodes
    ]
    return nodes, {n.name: n.measured for n in spec.nodes if n.measured is not None}


def with_measurements(costs: LayerCosts, measured: dict[str, MeasuredSpec]) -> LayerCosts:
    """`costs` with the per-node timings a nodes file measured (they replace the weight-bytes estimate)."""
    timings = {}
    for name, m in measured.items():
        per_layer = m.layer_ms if isinstance(m.layer_ms, list) else [m.layer_ms] * costs.num_layers
        timings[name] = NodeTimings(
            layer_seconds=tuple(v / 1e3 for v in per_layer),
            head_seconds=m.head_ms / 1e3,
            tail_seconds=m.tail_ms / 1e3,
        )
    return LayerCosts(**{**costs.__dict__, "measured": timings})


def preset_costs(preset: str, weights: str) -> LayerCosts:
    """Layer costs of a known model (models/tiny.py PRESETS) at `weights` dtype, without its checkpoint."""
    from edgeinspect.models.tiny import PRESETS  # the one definition of the real dimensions (imports torch)

    s = PRESETS[preset]
    text: dict[str, Any] = {
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "vocab_size": s.vocab_size,
        "tie_word_embeddings": False,
    }
    return layer_costs_from_config(text, weights, aligner_in_features=s.vision_hidden)
