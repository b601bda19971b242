"""Shared fixtures: generated checkpoints (the same code path as a downloaded one), offline hub."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from edgeinspect.models.tiny import TinySpec


def pytest_configure(config):
    # Nothing may reach a model hub: checkpoints are generated folders loaded with local_files_only.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# GQA (4 heads, 2 kv heads) and 5 layers, which 2, 3 and 4 stages do not divide.
TINY = TinySpec()
# Multi-head attention, an even layer count, another seed and image size.
TINY_MHA = TinySpec(layers=6, hidden=96, heads=4, kv_heads=4, intermediate=192, image_size=48, seed=1)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from edgeinspect.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("ckpt") / "tiny", TINY)


@pytest.fixture(scope="session")
def tiny_mha_checkpoint(tmp_path_factory):
    from edgeinspect.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("ckpt") / "tiny-mha", TINY_MHA)


@pytest.fixture(scope="session")
def part_images():
    """The shipped sample part photos, as PIL images."""
    from PIL import Image

    from edgeinspect.assets import asset_path

    names = ["part_ok.jpg", "part_scratch.jpg", "part_dent.jpg", "part_missing_hole.jpg"]
    return [Image.open(asset_path(n)).convert("RGB") for n in names]


@pytest.fixture(scope="session")
def embedded_stack(tiny_checkpoint, tmp_path_factory):
    """The real embedded default (vision, 2 stages, gateway as separate processes) on the tiny checkpoint."""
    from edgeinspect.stack.launcher import LocalStack, StackOptions

    opts = StackOptions(workdir=tmp_path_factory.mktemp("embedded"), checkpoint=tiny_checkpoint, stages=2)
    with LocalStack(opts) as stack:
        yield stack


@dataclass(frozen=True)
class ReviewingStack:
    stack: object  # LocalStack
    admin: str  # token of "ann-admin" (role admin: may review)
    reader: str  # token of "viewer" (role read)
    frame_budget: int


@pytest.fixture(scope="session")
def reviewing_stack(tiny_checkpoint, sample_kb, tmp_path_factory):
    """The embedded default with the sample KB, an admin and a read token, and a frame store that holds two sample
    frames (~53 kB each plus a thumbnail) but not three, and the web console as `up` starts it (the console,
    aggregate and store-recovery tests)."""
    import json

    from edgeinspect.services.common.auth import hash_token
    from edgeinspect.stack.launcher import LocalStack, StackOptions

    admin, reader, budget = "ei_console-admin-token-for-tests-0123", "ei_console-read-token-for-tests-0123", 140_000
    tokens = [{"name": "ann-admin", "role": "admin", "hash": hash_token(admin)},
              {"name": "viewer", "role": "read", "hash": hash_token(reader)}]  # fmt: skip
    env = {"EDGEINSPECT_API_TOKENS": json.dumps(tokens), "EDGEINSPECT_FRAMES__MAX_BYTES": str(budget)}
    opts = StackOptions(workdir=tmp_path_factory.mktemp("reviewing"), checkpoint=tiny_checkpoint, stages=2,
                        kb_dir=sample_kb, api_token=admin, extra_env=env, console_port=0)  # fmt: skip
    with LocalStack(opts) as stack:
        # The gateway serves before the retrieval node has loaded its index (reports then cite no specs); these
        # tests look at cited specs, so they start once it serves.
        _wait_serving(stack.address_of("retrieval"), timeout_s=180)
        yield ReviewingStack(stack, admin, reader, budget)


def _wait_serving(address: str, timeout_s: float) -> None:
    import time

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                answer = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"{address} not SERVING within {timeout_s}s"
            time.sleep(0.5)


@pytest.fixture(scope="session")
def sample_kb(tmp_path_factory):
    """The shipped sample knowledge base, indexed once per test session (real MiniLM embeddings, FAISS)."""
    from edgeinspect.rag import sample_kb_dir
    from edgeinspect.rag.embed import Embedder
    from edgeinspect.rag.indexer import build_index

    kb = tmp_path_factory.mktemp("sample-kb")
    build_index(sample_kb_dir(), kb, Embedder())
    return kb


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL (Debian's `postgresql`) for the session, on a unix socket in its own folder; skipped where
    the binaries are missing."""
    from pg_testing import PostgresServer, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@dataclass
class ReportDatabase:
    """One empty report database of one backend; `store()` opens a ReportStore on it (again after a close, as a
    restarted gateway would)."""

    backend: str
    tmp: object  # pathlib.Path: frames (and the SQLite file) live here
    dsn: str = ""

    def store(self, *, frames=None, **kw):
        from edgeinspect.services.gateway.reports.store import ReportStore
        from edgeinspect.services.store.database import PostgresDatabase

        db = self.tmp / "reports.sqlite" if self.backend == "sqlite" else PostgresDatabase(self.dsn)
        return ReportStore(db, frames=frames, **kw)


@pytest.fixture(params=["sqlite", "postgres"])
def report_db(request, tmp_path):
    """The report store's tests run on both databases: the embedded SQLite file and a shared PostgreSQL."""
    if request.param == "sqlite":
        return ReportDatabase("sqlite", tmp_path)
    server = request.getfixturevalue("postgres_server")
    return ReportDatabase("postgres", tmp_path, server.fresh_schema_dsn())
