"""The retrieval node as a real process: Search with index version, argument checks, reload while serving; and
in-process: NOT_SERVING until an index exists."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.config import ServerConfig
from edgeinspect.rag import sample_kb_dir, store
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.indexer import build_index
from edgeinspect.services.common.channel import wait_for_serving
from edgeinspect.services.retrieval.server import build
from edgeinspect.services.retrieval.settings import RetrievalSettings
from edgeinspect.v1 import retrieval_pb2, retrieval_pb2_grpc

DOCS = ["HSG-210-burrs-flash-edges.md", "GSK-610-seals-gaskets.md", "QS-002-sampling-plans.md"]
MAX_K = 8


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture(scope="module")
def node(tmp_path_factory, embedder):
    """(address, source folder, kb folder) of a retrieval node running as its own process."""
    root = tmp_path_factory.mktemp("retrieval")
    src, kb = root / "specs", root / "kb"
    src.mkdir()
    for name in DOCS:
        shutil.copy(sample_kb_dir() / name, src / name)
    build_index(src, kb, embedder)
    port_file = root / "port"
    cfg = {
        "kb_dir": str(kb),
        "max_k": MAX_K,
        "reload_interval_s": 0.3,
        "log_json": True,
        "server": {"host": "127.0.0.1", "port": 0, "port_file": str(port_file)},
    }
    (root / "retrieval.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = (root / "node.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinspect.services.retrieval", "--config", str(root / "retrieval.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None, (root / "node.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "retrieval node did not bind"
            time.sleep(0.2)
        address = f"127.0.0.1:{port_file.read_text().strip()}"
        asyncio.run(wait_for_serving(address, 120))
        yield address, src, kb
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def _search(address: str, query: str, k: int, **filters: str) -> retrieval_pb2.SearchResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
        return await stub.Search(retrieval_pb2.SearchRequest(query=query, k=k, filters=filters), timeout=30)


async def test_search_returns_ranked_chunks_with_the_index_version(node):
    address, _, _ = node
    reply = await _search(address, "burr along the housing edge, is 0.3 mm acceptable?", 3)
    assert reply.index_version == "v000001"
    assert len(reply.chunks) == 3
    top = reply.chunks[0]
    assert top.doc_id == "HSG-210-burrs-flash-edges" and "0.3 mm" in top.text
    assert top.section and top.title and "HSG-210" in top.product and top.defect_classes
    assert [c.score for c in reply.chunks] == sorted((c.score for c in reply.chunks), reverse=True)
    only = await _search(address, "sample size", 5, doc_id="QS-002-sampling-plans")
    assert {c.doc_id for c in only.chunks} == {"QS-002-sampling-plans"}


async def test_stats_describe_the_served_index(node, tmp_path, embedder):
    address, src, kb = node
    async with grpc.aio.insecure_channel(address) as ch:
        stats = await retrieval_pb2_grpc.RetrievalServiceStub(ch).Stats(retrieval_pb2.IndexStatsRequest())
    assert stats.documents >= 3 and stats.chunks > stats.documents
    assert stats.embedding_model.endswith("all-MiniLM-L6-v2") and stats.dimension == 384
    assert stats.index_type == "flat_ip"
    # What the gateway handshakes on: what the version holds (the same specs give the same fingerprint in any
    # KB folder) and when it was built; each Search says which one answered.
    assert stats.fingerprint == store.content_fingerprint(store.read_manifest(store.version_path(kb)))
    assert stats.created_at.startswith("20")
    assert (await _search(address, "burr", 1)).index_fingerprint == stats.fingerprint
    again = tmp_path / "kb-again"
    build_index(src, again, embedder)
    assert store.content_fingerprint(store.read_manifest(store.version_path(again))) == stats.fingerprint


@pytest.mark.parametrize(
    ("query", "k", "filters"),
    [("", 3, {}), ("   ", 3, {}), ("burr", 0, {}), ("burr", -2, {}), ("burr", MAX_K + 1, {}), ("burr", 3, {"x": "y"})],
)
async def test_bad_requests_are_invalid_argument_and_the_node_keeps_serving(node, query, k, filters):
    address, _, _ = node
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _search(address, query, k, **filters)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details()
    good = await _search(address, "gasket twisted", 1)
    assert good.chunks[0].doc_id == "GSK-610-seals-gaskets"


async def test_a_new_index_version_is_served_without_dropping_requests(node, embedder):
    address, src, kb = node
    shutil.copy(sample_kb_dir() / "WLD-710-bracket-welds.md", src)
    failures: list[BaseException] = []
    versions: set[str] = set()
    stop = asyncio.Event()

    async def hammer():
        while not stop.is_set():
            try:
                versions.add((await _search(address, "undercut on the bracket fillet weld", 2)).index_version)
            except grpc.aio.AioRpcError as exc:
                failures.append(exc)

    load = asyncio.create_task(hammer())
    summary = await asyncio.to_thread(build_index, src, kb, embedder)
    assert summary.new_docs == ["WLD-710-bracket-welds"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = await _search(address, "undercut on the bracket fillet weld", 2)
        if reply.index_version == summary.index_version:
            break
        await asyncio.sleep(0.2)
    stop.set()
    await load
    assert reply.index_version == summary.index_version
    assert reply.chunks[0].doc_id == "WLD-710-bracket-welds"
    assert failures == []
    assert versions <= {"v000001", summary.index_version}


async def test_not_serving_until_an_index_exists_then_serving(tmp_path, embedder):
    kb = tmp_path / "kb"
    cfg = RetrievalSettings(kb_dir=kb, reload_interval_s=0.2, server=ServerConfig(port=0))
    node = await build(cfg, embedder=embedder)
    try:
        address = f"127.0.0.1:{node.port}"
        async with grpc.aio.insecure_channel(address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await retrieval_pb2_grpc.RetrievalServiceStub(ch).Search(retrieval_pb2.SearchRequest(query="burr", k=1))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            src = tmp_path / "specs"
            src.mkdir()
            shutil.copy(sample_kb_dir() / "PKG-950-packaging.md", src)
            await asyncio.to_thread(build_index, src, kb, embedder)
            await wait_for_serving(address, 30)
            reply = await retrieval_pb2_grpc.RetrievalServiceStub(ch).Search(
                retrieval_pb2.SearchRequest(query="ESD bag for boards", k=1)
            )
            assert reply.chunks[0].doc_id == "PKG-950-packaging"
    finally:
        await node.stop(0)
