"""A stack started with `up --workdir X` is found by every client that reads EDGEINSPECT_WORKDIR=X, and `up` prints
the client line that works from where it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_clients_look_for_the_token_in_the_workdir_the_environment_names(tmp_path):
    env = {**os.environ, "EDGEINSPECT_WORKDIR": str(tmp_path / "line7")}
    code = "from edgeinspect.cli import options as o; print(o.WORKDIR); print(o.TOKEN_FILE)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(tmp_path / "line7"), str(tmp_path / "line7" / "api_token")]
    # The user's view of the same thing: the default shown by --help (wide enough that rich prints it whole).
    helped = subprocess.run(
        [sys.executable, "-m", "edgeinspect.cli", "inspect", "--help"],
        env={**env, "COLUMNS": "240"},
        capture_output=True,
        text=True,
    )
    assert f"[default: {tmp_path / 'line7' / 'api_token'}]" in helped.stdout


def test_up_prints_only_the_options_a_client_needs_beyond_its_defaults():
    from edgeinspect.cli.options import DEFAULT_GATEWAY, TOKEN_FILE, client_command

    assert client_command(DEFAULT_GATEWAY, TOKEN_FILE, None) == "edgeinspect inspect IMAGE"
    other = Path("/srv/stack/api_token")
    line = client_command("127.0.0.1:6001", other, Path("/srv/stack/tls/ca.crt"))
    assert line == ("edgeinspect inspect IMAGE --gateway 127.0.0.1:6001 --token-file /srv/stack/api_token "
                    "--ca /srv/stack/tls/ca.crt")  # fmt: skip
