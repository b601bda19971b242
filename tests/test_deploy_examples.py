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
        [
            EDGEINSPECT,
            "deploy",
            "render",
            "-i",
            REPO / "compose/plant.example.yaml",
            "-o",
            tmp_path,
            "-t",
            "all",
            "--no-certs",
        ],  # fmt: skip
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    committed = REPO / "compose" / "example"
    assert tree(committed) == tree(tmp_path), (
        "re-render: edgeinspect deploy render -i compose/plant.example.yaml -o compose/example -t all --no-certs"
    )
    stale = [rel for rel in tree(tmp_path) if not filecmp.cmp(committed / rel, tmp_path / rel, shallow=False)]
    assert stale == [], (
        "re-render: edgeinspect deploy render -i compose/plant.example.yaml -o compose/example -t all --no-certs"
    )


def test_render_help_explains_the_inventory_and_targets():
    done = subprocess.run([EDGEINSPECT, "deploy", "render", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for word in ("--inventory", "--out", "--target", "k8s", "compose", "secrets"):
        assert word in done.stdout


def test_render_issues_one_certificate_per_box_as_owner_only_secret_files(tmp_path):
    from edgeinspect import certs

    done = subprocess.run(
        [EDGEINSPECT, "deploy", "render", "-i", REPO / "compose/plant.example.yaml", "-o", tmp_path / "out",
         "-t", "all", "--ca", tmp_path / "pki"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "made the plant CA" in done.stderr and (tmp_path / "pki" / "ca.key").is_file()
    out = tmp_path / "out"
    for box, roles in [
        ("cell-pi", ["vision", "ingest"]),
        ("jetson-a", ["stage"]),
        ("line-server", ["gateway", "retrieval", "stage"]),
    ]:
        for folder in (box, "all-in-one", "k8s"):
            cert = out / folder / "secrets" / "tls" / f"{box}.crt"
            assert sorted(certs.roles_of(cert.read_bytes())) == sorted(roles)
            assert (out / folder / "secrets" / "tls" / f"{box}.key").stat().st_mode & 0o077 == 0
        assert not (out / "jetson-a" / "secrets" / "tls" / "line-server.key").exists()  # a box holds its own only
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".yaml", ".yml"):
            assert "PRIVATE KEY" not in path.read_text(), path
            if "/config/" in str(path):
                assert path.stat().st_mode & 0o077 == 0, path
