"""One import name: `edgeinspect.*` is the only way in; `services`, `models` and `rag` never import as top-level."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("edgeinspect", "bench", "tests", "tools")
BANNED = {"services", "models", "rag"}
# String forms that import by name at run time: importlib.import_module("services.x"), `python -m services.x`.
DYNAMIC_IMPORTERS = {"import_module", "__import__", "find_spec"}


def _top_level_imports(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in DYNAMIC_IMPORTERS
        ):
            names = [node.args[0].value]
        elif isinstance(node, ast.List | ast.Tuple):
            # ["python", "-m", "services.gateway"] in a subprocess command line.
            items = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            names = [items[i + 1] for i, item in enumerate(items[:-1]) if item == "-m"]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in BANNED]
    return found


def test_no_module_imports_services_models_or_rag_as_a_top_level_package():
    files = [p for folder in SCANNED for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 200, "the scan found too few files to mean anything"
    offenders = [hit for path in files for hit in _top_level_imports(path)]
    assert not offenders, "import these through edgeinspect.*:\n" + "\n".join(offenders)


def test_the_scan_catches_each_form(tmp_path):
    # The checker itself: each way of writing the second name is caught, the right ones are not.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import services.common.metrics\nfrom models.tiny import TinySpec\nimport rag\n"
        "importlib.import_module('services.gateway')\ncmd = ['python', '-m', 'models.cli']\n"
        "from edgeinspect.services.common import metrics\nfrom . import models\n"
    )
    hits = [h.split(": ")[-1] for h in _top_level_imports(probe, tmp_path)]
    assert hits == ["services.common.metrics", "models.tiny", "rag", "services.gateway", "models.cli"]


@pytest.mark.parametrize("name", sorted(BANNED))
def test_the_folder_name_does_not_import_from_the_repository_root(name):
    # `python -c "import services"` from the root finds the folder on sys.path: it must refuse, not load a copy.
    proc = subprocess.run(
        [sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert f"import edgeinspect.{name}, not {name}" in proc.stderr


def test_ruff_bans_the_second_name(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import services.common.metrics\nfrom rag import sample_kb_dir\n")
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run(
        [str(ruff), "check", "--config", str(ROOT / "pyproject.toml"), "--select", "TID251", "--no-cache", str(probe)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stdout.count("TID251") == 2, proc.stdout


@pytest.mark.slow
def test_pyright_resolves_every_import_in_the_packages():
    # Minutes on a loaded 2-core box (torch's stubs), so slow here; tools/test.sh runs tools/typecheck.py in CI.
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import typecheck
    finally:
        sys.path.remove(str(ROOT / "tools"))
    failures, _ = typecheck.run(ROOT, sys.executable)
    assert not failures, [f"{typecheck.source_path(d['file'])}: {d['message']}" for d in failures]
