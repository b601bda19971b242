"""The generated protobuf code is current, and the wheel carries every subpackage of the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys_path_tools = ROOT / "tools"


def test_generated_proto_code_is_not_stale(tmp_path):
    subprocess.run([sys.executable, str(sys_path_tools / "gen_protos.py"), str(tmp_path)], check=True)
    fresh = {p.relative_to(tmp_path): p.read_text() for p in (tmp_path / "edgeinspect" / "v1").glob("*.py*")}
    committed = {p.relative_to(ROOT): p.read_text() for p in (ROOT / "edgeinspect" / "v1").glob("*_pb2*.py*")}
    assert fresh.keys() == committed.keys()
    stale = [str(k) for k in fresh if fresh[k] != committed[k]]
    assert not stale, f"run `python tools/gen_protos.py`: stale generated files {stale}"


def test_wheel_contains_every_subpackage(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("edgeinspect-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    roots = {
        "edgeinspect": ROOT / "edgeinspect",
        "edgeinspect/models": ROOT / "models",
        "edgeinspect/services": ROOT / "services",
        "edgeinspect/rag": ROOT / "rag",
    }
    for prefix, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            rel = init.relative_to(folder)
            assert f"{prefix}/{rel}" in names, f"{prefix}/{rel} is missing from the wheel"
    assert not any(n.startswith(("models/", "services/", "rag/")) for n in names), "generic top-level packages"
    # Package data outside any package's own folder level: the console's templates and static files.
    console = ROOT / "services" / "console"
    for data in [*(console / "templates").iterdir(), *(console / "static").iterdir()]:
        rel = data.relative_to(ROOT / "services")
        assert f"edgeinspect/services/{rel}" in names, f"{rel} is missing from the wheel"
