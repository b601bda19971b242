"""Bad input in a spec folder is skipped or bounded with a reason, and the good files are still indexed."""

from __future__ import annotations

import io
import shutil

import pytest
from pypdf import PdfReader, PdfWriter

from edgeinspect.rag import sample_kb_dir
from edgeinspect.rag.chunking import ChunkConfig
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.indexer import IndexConfig, build_index
from edgeinspect.rag.search import Searcher

GOOD = ["GSK-610-seals-gaskets.md", "BSB-720-busbar-plating.pdf"]


def _encrypted_pdf(user_password: str) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(sample_kb_dir() / "BSB-720-busbar-plating.pdf"))
    # RC4 needs no optional crypto dependency, so this test also runs on a minimal install.
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def bad_corpus_summary(tmp_path_factory):
    src = tmp_path_factory.mktemp("specs")
    for name in GOOD:
        shutil.copy(sample_kb_dir() / name, src / name)
    (src / "locked.pdf").write_bytes(_encrypted_pdf("secret"))
    (src / "open-but-encrypted.pdf").write_bytes(_encrypted_pdf(""))
    pdf = (sample_kb_dir() / "BSB-720-busbar-plating.pdf").read_bytes()
    (src / "truncated.pdf").write_bytes(pdf[: len(pdf) // 3])
    (src / "garbage.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8)
    (src / "empty.md").write_bytes(b"")
    (src / "only-front-matter.md").write_text("---\ntitle: nothing\n---\n\n")
    (src / "bad-front-matter.md").write_text("---\n[unclosed\n---\nbody text\n")
    (src / "firmware.txt").write_bytes(bytes(range(256)) * 64)
    (src / "latin1.txt").write_bytes("Prüfanweisung für Gehäuse, Grat max 0,1 mm".encode("latin-1"))
    (src / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 100)
    line = "Log line: torque 4.5 Nm recorded for the cover screws at station ASM-2, all within limits.\n"
    (src / "huge-log.txt").write_text(line * 40_000)  # ~3.6 MB
    kb = tmp_path_factory.mktemp("kb")
    cfg = IndexConfig(max_file_bytes=256 * 1024, chunk=ChunkConfig(max_chunks_per_doc=30))
    embedder = Embedder()
    return build_index(src, kb, embedder, cfg), Searcher(kb, embedder)


def _reason(summary, path: str) -> str:
    reasons = dict(summary.skipped)
    assert path in reasons, f"{path} not skipped; skipped: {summary.skipped}"
    return reasons[path]


def test_each_bad_file_is_skipped_with_a_clear_reason(bad_corpus_summary):
    summary, _ = bad_corpus_summary
    assert "password required" in _reason(summary, "locked.pdf")
    assert "unreadable PDF" in _reason(summary, "truncated.pdf")
    assert "unreadable PDF" in _reason(summary, "garbage.pdf")
    assert _reason(summary, "empty.md") == "empty file"
    assert "no text" in _reason(summary, "only-front-matter.md")
    assert "front matter" in _reason(summary, "bad-front-matter.md")
    assert "binary" in _reason(summary, "firmware.txt")
    assert "not UTF-8" in _reason(summary, "latin1.txt")
    assert "unsupported file type '.jpg'" in _reason(summary, "photo.jpg")


def test_a_very_large_text_file_is_bounded_not_dropped(bad_corpus_summary):
    summary, searcher = bad_corpus_summary
    notes = dict(summary.bounded)
    assert "truncated: read first 256 KiB" in notes["huge-log.txt"]
    assert "chunk limit: kept first 30 chunks" in notes["huge-log.txt"]
    assert searcher.manifest["documents"]["huge-log"]["chunks"] == 30


def test_good_files_and_readable_encrypted_pdf_are_indexed(bad_corpus_summary):
    summary, searcher = bad_corpus_summary
    indexed = set(searcher.manifest["documents"])
    assert {"GSK-610-seals-gaskets", "BSB-720-busbar-plating", "open-but-encrypted", "huge-log"} == indexed
    assert summary.documents == 4
    top = searcher.search("gasket twisted in the cover groove", 1).hits[0].chunk
    assert top.doc_id == "GSK-610-seals-gaskets"
