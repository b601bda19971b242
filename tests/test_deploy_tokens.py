"""`deploy render` writes the plant's API tokens (0600, kept on re-render) where every rendered folder mounts them,
and ends with the next steps for this inventory."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from edgeinspect.services.common.auth import hash_token

REPO = Path(__file__).resolve().parents[1]


def render(out: Path, pki: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "edgeinspect.cli", "deploy", "render", "-i", REPO / "compose/plant.example.yaml",
         "-o", out, "--target", "all", "--ca", pki],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_render_writes_token_secrets_where_they_are_mounted_and_keeps_them_on_re_render(tmp_path):
    out, pki = tmp_path / "plant", tmp_path / "pki"
    printed = render(out, pki)
    admin = (out / "secrets/admin_token").read_text().strip()
    ingest = (out / "secrets/ingest_token").read_text().strip()
    listed = json.loads((out / "line-server/secrets/api_tokens.json").read_text())
    assert {(t["role"], t["hash"]) for t in listed} == {("admin", hash_token(admin)), ("inspect", hash_token(ingest))}
    assert (out / "all-in-one/secrets/api_tokens.json").read_text() == json.dumps(listed) + "\n"
    assert (out / "cell-pi/secrets/ingest_token").read_text().strip() == ingest  # the ingest box presents it
    assert not (out / "jetson-a/secrets/api_tokens.json").exists()  # a box without a gateway holds no hashes
    env = (out / "k8s/secrets.env").read_text().splitlines()
    assert env == [f"EDGEINSPECT_API_TOKENS={json.dumps(listed)}", f"EDGEINSPECT_API_TOKEN={ingest}"]
    for path in [*out.rglob("*token*"), out / "k8s/secrets.env"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert "Next steps" in printed and f"--token $(cat {out / 'secrets/admin_token'})" in printed
    assert "kubectl apply -k" in printed and "rsync -a" in printed
    render(out, pki)
    assert (out / "secrets/admin_token").read_text().strip() == admin  # handed-out tokens stay valid
    assert json.loads((out / "line-server/secrets/api_tokens.json").read_text()) == listed
