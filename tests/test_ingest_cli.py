"""`edgeinspect ingest --dry-run` on the packaged sample: which frames would be inspected, and why."""

from __future__ import annotations

from typer.testing import CliRunner

from edgeinspect.assets import asset_path
from edgeinspect.cli import app


def test_dry_run_lists_one_inspection_per_part_and_why_the_rest_were_skipped():
    result = CliRunner().invoke(app, ["ingest", "--config", str(asset_path("cameras.sample.yaml")), "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "INSPECT" in line]
    assert len(lines) == 5 and all(line.startswith("conveyor-1") for line in lines)
    assert "first frame" in lines[0] and "frame      8" in lines[0]
    for reason in ("moving", "empty station", "unchanged since last inspection"):
        assert reason in result.output
    assert "camera conveyor-1: finished" in result.output


def test_dry_run_stops_after_max_reports_frames():
    args = ["ingest", "--config", str(asset_path("cameras.sample.yaml")), "--dry-run", "--max-reports", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert sum("INSPECT" in line for line in result.output.splitlines()) == 2
