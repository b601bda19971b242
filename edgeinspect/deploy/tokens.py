"""The plant's API tokens as `deploy render` writes them, so a rendered plant starts without hand-made secrets: an
admin token for the operator and the console, an inspect token the ingest boxes present, their hashes in every
gateway's `secrets/api_tokens.json` and both in `k8s/secrets.env`. Every file is 0600; the tokens are made once
and kept on re-render (a re-render must not lock out tokens already handed out)."""

from __future__ import annotations

import json
from pathlib import Path

from edgeinspect.deploy import compose
from edgeinspect.deploy.inventory import Inventory, Role
from edgeinspect.services.common.auth import hash_token, new_token

# At the top of the rendered folder, never copied to a box: the operator's tokens in plain text.
ADMIN_FILE = "secrets/admin_token"
INGEST_FILE = "secrets/ingest_token"
K8S_ENV = "k8s/secrets.env"


def _kept(out: Path, rel: str) -> str | None:
    path = out / rel
    return path.read_text().strip() or None if path.is_file() else None


def secret_files(inv: Inventory, folders: set[str], whole_plant: set[str], out: Path) -> dict[str, str]:
    """{path under `out`: text} of the token files for the rendered `folders` (`whole_plant`: all-in-one/, k8s/,
    which hold every role)."""
    admin = _kept(out, ADMIN_FILE) or new_token()
    ingest = _kept(out, INGEST_FILE) or new_token()
    name = inv.plant.name
    hashes = [
        {"name": f"{name}-admin", "role": "admin", "hash": hash_token(admin)},
        {"name": f"{name}-ingest", "role": "inspect", "hash": hash_token(ingest)},
    ]
    listed = json.dumps(hashes)
    files = {ADMIN_FILE: admin + "\n", INGEST_FILE: ingest + "\n"}
    gateway_boxes = {b.name for b in inv.boxes_with(Role.gateway)}
    ingest_boxes = {b.name for b in inv.boxes_with(Role.ingest)}
    tokens_file, _ = compose.SECRETS["api_tokens"]
    ingest_file, _ = compose.SECRETS["ingest_token"]
    for folder in sorted(folders - {"k8s"}):
        if folder in gateway_boxes or folder in whole_plant:
            files[f"{folder}/{tokens_file.removeprefix('./')}"] = listed + "\n"
        if folder in ingest_boxes or (folder in whole_plant and ingest_boxes):
            files[f"{folder}/{ingest_file.removeprefix('./')}"] = ingest + "\n"
    if "k8s" in folders:
        files[K8S_ENV] = f"{compose.TOKENS_ENV}={listed}\n{compose.TOKEN_ENV}={ingest}\n"
    return files
