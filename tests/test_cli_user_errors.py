"""The real `edgeinspect` command in a subprocess: a user error is one line on stderr and a non-zero exit, never a
traceback; `--version` answers; the renamed options keep their old spellings hidden."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgeinspect import __version__
from edgeinspect.assets import asset_path

EXE = Path(sys.executable).with_name("edgeinspect")


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [str(EXE)] if EXE.is_file() else [sys.executable, "-m", "edgeinspect.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("EDGEINSPECT_TOKEN", "EDGEINSPECT_GATEWAY")}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_user_errors_are_one_line_and_a_non_zero_exit(embedded_stack, tmp_path):
    image = str(asset_path("part_ok.jpg"))
    gateway = embedded_stack.gateway_address
    (tmp_path / "not-a-checkpoint").mkdir()
    cases = {  # name -> (argv, words the one line must hold)
        "missing image file": (
            ["inspect", str(tmp_path / "nope.jpg"), "--token", "ei_x", "--gateway", gateway],
            "does not exist",
        ),
        "wrong token": (
            ["inspect", image, "--token", "ei_not-a-real-token", "--gateway", gateway],
            "refused the token",
        ),
        "unreachable gateway": (
            ["inspect", image, "--token", "ei_x", "--gateway", f"127.0.0.1:{_closed_port()}"],
            "cannot reach the gateway",
        ),
        "missing config file": (["serve", "gateway", "--config", str(tmp_path / "nope.yaml")], "does not exist"),
        "bad checkpoint folder": (["model", "info", str(tmp_path / "not-a-checkpoint")], "no config.json"),
        "missing argument": (["inspect"], "Missing argument"),
        "missing knowledge base": (["kb", "stats", "--kb", str(tmp_path / "no-kb")], "no knowledge base"),
    }
    with ThreadPoolExecutor(4) as pool:  # each is a fresh Python start-up: run them side by side
        procs = list(pool.map(lambda argv: _cli(*argv), [argv for argv, _ in cases.values()]))
    results = dict(zip(cases, procs, strict=True))
    failures = []
    for name, proc in results.items():
        lines = proc.stderr.strip().splitlines()
        ok = (
            proc.returncode != 0
            and "Traceback" not in proc.stderr + proc.stdout
            and len(lines) == 1
            and lines[0].startswith("error: ")
            and cases[name][1] in lines[0]
        )
        if not ok:
            failures.append(f"{name}: exit {proc.returncode}, stderr {proc.stderr!r}, stdout {proc.stdout[-300:]!r}")
    assert not failures, "\n".join(failures)
    # The person learns what to fix, not where our code is.
    assert all("edgeinspect/" not in p.stderr and ".py" not in p.stderr for p in results.values())


def test_version():
    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"edgeinspect {__version__} (protocol edgeinspect.v1)"


@pytest.mark.parametrize(
    "argv, shown, hidden",
    [(["kb", "search", "--help"], "--part", "--product"), (["kb", "index", "--help"], "--kb", "--out")],
)
def test_renamed_options_show_the_new_name_only(argv, shown, hidden):
    from typer.testing import CliRunner

    from edgeinspect.cli import app

    out = CliRunner().invoke(app, argv, terminal_width=200).output
    assert shown in out and hidden not in out


def test_enum_options_list_their_choices():
    from typer.testing import CliRunner

    from edgeinspect.cli import app

    out = CliRunner().invoke(app, ["up", "--help"], terminal_width=200).output
    assert "fp32|fp16|int8" in out


def test_a_down_vision_node_is_named_not_blamed_on_the_gateway(tiny_checkpoint, tmp_path):
    import signal

    from edgeinspect.stack.launcher import LocalStack, StackOptions

    opts = StackOptions(workdir=tmp_path, checkpoint=tiny_checkpoint, stages=1, allow_unauthenticated=True)
    with LocalStack(opts) as stack:
        vision = stack.role("vision")
        os.kill(vision.pid, signal.SIGKILL)  # no supervisor here: it stays down
        vision.proc.wait(30)
        proc = _cli("inspect", str(asset_path("part_ok.jpg")), "--token", "x", "--gateway", stack.gateway_address)
    line = proc.stderr.strip()
    assert proc.returncode != 0 and len(line.splitlines()) == 1, proc.stderr + proc.stdout
    assert "cannot reach the gateway" not in line and "the gateway answered, but its vision node" in line, line
