"""The generated protobuf code is current, and the wheel carries every subpackage of the source tree."""

from __future__ import annotations

import shutil
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


def _tracked_copy(dest: Path) -> Path:
    """The checkout's tracked files alone: setuptools builds in place, so a build from ROOT would read (and leave)
    a build/ folder whose stale build/lib could carry a removed module into the wheel and hide that it is gone."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():  # a file deleted in the work tree but not yet staged is still listed
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def test_wheel_contains_every_subpackage(tmp_path):
    source = _tracked_copy(tmp_path / "source")
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    wheel = next(out.glob("edgeinspect-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    package = source / "edgeinspect"
    tracked = {f"edgeinspect/{m.relative_to(package)}" for m in package.rglob("*.py")}
    packed = {n for n in names if n.endswith(".py")}
    assert not tracked - packed, f"modules missing from the wheel: {sorted(tracked - packed)}"
    assert not packed - tracked, f"modules in the wheel that the checkout does not track: {sorted(packed - tracked)}"
    assert not any(n.startswith(("models/", "services/", "rag/")) for n in names), "generic top-level packages"
    # Package data outside any package's own folder level: the console's templates and static files.
    console = source / "edgeinspect" / "services" / "console"
    for data in [*(console / "templates").iterdir(), *(console / "static").iterdir()]:
        rel = data.relative_to(source / "edgeinspect" / "services")
        assert f"edgeinspect/services/{rel}" in names, f"{rel} is missing from the wheel"
