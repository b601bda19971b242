"""Incremental indexing: only changed documents are embedded, removed ones drop out, and a kill -9 mid-index
leaves the previous version whole and searchable."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeinspect.rag import sample_kb_dir, store
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.indexer import build_index
from edgeinspect.rag.search import Searcher, verify_kb

DOCS = [
    "HSG-210-burrs-flash-edges.md",
    "WLD-710-bracket-welds.md",
    "PKG-950-packaging.md",
    "QS-007-corrosion-handling-damage.txt",
    "BSB-720-busbar-plating.pdf",
]
QUERY = "undercut on the fillet weld of the mounting bracket"


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture
def corpus(tmp_path):
    src = tmp_path / "specs"
    src.mkdir()
    for name in DOCS:
        shutil.copy(sample_kb_dir() / name, src / name)
    return src


def _doc_chunks(kb: Path, doc_id: str) -> int:
    return store.read_manifest(store.version_path(kb))["documents"][doc_id]["chunks"]


def test_changing_one_document_embeds_only_its_chunks(corpus, tmp_path, embedder):
    kb = tmp_path / "kb"
    first = build_index(corpus, kb, embedder)
    assert first.embedded_chunks == first.chunks and first.index_version == "v000001"

    with (corpus / "PKG-950-packaging.md").open("a") as f:
        f.write("\n## 6 Returnable crates\nReturnable blue crates KLT-6428 are washed every 10 trips; cracked crates"
                " are scrapped, never taped.\n")  # fmt: skip
    second = build_index(corpus, kb, embedder)
    changed = _doc_chunks(kb, "PKG-950-packaging")
    assert second.changed_docs == ["PKG-950-packaging"] and second.new_docs == []
    assert second.embedded_chunks == changed
    assert second.reused_chunks == second.chunks - changed
    assert second.index_version == "v000002"
    top = Searcher(kb, embedder).search("are cracked returnable crates taped or scrapped?", 1).hits[0].chunk
    assert top.doc_id == "PKG-950-packaging" and "KLT-6428" in top.text

    # Nothing changed: no new version, nothing embedded.
    third = build_index(corpus, kb, embedder)
    assert third.unchanged and third.embedded_chunks == 0 and store.current_version(kb) == "v000002"
    assert verify_kb(kb) == []


def test_deleting_a_document_removes_its_chunks(corpus, tmp_path, embedder):
    kb = tmp_path / "kb"
    first = build_index(corpus, kb, embedder)
    welds = _doc_chunks(kb, "WLD-710-bracket-welds")
    (corpus / "WLD-710-bracket-welds.md").unlink()
    second = build_index(corpus, kb, embedder)
    assert second.removed_docs == ["WLD-710-bracket-welds"]
    assert second.embedded_chunks == 0
    assert second.chunks == first.chunks - welds
    searcher = Searcher(kb, embedder)
    assert all(h.chunk.doc_id != "WLD-710-bracket-welds" for h in searcher.search(QUERY, 20).hits)
    assert verify_kb(kb) == []


def test_verify_reports_a_source_changed_after_indexing(corpus, tmp_path, embedder):
    kb = tmp_path / "kb"
    build_index(corpus, kb, embedder)
    (corpus / "HSG-210-burrs-flash-edges.md").write_text("# changed\nburrs 0.5 mm allowed\n")
    (corpus / "new-spec.md").write_text("# New\nsomething\n")
    problems = verify_kb(kb)
    assert any("HSG-210-burrs-flash-edges" in p and "changed" in p for p in problems)
    assert any("new-spec.md" in p for p in problems)


def test_kill_9_mid_index_leaves_the_previous_version_serving(corpus, tmp_path, embedder):
    kb = tmp_path / "kb"
    build_index(corpus, kb, embedder)
    before = [(h.chunk.chunk_id, round(h.score, 5)) for h in Searcher(kb, embedder).search(QUERY, 5).hits]

    # A corpus big enough that embedding takes many seconds: the whole sample base, ten times over.
    big = tmp_path / "big"
    for n in range(10):
        shutil.copytree(sample_kb_dir(), big / f"copy{n}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinspect.cli", "kb", "index", str(big), "--out", str(kb), "--batch-size", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 180
        seen = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen += line
            if line.startswith("Embedding") or not line:
                break
        assert "Embedding" in seen, f"indexer never started embedding: {seen[-2000:]}"
        time.sleep(1.0)
        assert proc.poll() is None, "indexer finished before it could be killed: make the corpus bigger"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    assert store.current_version(kb) == "v000001"
    after = [(h.chunk.chunk_id, round(h.score, 5)) for h in Searcher(kb, embedder).search(QUERY, 5).hits]
    assert after == before
    assert verify_kb(kb, check_sources=False) == []
    # The lock died with the indexer: the next run proceeds and clears any half-written build.
    (corpus / "PKG-950-packaging.md").unlink()
    assert build_index(corpus, kb, embedder).index_version == "v000002"
    assert not list(store.versions_dir(kb).glob(".staging-*"))
