"""`edgeinspect --help` as a newcomer reads it: commands in the order they are used, every option explained, no
type noise beside flags, and the tables a newcomer prints fit an 80-column terminal."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import typer.main

from edgeinspect.cli import app


def _help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    run = subprocess.run([sys.executable, "-m", "edgeinspect.cli", *args, "--help"], capture_output=True, text=True,
                         timeout=60, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


def _commands(cmd: click.Command, path: tuple[str, ...] = ()):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


def test_top_level_help_lists_what_a_newcomer_does_first_first():
    text = _help()
    first_words = [line.strip("│ ").split(" ", 1)[0] for line in text.splitlines() if line.startswith("│ ")]
    order = [w for w in first_words if w in ("up", "inspect", "status", "reports", "anomaly", "kb", "deploy", "plan")]
    assert order == ["up", "inspect", "status", "reports", "anomaly", "kb", "deploy", "plan"], order
    assert "Start here" in text and all(len(line) <= 80 for line in text.splitlines())


def test_every_option_of_every_command_has_help_and_flags_carry_no_type_label():
    root = typer.main.get_command(app)
    unexplained = [
        f"{' '.join(path)} {param.opts[0]}"
        for path, cmd in _commands(root)
        for param in cmd.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert not unexplained, unexplained
    for args in ((), ("up",), ("anomaly", "teach"), ("demo",)):
        assert "<bool>" not in _help(*args), args
    assert "anomaly gate" in _help("demo")
