"""`edgeinspect healthcheck ADDRESS` (the image's HEALTHCHECK) follows a real server's grpc.health.v1 status."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from edgeinspect.config import ServerConfig
from edgeinspect.services.common.server import start_server

EDGEINSPECT = Path(sys.executable).parent / "edgeinspect"


async def healthcheck(address: str, *extra: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        EDGEINSPECT,
        "healthcheck",
        address,
        "--timeout",
        "2",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode, out.decode()


async def test_healthcheck_exits_0_only_while_the_server_is_serving():
    running = await start_server([], [], ServerConfig(host="127.0.0.1", port=0), role="test")
    address = f"127.0.0.1:{running.port}"
    try:
        assert await healthcheck(address) == (1, f"{address}: NOT_SERVING\n")
        await running.health.set_serving(True)
        assert await healthcheck(address) == (0, f"{address}: SERVING\n")
    finally:
        await running.stop(0)
    code, out = await healthcheck(address)
    assert code == 1 and "UNAVAILABLE" in out


async def test_healthcheck_wait_returns_once_the_server_turns_serving():
    running = await start_server([], [], ServerConfig(host="127.0.0.1", port=0), role="test")
    address = f"127.0.0.1:{running.port}"
    try:
        waiter = asyncio.create_task(healthcheck(address, "--wait", "120"))
        # The waiter must still be waiting while the server says NOT_SERVING (its start takes a few seconds).
        done, _ = await asyncio.wait([waiter], timeout=8)
        assert not done
        await running.health.set_serving(True)
        assert await asyncio.wait_for(waiter, 60) == (0, f"{address}: SERVING\n")
    finally:
        await running.stop(0)


async def test_the_image_probe_answers_like_the_cli_without_importing_it():
    """`edgeinspect-healthcheck` (the compose and Kubernetes probe) is the same check, minus the CLI's imports."""
    running = await start_server([], [], ServerConfig(host="127.0.0.1", port=0), role="test")
    address = f"127.0.0.1:{running.port}"
    probe = [sys.executable, "-c", PROBE, address, "--timeout", "2"]
    try:
        await running.health.set_serving(True)
        proc = await asyncio.create_subprocess_exec(*probe, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert (proc.returncode, out.decode()) == (0, f"{address}: SERVING\n")
    finally:
        await running.stop(0)
    proc = await asyncio.create_subprocess_exec(*probe, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 1 and "UNAVAILABLE" in err.decode()


# The probe's entry point as the console script runs it; it exits with the CLI and its commands never imported.
PROBE = """import sys
from edgeinspect.services.common.health_probe import main
code = main(sys.argv[1:])
assert not any(m.startswith(("edgeinspect.cli", "torch", "typer")) for m in sys.modules), "imports too much"
sys.exit(code)
"""


async def test_healthcheck_wait_gives_up_with_exit_1_when_nothing_answers():
    running = await start_server([], [], ServerConfig(host="127.0.0.1", port=0), role="test")
    address = f"127.0.0.1:{running.port}"
    await running.stop(0)
    code, out = await healthcheck(address, "--wait", "1")
    assert code == 1 and "UNAVAILABLE" in out
