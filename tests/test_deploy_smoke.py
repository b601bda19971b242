"""`edgeinspect deploy smoke` (the guide's last step) against the real embedded stack: the report's figures, and a
refused call as one line with the gRPC status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinspect.assets import asset_path

pytestmark = pytest.mark.e2e
EDGEINSPECT = str(Path(sys.executable).parent / "edgeinspect")


def smoke(stack, token: str, *extra: str) -> subprocess.CompletedProcess:
    image = str(asset_path("part_dent.jpg"))
    argv = [EDGEINSPECT, "deploy", "smoke", "-g", stack.gateway_address, "--image", image, "--token", token, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_smoke_reports_the_gateways_ttft_per_token_time_and_partition(embedded_stack):
    done = smoke(embedded_stack, embedded_stack.api_token, "--json", "--max-new-tokens", "6")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["tokens"] == len(result["token_ids"]) and 0 < result["tokens"] <= 6
    assert result["ttft_s"] > 0 and result["total_s"] >= result["ttft_s"]
    assert result["tokens"] == 1 or result["per_token_s"] > 0
    stages = [embedded_stack.address_of(f"stage{k}") for k in range(2)]
    assert [p.split("=", 1)[1].split("[")[0] for p in result["partition"]] == stages


def test_smoke_with_a_wrong_token_exits_1_with_the_status_and_no_traceback(embedded_stack):
    done = smoke(embedded_stack, "not-the-token")
    assert done.returncode == 1
    assert "UNAUTHENTICATED" in done.stderr and "Traceback" not in done.stderr
