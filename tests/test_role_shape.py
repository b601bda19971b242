"""Every role has one shape: a settings class, `serve(cfg)` and `main(config)` in edgeinspect.services.<role>.server,
and `python -m edgeinspect.services.<role> --config FILE` as its process entry (what `up`, the deployment files and
`edgeinspect serve ROLE` start). The model-free roles are started that way here; the others are in every e2e test."""

from __future__ import annotations

import importlib
import inspect
import signal
import subprocess
import sys
import time
import typing
import urllib.request
from pathlib import Path

import pytest
import yaml

from edgeinspect.assets import sample_image
from edgeinspect.cli.stack import Role
from edgeinspect.services.line.testing import free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("role", [r.value for r in Role])
def test_every_role_is_a_settings_class_a_serve_and_a_main(role):
    server = importlib.import_module(f"edgeinspect.services.{role}.server")
    assert inspect.iscoroutinefunction(server.serve), f"{role}: serve(cfg) is a coroutine function"
    (param,) = inspect.signature(server.serve).parameters.values()
    settings_cls = typing.get_type_hints(server.serve)[param.name]
    assert callable(getattr(settings_cls, "load", None)), f"{role}: serve takes the role's settings class"
    assert list(inspect.signature(server.main).parameters) == ["config_path"]
    entry = (REPO / "services" / role / "__main__.py").read_text()
    assert f"from edgeinspect.services.{role}.server import main" in entry and "role_main(main," in entry


def test_ingest_starts_as_every_role_does_and_stops_cleanly_on_sigterm(tmp_path):
    (tmp_path / "cam").mkdir()
    (tmp_path / "cam" / "part.jpg").write_bytes(sample_image().read_bytes())
    metrics_port = free_port()
    cfg = {
        "cameras": [
            {
                "id": "cam-1",
                "station": "station-1",
                "part": "HSG-210",
                "source": str(tmp_path / "cam"),
                "loop": True,
                "sampling": {"trigger_only": True},  # nothing is sent: no gateway needed to start
            }
        ],
        "gateway": f"127.0.0.1:{free_port()}",
        "frames_dir": str(tmp_path / "frames"),
        "server": {"metrics_port": metrics_port},
    }
    (tmp_path / "ingest.yaml").write_text(yaml.safe_dump(cfg))
    log = (tmp_path / "ingest.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinspect.services.ingest", "--config", str(tmp_path / "ingest.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "ingest.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/v2/health/live", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "ingest.log").read_text()
            time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            assert b"edgeinspect_ingest" in r.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "ingest.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


ROLE_PACKAGES = ("gateway", "stage", "vision", "retrieval", "ingest", "console")


@pytest.mark.parametrize("role", ROLE_PACKAGES)
def test_a_role_never_imports_another_role(role):
    """Roles meet on the wire (proto) and in services/common; one role's internals stay its own."""
    import ast

    for path in sorted((REPO / "services" / role).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["edgeinspect", "services"] and len(parts) > 2:
                    assert parts[2] not in set(ROLE_PACKAGES) - {role}, f"{path.name} imports {name}"
