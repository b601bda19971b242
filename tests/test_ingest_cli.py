"""`edgeinspect ingest --dry-run` on the packaged sample: which frames would be inspected, and why."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgeinspect.assets import asset_path
from edgeinspect.cli import app
from edgeinspect.cli.ingest import failure_lines
from edgeinspect.services.ingest.config import IngestSettings


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


def _cameras_yaml(tmp_path: Path, gateway: str, token: str, **overrides) -> Path:
    """The packaged sample's cameras.yaml, read once as fast as it decodes, sent to `gateway` with `token`."""
    sample = IngestSettings.load(asset_path("cameras.sample.yaml")).model_dump(mode="json")
    cam = {**sample["cameras"][0], "realtime": False, "loop": False}
    data = {
        **sample,
        "cameras": [cam],
        "gateway": gateway,
        "api_token": token,
        "frames_dir": str(tmp_path / "frames"),
        "retry_attempts": 1,
        "request_timeout_s": 30,
        **overrides,
    }
    path = tmp_path / "cameras.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_dry_run_ends_quietly_when_its_reader_closes_stdout(tmp_path):
    """`edgeinspect ingest --dry-run -v | head -3`: the run ends when head exits, with no traceback."""
    config = asset_path("cameras.sample.yaml")  # real time, in a loop: without the fix it never ends
    cmd = [sys.executable, "-m", "edgeinspect.cli", "ingest", "--config", str(config), "--dry-run", "-v"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()  # as head does after its lines
        assert proc.wait(timeout=30) == 128 + signal.SIGPIPE
    finally:
        proc.kill()
        proc.wait()
    assert all(b"conveyor-1" in line for line in lines)
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr


def test_no_gateway_exits_non_zero_with_one_line_naming_the_cause(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = _cameras_yaml(tmp_path, f"127.0.0.1:{port}", "t0ken", request_timeout_s=5)
    result = CliRunner().invoke(app, ["ingest", "--config", str(config), "--max-reports", "1"])
    assert result.exit_code == 1, result.output
    causes = [line for line in result.output.splitlines() if "every frame" in line]
    assert len(causes) == 1, result.output
    assert causes[0].startswith(f"gateway unreachable for every frame: UNAVAILABLE (is the gateway running at "
                                f"127.0.0.1:{port}?)")  # fmt: skip
    assert "AioRpcError" not in result.output and "debug_error_string" not in result.output


def test_failure_lines_count_each_cause_when_some_frames_were_delivered():
    lines = failure_lines({"UNAVAILABLE": (2, "UNAVAILABLE: connection refused")}, "gw:1", delivered=3)
    assert lines == [
        "gateway unreachable for 2 frames: UNAVAILABLE (is the gateway running at gw:1?): UNAVAILABLE: "
        "connection refused"
    ]


@pytest.mark.e2e
def test_a_wrong_token_exits_non_zero_saying_the_gateway_refused_every_frame(embedded_stack, tmp_path):
    config = _cameras_yaml(tmp_path, embedded_stack.gateway_address, "not-the-token")
    result = CliRunner().invoke(app, ["ingest", "--config", str(config)])
    assert result.exit_code == 1, result.output
    causes = [line for line in result.output.splitlines() if "every frame" in line]
    assert causes == ["gateway refused every frame: UNAUTHENTICATED (check api_token): UNAUTHENTICATED: invalid token"]
    assert "AioRpcError" not in result.output
