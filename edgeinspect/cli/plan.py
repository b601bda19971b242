"""`edgeinspect plan`: read a nodes file, plan the layer ranges, print them as a table."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer
import yaml
from pydantic import ValidationError

from edgeinspect.config import WeightsDtype, WireCodec
from edgeinspect.errors import EdgeInspectError
from edgeinspect.models.nodes import MeasuredSpec, preset_costs, read_nodes, with_measurements
from edgeinspect.models.planner import (
    REF_BYTES_PER_S,
    Node,
    Plan,
    fmt_bytes,
    layer_costs_from_checkpoint,
    plan_partition,
)

# hidden-state bytes per value on the wire, per codec (block-int8: 34 bytes per 32 values)
WIRE_BYTES = {WireCodec.fp32: 4.0, WireCodec.fp16: 2.0, WireCodec.int8: 34 / 32}


class Preset(StrEnum):
    deepseek_vl_1_3b = "deepseek-vl-1.3b"


def load_nodes(path: Path) -> tuple[list[Node], dict[str, MeasuredSpec]]:
    """Nodes in pipeline order and any per-node measurements, from a nodes YAML file."""
    try:
        return read_nodes(path)
    except (yaml.YAMLError, ValidationError) as err:
        raise typer.BadParameter(f"{path}: {err}", param_hint="--nodes") from None


def render_plan(plan: Plan, title: str):
    """The plan in 80 columns; layer ranges written as `deploy render` writes them ([start, end))."""
    from rich.table import Table

    table = Table(title=title, caption=_ends_caption(len(plan.stages)))
    for col, justify in (
        ("stage", "right"),
        ("node", "left"),
        ("layers", "left"),
        ("weights", "right"),
        ("budget", "right"),  # the node's memory budget
        ("ms/token", "right"),
        ("link ms", "right"),
    ):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for k, st in enumerate(plan.stages):
        ms = f"{st.est_seconds * 1e3:.1f}"
        if st.est_seconds == plan.bottleneck_seconds:
            ms = f"[bold]{ms}[/bold]"
        table.add_row(
            str(k),
            st.node.name,
            f"[{st.layer_start}, {st.layer_end})",
            fmt_bytes(st.weight_bytes),
            fmt_bytes(st.node.memory_bytes),
            ms,
            f"{st.transfer_seconds * 1e3:.2f}",
        )
    return table


def _ends_caption(stages: int) -> str:
    if stages == 1:
        return "the one stage also holds the embeddings and the LM head"
    return f"stage 0 also holds the embeddings, stage {stages - 1} the LM head"


def plan_command(
    nodes: Path = typer.Option(
        ...,
        "--nodes",
        exists=True,
        dir_okay=False,
        help="YAML file listing the decoder nodes in pipeline order (see compose/nodes.example.yaml)",
    ),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", file_okay=False, help="plan for this Hugging Face checkpoint folder (its config.json)"
    ),
    preset: Preset | None = typer.Option(
        None, "--preset", help="plan for a known model's dimensions (the default when no --checkpoint)"
    ),
    weights: WeightsDtype = typer.Option(WeightsDtype.bf16, "--weights", help="decoder weight dtype on the stages"),
    codec: WireCodec = typer.Option(WireCodec.fp16, "--codec", help="hidden-state codec between stages"),
    ref_gbytes_per_s: float = typer.Option(
        REF_BYTES_PER_S / 1e9,
        "--ref-gbytes-per-s",
        min=0.001,
        help="weight bytes a speed-1.0 node reads per second while decoding (GB/s); scales nodes' `speed`",
    ),
) -> None:
    """Plan contiguous layer ranges over the decoder nodes (slowest stage minimal, memory respected) and print
    them as a table."""
    from rich.console import Console

    console = Console()
    if checkpoint is not None and preset is not None:
        raise typer.BadParameter("give --checkpoint or --preset, not both")
    node_list, measured = load_nodes(nodes)
    try:
        if checkpoint is not None:
            costs, model = layer_costs_from_checkpoint(checkpoint, weights.value), str(checkpoint)
        else:
            preset = preset or Preset.deepseek_vl_1_3b
            costs, model = preset_costs(preset.value, weights.value), preset.value
        costs = with_measurements(costs, measured)
        plan = plan_partition(
            costs, node_list, wire_bytes_per_value=WIRE_BYTES[codec], ref_bytes_per_s=ref_gbytes_per_s * 1e9
        )
    except EdgeInspectError as err:
        console.print(f"[red]cannot plan:[/red] {err}")
        raise typer.Exit(1) from None
    console.print(
        render_plan(plan, f"{model}, {weights.value} weights, {costs.num_layers} layers over {len(node_list)} nodes")
    )
    console.print(
        f"model weights {fmt_bytes(costs.total_bytes)}; slowest stage {plan.bottleneck_seconds * 1e3:.1f} ms "
        f"(at most {1 / plan.bottleneck_seconds:.1f} tokens/s with the pipeline full); one token through all "
        f"stages {plan.total_seconds * 1e3:.1f} ms; hidden state sent as {codec.value}"
    )
