"""`edgeinspect plan` prints the plan as a table, and a clear error when the model does not fit."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from edgeinspect.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "compose" / "nodes.example.yaml"
runner = CliRunner()


def _rows(output: str) -> dict[str, list[str]]:
    """Table rows by node name: the cells between the box-drawing bars."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[0].isdigit():
            rows[cells[1]] = cells
    return rows


def test_plan_prints_one_row_per_node_with_layers_and_times() -> None:
    result = runner.invoke(app, ["plan", "--nodes", str(EXAMPLE)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 80  # a terminal's width, without wrapped cells
    rows = _rows(result.output)
    assert list(rows) == ["jetson-orin-nx", "pi5-a", "pi5-b"]
    jetson, pi_a, pi_b = rows.values()
    assert jetson[2].startswith("[0, ") and pi_b[2].endswith(", 24)")  # as `deploy render` writes ranges
    assert "stage 0 also holds the embeddings, stage 2 the LM head" in " ".join(result.output.split())
    assert jetson[4] == "9.0 GB"
    assert float(jetson[5]) > 0
    assert "slowest stage" in result.output


def test_plan_for_a_checkpoint_uses_its_config(tiny_checkpoint) -> None:
    result = runner.invoke(
        app,
        ["plan", "--nodes", str(EXAMPLE), "--checkpoint", str(tiny_checkpoint), "--weights", "fp32"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    assert rows["pi5-b"][2].endswith(", 5)")  # the tiny model has 5 layers
    assert "kB" in rows["pi5-a"][3]


def test_measurements_in_the_nodes_file_change_the_plan(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        "nodes:\n"
        "  - {name: a, address: 'a:1', memory_gb: 8}\n"
        "  - {name: b, address: 'b:1', memory_gb: 8, measured: {layer_ms: 0.01, tail_ms: 0.1}}\n"
    )
    result = runner.invoke(app, ["plan", "--nodes", str(nodes)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert _rows(result.output)["a"][2] == "[0, 1)"  # b measured far faster: it takes 23 of 24 layers


def test_plan_that_does_not_fit_exits_with_the_shortfall(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        "nodes:\n"
        "  - {name: pi-a, address: '10.0.0.1:50060', memory_gb: 1.5}\n"
        "  - {name: pi-b, address: '10.0.0.2:50060', memory_gb: 1.5}\n"
    )
    result = runner.invoke(app, ["plan", "--nodes", str(nodes), "--weights", "fp32"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "needs 6.6 GB of weights, the nodes offer 3.0 GB: 3.6 GB short" in result.output


def test_malformed_nodes_file_is_a_usage_error(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n  - {name: a, address: 'a:1', memory_gb: -1}\n")
    result = runner.invoke(app, ["plan", "--nodes", str(nodes)], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "memory_gb" in result.output


def test_packed_formats_plan_faster_stages_and_auto_is_refused_plainly() -> None:
    # DEPLOY.md tells users to plan with --weights int8: the packed formats read fewer bytes per token than bf16
    times = {}
    for weights in ("bf16", "int8", "int6"):
        result = runner.invoke(app, ["plan", "--nodes", str(EXAMPLE), "--weights", weights], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert f"{weights} weights" in result.output
        times[weights] = max(float(row[5]) for row in _rows(result.output).values())
    assert times["int6"] < times["int8"] < times["bf16"]
    result = runner.invoke(app, ["plan", "--nodes", str(EXAMPLE), "--weights", "auto"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "plan with the format it picks" in " ".join(result.output.split())
