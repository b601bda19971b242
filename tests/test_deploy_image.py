"""The image recipe: every COPY source exists, it runs as a non-root user, its HEALTHCHECK is grpc.health.v1,
and the entrypoint turns mounted secrets into environment variables (no Docker engine here to build it)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "compose" / "Dockerfile").read_text()


def instructions(keyword: str) -> list[str]:
    joined = DOCKERFILE.replace("\\\n", " ")
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(keyword + " ")]


def test_every_copy_source_is_in_the_repository_and_the_build_context():
    ignore = (REPO / "compose" / "Dockerfile.dockerignore").read_text()
    for args in instructions("COPY"):
        if args.startswith("--from"):
            continue
        for src in args.split()[:-1]:
            path = src.rstrip("*").rstrip("/")
            assert (REPO / path).exists() or src.endswith("*"), src
            assert f"!{path}" in ignore or f"!{path}/" in ignore, f"{src} is excluded from the build context"


def test_image_runs_as_non_root_with_a_grpc_health_healthcheck_and_no_anonymous_volumes():
    (user,) = instructions("USER")
    assert user.split(":")[0] not in ("0", "root")
    (health,) = instructions("HEALTHCHECK")
    assert "edgeinspect-healthcheck" in health
    # the box's folders are mounted by the rendered files; a VOLUME would add an anonymous volume per container
    assert instructions("VOLUME") == []
    assert re.search(r"ARG HAILO=0", DOCKERFILE)


def test_image_installs_only_from_the_wheelhouse_and_a_plant_pulls_python_slim_by_default():
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE
    (install,) = [run for run in instructions("RUN") if "pip install" in run]
    assert "--no-index" in install and "--find-links /tmp/wheels" in install
    assert "--mount=type=bind,source=compose/wheels" in install  # the wheelhouse never becomes a layer
    assert "--index-url" not in DOCKERFILE and "# syntax=" not in DOCKERFILE  # nothing pulled at build time


def test_entrypoint_exports_mounted_secrets_and_runs_edgeinspect(tmp_path):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "EDGEINSPECT_API_TOKENS").write_text('["t-1", "t-2"]')
    (secrets / "unrelated").write_text("nope")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "edgeinspect").write_text('#!/bin/sh\necho "args=$*"\necho "tokens=$EDGEINSPECT_API_TOKENS"\n')
    (fake / "edgeinspect").chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "SECRETS_DIR": str(secrets)}
    done = subprocess.run(
        ["sh", REPO / "compose" / "entrypoint.sh", "serve", "gateway"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["args=serve gateway", 'tokens=["t-1", "t-2"]']
