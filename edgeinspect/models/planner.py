"""Partition planner: contiguous decoder-layer ranges over an ordered list of nodes that minimise the slowest
stage's time per token under each node's memory budget. Pure functions; no torch.

Cost model (decode, one token):
  stage time = its layers' seconds (measured on that node when known, else weight bytes read / (reference rate
               x node speed); decode is memory-bound) + its extras (stage 0: embedding lookup and aligner; last
               stage: final norm + lm_head) + sending the hidden state to the next node (bytes / link rate +
               latency; the last stage sends only a token id back, so just its link latency).
  stage memory = its layers' weight bytes + the extras it holds.
Packed formats (int8, int6, int4; models/quant.py, models/int4.py) hold more than a step reads: int6 and int4
linears keep an int8 copy for prompt chunks beside the 6- or 4-bit weights decode streams, so each layer has
held bytes (memory) and read bytes (time); their norms and embeddings stay fp32.
A node with a GPU holds its layers in the GPU's memory and reads them at the GPU's bandwidth (GPU_READ_EFFICIENCY of
its peak, until measured); on a Jetson (`unified`) that memory is the box's own RAM, shared with the OS and the
CPU, so its budget is the lesser of the two figures, never their sum (node_budget).
Every node gets at least one layer: the nodes are an explicit inventory, and a node with no layers would be a
pointless network hop (drop it from the list instead). The search is exact: a dynamic programme over
(node, layers covered) minimises the bottleneck, then a second one minimises the total time per token among the
splits that reach that bottleneck.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edgeinspect.errors import CheckpointError, InvalidInput, PlanInfeasible

# Weight bytes a speed-1.0 node reads per second while decoding. Measured on the reference dev box:
# bf16 decode of the 1.3B model reads 2.85 GB per token in ~381 ms (DESIGN.md §5), about 7.5 GB/s.
REF_BYTES_PER_S = 7.5e9
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
PACKED = ("int8", "int6", "int4")  # formats the stage quantizes after reading fp32 (see _linear_bytes)
BLOCK = 64  # int4/int6 kernels' block width: a linear whose input width is not a multiple stays int8
# Share of a GPU's peak memory bandwidth a batch-1 decode step is planned to reach. An assumption, not a measurement
# of ours (no Jetson in CI): give the node `measured:` timings from bench/stage_split.py run on it to replace it.
GPU_READ_EFFICIENCY = 0.6


@dataclass(frozen=True)
class NodeTimings:
    """Seconds per token measured on one node (bench/stage_split.py)."""

    layer_seconds: tuple[float, ...]  # one per decoder layer
    head_seconds: float = 0.0  # embedding lookup (+ aligner) on the first stage
    tail_seconds: float = 0.0  # final norm + lm_head (+ sampling) on the last stage


@dataclass(frozen=True)
class LayerCosts:
    """What the model costs: weight bytes per layer and the extras held by the first and last stage."""

    layer_bytes: tuple[int, ...]  # weights of each decoder layer (held in memory)
    head_bytes: int = 0  # embeddings (+ aligner): held by the first stage
    tail_bytes: int = 0  # final norm + lm_head: held by the last stage
    head_read_bytes: int = 0  # weight bytes stage 0's extras read per token (an embedding lookup reads one row)
    tail_read_bytes: int | None = None  # per token by the last stage's extras; None: all of tail_bytes
    shared_bytes: int = 0  # in both head and tail (tied embeddings), held once when one stage holds both
    hidden_size: int = 0  # values per token sent between stages
    measured: Mapping[str, NodeTimings] = field(default_factory=dict)  # by node name, where measured
    layer_read_bytes: tuple[int, ...] | None = None  # per token by each layer; None: all of layer_bytes

    @property
    def num_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def total_bytes(self) -> int:
        """Weight bytes of the whole language model held once."""
        return sum(self.layer_bytes) + self.head_bytes + self.tail_bytes - self.shared_bytes


@dataclass(frozen=True)
class Gpu:
    """The GPU a decoder node's stage runs on: its layers live in the GPU's memory and decode reads them there."""

    memory_bytes: int  # what the stage may spend on weights in the GPU's memory (KV cache, CUDA context left out)
    bytes_per_s: float  # peak memory bandwidth; GPU_READ_EFFICIENCY of it is planned
    unified: bool = False  # Jetson: the GPU's memory is the box's RAM, shared with the OS and the CPU


@dataclass(frozen=True)
class Node:
    """One decoder box, in pipeline order."""

    name: str
    address: str
    memory_bytes: int  # what the stage may spend on weights (leave room for the KV cache and runtime)
    speed: float = 1.0  # relative decode speed (1.0 = the reference rate REF_BYTES_PER_S); CPU nodes only
    link_bytes_per_s: float = math.inf  # link to the next node
    link_latency_s: float = 0.0  # one message to the next node
    gpu: Gpu | None = None  # the stage runs on this GPU (device cuda) instead of the CPU


def node_budget(node: Node) -> int:
    """Weight bytes the node's stage may hold: its RAM budget on the CPU, the GPU's on a discrete card, and on a
    unified-memory GPU (Jetson) the lesser of both, as they are the same memory."""
    if node.gpu is None:
        return node.memory_bytes
    if node.gpu.unified:
        return min(node.memory_bytes, node.gpu.memory_bytes)
    return node.gpu.memory_bytes


def node_rate(node: Node, ref_bytes_per_s: float = REF_BYTES_PER_S) -> float:
    """Weight bytes per second the node's stage is planned to read while decoding (when not measured)."""
    if node.gpu is None:
        return ref_bytes_per_s * node.speed
    return node.gpu.bytes_per_s * GPU_READ_EFFICIENCY


@dataclass(frozen=True)
class StagePlan:
    node: Node
    layer_start: int
    layer_end: int  # exclusive
    weight_bytes: int
    est_seconds: float  # per token: compute + transfer
    transfer_seconds: float = 0.0  # the transfer part of est_seconds

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


@dataclass(frozen=True)
class Plan:
    stages: tuple[StagePlan, ...]
    bottleneck_seconds: float

    @property
    def total_seconds(self) -> float:
        """One token's latency through the whole pipeline."""
        return sum(s.est_seconds for s in self.stages)


class GpuSpec(BaseModel):
    """A box's `gpu:` entry in a nodes file or a plant inventory. memory_gb reads like the box's own memory_gb there:
    in a nodes file the decimal GB the stage may spend on weights, in an inventory the card's GiB (the renderer takes
    the CUDA context and the KV cache off)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_gb: float = Field(..., gt=0, description="GPU memory (Jetson: the box's memory again: one pool)")
    bandwidth_gb_s: float = Field(
        ..., gt=0, description="peak memory bandwidth, GB/s (Orin NX ~102, AGX Orin ~205, L4 ~300)"
    )
    unified: bool = Field(default=False, description="Jetson: the GPU shares the box's RAM with the OS and the CPU")

    def to_gpu(self, unit_bytes: float, reserve_bytes: int = 0) -> Gpu:
        """The planner's Gpu: memory_gb in units of `unit_bytes`, less `reserve_bytes` (KV cache, CUDA context)."""
        return Gpu(max(int(self.memory_gb * unit_bytes) - reserve_bytes, 0), self.bandwidth_gb_s * 1e9, self.unified)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


# ---------------------------------------------------------------- cost tables


class _Stages:
    """Memory and time of node k holding layers [i, j), from prefix sums."""

    def __init__(self, costs: LayerCosts, nodes: Sequence[Node], wire_bytes_per_value: float, ref_rate: float):
        self.costs, self.nodes = costs, nodes
        self.k_last = len(nodes) - 1
        self.budgets = [node_budget(n) for n in nodes]
        self.bytes_prefix = _prefix(costs.layer_bytes)
        self.time_prefix: list[list[float]] = []
        self.head_s: list[float] = []
        self.tail_s: list[float] = []
        tail_read = costs.tail_bytes if costs.tail_read_bytes is None else costs.tail_read_bytes
        for node in nodes:
            m = costs.measured.get(node.name)
            if m is not None:
                self.time_prefix.append(_prefix(m.layer_seconds))
                self.head_s.append(m.head_seconds)
                self.tail_s.append(m.tail_seconds)
            else:
                rate = node_rate(node, ref_rate)
                read = costs.layer_bytes if costs.layer_read_bytes is None else costs.layer_read_bytes
                self.time_prefix.append(_prefix([b / rate for b in read]))
                self.head_s.append(costs.head_read_bytes / rate)
                self.tail_s.append(tail_read / rate)
        hidden_wire = costs.hidden_size * wire_bytes_per_value
        self.transfer = [
            (n.link_latency_s + (hidden_wire / n.link_bytes_per_s if k < self.k_last else 0.0))
            for k, n in enumerate(nodes)
        ]

    def weight_bytes(self, k: int, i: int, j: int) -> int:
        b = self.bytes_prefix[j] - self.bytes_prefix[i]
        if k == 0:
            b += self.costs.head_bytes
        if k == self.k_last:
            b += self.costs.tail_bytes
        if k == 0 and k == self.k_last:
            b -= self.costs.shared_bytes
        return b

    def seconds(self, k: int, i: int, j: int) -> float:
        """Per-token time of node k holding [i, j); inf when it does not fit in memory."""
        if self.weight_bytes(k, i, j) > self.budgets[k]:
            return math.inf
        t = self.time_prefix[k][j] - self.time_prefix[k][i] + self.transfer[k]
        if k == 0:
            t += self.head_s[k]
        if k == self.k_last:
            t += self.tail_s[k]
        return t


def _prefix(values: Sequence[float]) -> list[float]:
    out: list[float] = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


# ---------------------------------------------------------------- search


def _validate(costs: LayerCosts, nodes: Sequence[Node]) -> None:
    if not nodes:
        raise InvalidInput("no decoder nodes given")
    if costs.num_layers == 0:
        raise InvalidInput("the model has no decoder layers")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise InvalidInput(f"node names must be unique, got {names}")
    for n in nodes:
        if not n.speed > 0 or not n.link_bytes_per_s > 0 or n.memory_bytes < 0 or n.link_latency_s < 0:
            raise InvalidInput(f"node {n.name}: speed and link rate must be > 0, memory and latency >= 0")
        if n.gpu is not None and (not n.gpu.bytes_per_s > 0 or n.gpu.memory_bytes < 0):
            raise InvalidInput(f"node {n.name}: GPU bandwidth must be > 0 and its memory >= 0")
    for name, m in costs.measured.items():
        if len(m.layer_seconds) != costs.num_layers:
            raise InvalidInput(
                f"node {name}: {len(m.layer_seconds)} measured layer times for {costs.num_layers} layers"
            )


def _infeasible(costs: LayerCosts, nodes: Sequence[Node]) -> PlanInfeasible:
    """Explain why no split fits: the total shortfall, and nodes that cannot hold even their minimal share."""
    k_last = len(nodes) - 1
    lines = []
    if len(nodes) > costs.num_layers:
        lines.append(
            f"{len(nodes)} nodes but only {costs.num_layers} layers: every node needs at least one layer, drop a node"
        )
    need = costs.total_bytes
    offer = sum(node_budget(n) for n in nodes)
    if need > offer:
        lines.append(
            f"needs {fmt_bytes(need)} of weights, the nodes offer {fmt_bytes(offer)}: {fmt_bytes(need - offer)} short"
        )
    smallest = min(costs.layer_bytes)
    for k, n in enumerate(nodes):
        if k_last == 0:
            break  # a single node's share is the whole model: the total line above says it
        share, parts = smallest, ["1 layer"]
        if k == 0:
            share += costs.head_bytes
            parts.insert(0, "embeddings")
        if k == k_last:
            share += costs.tail_bytes
            parts.append("lm_head")
        if share > node_budget(n):
            lines.append(
                f"node {n.name} ({fmt_bytes(node_budget(n))}) cannot hold even its minimal share: "
                f"{' + '.join(parts)} = {fmt_bytes(share)}"
            )
    if not lines:
        lines.append(
            f"no contiguous split of {costs.num_layers} layers fits the budgets "
            f"({', '.join(f'{n.name} {fmt_bytes(node_budget(n))}' for n in nodes)}; layers of "
            f"{fmt_bytes(smallest)}-{fmt_bytes(max(costs.layer_bytes))}, embeddings {fmt_bytes(costs.head_bytes)}, "
            f"lm_head {fmt_bytes(costs.tail_bytes)})"
        )
    return PlanInfeasible("the model does not fit: " + "; ".join(lines))


def plan_partition(
    costs: LayerCosts,
    nodes: Sequence[Node],
    *,
    wire_bytes_per_value: float = 2.0,
    ref_bytes_per_s: float = REF_BYTES_PER_S,
) -> Plan:
    """Contiguous layer ranges, one per node in the given order, minimising the slowest stage per token.

    wire_bytes_per_value: hidden-state codec size (fp32 4, fp16 2, block-int8 34/32).
    Raises PlanInfeasible (naming the shortfall) when no split fits the memory budgets.
    """
    _validate(costs, nodes)
    n_nodes, n_layers = len(nodes), costs.num_layers
    if n_nodes > n_layers:
        raise _infeasible(costs, nodes)
    st = _Stages(costs, nodes, wire_bytes_per_value, ref_bytes_per_s)

    # best[k][j]: smallest bottleneck of nodes 0..k-1 covering layers [0, j), each node >= 1 layer
    inf = math.inf
    best = [[inf] * (n_layers + 1) for _ in range(n_nodes + 1)]
    best[0][0] = 0.0
    for k in range(1, n_nodes + 1):
        # leave at least one layer for every later node
        for j in range(k, n_layers - (n_nodes - k) + 1):
            best[k][j] = min(
                (max(best[k - 1][i], st.seconds(k - 1, i, j)) for i in range(k - 1, j)),
                default=inf,
            )
    bottleneck = best[n_nodes][n_layers]
    if math.isinf(bottleneck):
        raise _infeasible(costs, nodes)

    # among splits whose every stage is within the bottleneck, the smallest total latency
    cap = bottleneck * (1 + 1e-12)
    total = [[inf] * (n_layers + 1) for _ in range(n_nodes + 1)]
    arg = [[-1] * (n_layers + 1) for _ in range(n_nodes + 1)]
    total[0][0] = 0.0
    for k in range(1, n_nodes + 1):
        for j in range(k, n_layers - (n_nodes - k) + 1):
            for i in range(k - 1, j):
                c = st.seconds(k - 1, i, j)
                if c <= cap and total[k - 1][i] + c < total[k][j]:
                    total[k][j], arg[k][j] = total[k - 1][i] + c, i
    bounds = [n_layers]
    for k in range(n_nodes, 0, -1):
        bounds.append(arg[k][bounds[-1]])
    bounds.reverse()  # [0, b1, ..., n_layers]
    stages = tuple(
        StagePlan(
            node=nodes[k],
            layer_start=bounds[k],
            layer_end=bounds[k + 1],
            weight_bytes=st.weight_bytes(k, bounds[k], bounds[k + 1]),
            est_seconds=st.seconds(k, bounds[k], bounds[k + 1]),
            transfer_seconds=st.transfer[k],
        )
        for k in range(n_nodes)
    )
    return Plan(stages=stages, bottleneck_seconds=max(s.est_seconds for s in stages))


# ---------------------------------------------------------------- costs from a model's config


def dtype_bytes_of(weights: str | int) -> int:
    """Bytes per value of an unpacked format (fp32, bf16, fp16) or an explicit count."""
    if isinstance(weights, int):
        return weights
    if weights == "auto":
        raise InvalidInput(
            "weights: auto is picked by each stage at start-up by measurement (its log says 'weights auto -> ...'); "
            f"plan with the format it picks: one of {', '.join(FORMATS)}"
        )
    try:
        return DTYPE_BYTES[str(weights)]
    except KeyError:
        raise InvalidInput(f"unknown weights dtype {weights!r}; choose one of {', '.join(FORMATS)}") from None


FORMATS = (*DTYPE_BYTES, *PACKED)


def _linear_bytes(weights: str | int, n: int, k: int, role: str = "") -> tuple[int, int]:
    """(held, read per decode step) bytes of an [n, k] linear's weights in format `weights`. int8: k bytes + an fp32
    scale per row (+ an int32 row sum held beside them). int6 / int4: the int8 copy for prompts + 3k/4 (k/2) bytes
    and an fp16 scale per 32 weights, of which decode reads the latter; int4 keeps down_proj and the lm_head int8
    (models/int4.py), and either keeps a linear whose width does not fit the 64-wide blocks int8. That is our int4
    kernel's layout; a box that times torch's int4 kernel faster (one without AVX2, where ours is plain C) holds and
    reads a bf16 zero point beside each scale, 1/16 byte per int4 weight more than planned (~11%)."""
    if weights not in PACKED:
        b = n * k * dtype_bytes_of(weights)
        return b, b
    int8 = n * k + 8 * n
    if weights == "int8" or k % BLOCK or (weights == "int4" and role in ("down_proj", "lm_head")):
        return int8, n * k + 4 * n
    packed = n * k * (3 if weights == "int6" else 2) // 4 + n * k // 16
    return int8 + packed, packed


def layer_costs_from_config(
    text_config: Mapping[str, Any],
    dtype_bytes: int | str,
    *,
    aligner_in_features: int = 0,
    tie_word_embeddings: bool | None = None,
) -> LayerCosts:
    """Weight bytes of a LLaMA-style language model from its config dict (DeepSeek-VL's `text_config`), in a
    16/32-bit format or a packed one (int8, int6, int4: held and read bytes differ, see _linear_bytes).

    aligner_in_features: the vision tower's width when stage 0 also holds the aligner (Linear-GELU-Linear).
    tie_word_embeddings: overrides the config's own flag (DeepSeek-VL keeps the governing one at the top level).
    """
    c = text_config
    try:
        h, inter, n_layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        heads, vocab = c["num_attention_heads"], c["vocab_size"]
    except KeyError as err:
        raise InvalidInput(f"language-model config lacks {err.args[0]!r}") from None
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    tie = bool(c.get("tie_word_embeddings", False)) if tie_word_embeddings is None else tie_word_embeddings
    packed = dtype_bytes in PACKED
    nb = 4 if packed else dtype_bytes_of(dtype_bytes)  # packed stages keep norms, biases, embeddings fp32

    linears = [  # (out, in, name) of one layer (q/k/v and gate/up fused on a stage: the same bytes)
        (heads * hd + 2 * kv * hd, h, "qkv_proj"),
        (h, heads * hd, "o_proj"),
        (2 * inter, h, "gate_up_proj"),
        (h, inter, "down_proj"),
    ]
    sized = [_linear_bytes(dtype_bytes, n, k, name) for n, k, name in linears]
    other = 2 * h  # two RMSNorm weights
    if c.get("attention_bias"):
        other += heads * hd + 2 * kv * hd + h
    if c.get("mlp_bias"):
        other += 2 * inter + h
    layer_held = sum(held for held, _ in sized) + other * nb
    layer_read = sum(read for _, read in sized) + other * nb
    embed = vocab * h
    aligner = 0
    if aligner_in_features:  # packed stages run it int8 (576 visual tokens a prompt)
        fc = [_linear_bytes("int8" if packed else dtype_bytes, h, k)[0] for k in (aligner_in_features, h)]
        aligner = sum(fc) + 2 * h * nb
    head_held, head_read = _linear_bytes(dtype_bytes, vocab, h, "lm_head")
    return LayerCosts(
        layer_bytes=(layer_held,) * n_layers,
        layer_read_bytes=(layer_read,) * n_layers if packed else None,
        head_bytes=embed * nb + aligner,
        tail_bytes=h * nb + head_held,  # final norm + lm_head (a copy of the embeddings when tied)
        head_read_bytes=h * nb,  # one embedding row per token; the aligner runs only at prefill
        tail_read_bytes=h * nb + head_read,
        shared_bytes=embed * nb if tie and not packed else 0,  # a packed lm_head is its own copy
        hidden_size=h,
    )


def layer_costs_from_checkpoint(path: str | Path, weights_dtype: str | int) -> LayerCosts:
    """Costs of a Hugging Face checkpoint folder from its config.json (DeepSeek-VL nests `text_config`)."""
    cfg_path = Path(path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{cfg_path} not found: not a Hugging Face checkpoint folder") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {err}") from None
    text = cfg.get("text_config", cfg)
    vision = cfg.get("vision_config") or {}
    tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return layer_costs_from_config(
        text,
        weights_dtype,
        aligner_in_features=int(vision.get("hidden_size", 0)) if "text_config" in cfg else 0,
        tie_word_embeddings=bool(tie),
    )
