"""The committed examples under compose/example are exactly what `edgeinspect deploy render` writes today."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EDGEINSPECT = Path(sys.executable).parent / "edgeinspect"


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_committed_example_equals_a_fresh_render_of_the_example_inventory(tmp_path):
    done = subprocess.run(
        [EDGEINSPECT, "deploy", "render", "-i", REPO / "compose/plant.example.yaml", "-o", tmp_path, "-t", "all"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    committed = REPO / "compose" / "example"
    assert tree(committed) == tree(tmp_path), (
        "re-render: edgeinspect deploy render -i compose/plant.example.yaml -o compose/example -t all"
    )
    stale = [rel for rel in tree(tmp_path) if not filecmp.cmp(committed / rel, tmp_path / rel, shallow=False)]
    assert stale == [], "re-render: edgeinspect deploy render -i compose/plant.example.yaml -o compose/example -t all"


def test_render_help_explains_the_inventory_and_targets():
    done = subprocess.run([EDGEINSPECT, "deploy", "render", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for word in ("--inventory", "--out", "--target", "k8s", "compose", "secrets"):
        assert word in done.stdout
