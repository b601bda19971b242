"""Building a knowledge-base version from a folder of specs, incrementally.

Documents whose content hash (and the chunker and embedding model) are unchanged since the served version reuse
their stored chunks and vectors; only new or changed documents are embedded; removed ones drop out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edgeinspect.errors import InvalidInput
from edgeinspect.rag import store
from edgeinspect.rag.chunking import CHUNKER_VERSION, Chunk, ChunkConfig, chunk_document
from edgeinspect.rag.documents import DEFAULT_MAX_BYTES, Document, Skipped, read_document, scan_folder
from edgeinspect.rag.embed import Embedder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexConfig:
    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    max_file_bytes: int = DEFAULT_MAX_BYTES
    hnsw_threshold: int = 20_000  # chunk count from which HNSW replaces exact search
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    keep_versions: int = 3
    full: bool = False  # ignore the previous version: embed everything again


@dataclass
class IndexSummary:
    index_version: str
    index_type: str
    documents: int
    chunks: int
    embedded_chunks: int  # chunks embedded in this run (the rest were reused)
    reused_chunks: int
    new_docs: list[str]
    changed_docs: list[str]
    removed_docs: list[str]
    skipped: list[tuple[str, str]]  # (path, reason)
    bounded: list[tuple[str, str]]  # (path, what was cut)
    seconds: float
    unchanged: bool  # nothing changed: the served version was kept
    # Documents without a product in their front matter: no part filter matches them (`product: all` does).
    no_product: list[str] = field(default_factory=list)


@dataclass
class Progress:
    """Hooks the CLI hangs a progress bar on; all optional."""

    on_embed_start: Callable[[int], None] | None = None
    on_embedded: Callable[[int], None] | None = None


def choose_index_type(n_chunks: int, cfg: IndexConfig) -> str:
    return "hnsw_ip" if n_chunks >= cfg.hnsw_threshold else "flat_ip"


def build_faiss(vectors: np.ndarray, index_type: str, cfg: IndexConfig):
    """Inner product over unit vectors = cosine similarity."""
    import faiss

    dim = vectors.shape[1]
    if index_type == "hnsw_ip":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        index.hnsw.efSearch = cfg.hnsw_ef_search
    else:
        index = faiss.IndexFlatIP(dim)
    if len(vectors):
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def _compatible(prev: dict, embedder: Embedder, cfg: IndexConfig) -> bool:
    return (
        prev.get("format") == store.INDEX_FORMAT
        and prev.get("embedding_model") == embedder.model_id
        and prev.get("dimension") == embedder.dimension
        and prev.get("chunker") == _chunker_meta(cfg)
    )


def _chunker_meta(cfg: IndexConfig) -> dict:
    return {"version": CHUNKER_VERSION, **asdict(cfg.chunk), "max_file_bytes": cfg.max_file_bytes}


def read_corpus(source: Path, cfg: IndexConfig) -> tuple[list[Document], list[tuple[str, str]]]:
    docs: list[Document] = []
    skipped: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for path in scan_folder(source):
        got = read_document(path, source, cfg.max_file_bytes)
        if isinstance(got, Skipped):
            log.warning("skipping %s: %s", got.path, got.reason)
            skipped.append((got.path, got.reason))
        elif got.doc_id in seen:
            skipped.append((got.path, f"duplicate doc_id '{got.doc_id}' (already used by {seen[got.doc_id]})"))
        else:
            seen[got.doc_id] = got.path
            docs.append(got)
    return docs, skipped


def build_index(
    source: Path, kb: Path, embedder: Embedder, cfg: IndexConfig | None = None, progress: Progress | None = None
) -> IndexSummary:
    """Indexes `source` into a new version of `kb` and makes it current (or keeps the current one if unchanged)."""
    cfg = cfg or IndexConfig()
    progress = progress or Progress()
    t0 = time.perf_counter()
    if not source.is_dir():
        raise InvalidInput(f"source folder {source} does not exist")
    with store.writer_lock(kb):
        stale = store.remove_stale_staging(kb)
        if stale:
            log.warning("removed unfinished builds left by an interrupted indexer: %s", stale)
        docs, skipped = read_corpus(source, cfg)
        no_product = sorted(d.path for d in docs if not d.product)
        if no_product:
            log.warning("%d documents have no product, so no part filter will match them: %s", len(no_product),
                        ", ".join(no_product))  # fmt: skip
        prev_version = store.current_version(kb)
        prev_path = store.version_path(kb, prev_version) if prev_version else None
        prev = store.read_manifest(prev_path) if prev_path else None
        if prev is not None and (cfg.full or not _compatible(prev, embedder, cfg)):
            log.info("previous version %s not reused (full rebuild or settings changed)", prev_version)
            prev = None
        prev_docs = prev["documents"] if prev else {}

        # Per document: reuse the stored chunks+vectors or chunk it for embedding.
        plan: list[tuple[Document, list[Chunk], np.ndarray | None]] = []
        bounded: list[tuple[str, str]] = []
        to_embed: list[Chunk] = []
        new_docs, changed_docs = [], []
        con = store.open_chunks_db(prev_path / store.CHUNKS_DB) if prev and prev_path else None
        prev_vectors = np.load(prev_path / store.VECTORS, mmap_mode="r") if prev and prev_path else None
        try:
            for doc in docs:
                old = prev_docs.get(doc.doc_id)
                if old and old["sha256"] == doc.sha256 and con is not None and prev_vectors is not None:
                    rows, chunks = store.read_doc_chunks(con, doc.doc_id)
                    plan.append((doc, chunks, np.asarray(prev_vectors[rows], dtype=np.float32)))
                    if old.get("note"):
                        bounded.append((doc.path, old["note"]))
                    continue
                (changed_docs if old else new_docs).append(doc.doc_id)
                chunks, cut = chunk_document(doc, cfg.chunk)
                notes = [n for n in (doc.note, f"chunk limit: kept first {len(chunks)} chunks" if cut else "") if n]
                if notes:
                    bounded.append((doc.path, "; ".join(notes)))
                plan.append((doc, chunks, None))
                to_embed.extend(chunks)
        finally:
            if con is not None:
                con.close()
        removed = sorted(set(prev_docs) - {d.doc_id for d in docs})
        reused = sum(len(c) for _, c, v in plan if v is not None)
        n_chunks = reused + len(to_embed)
        index_type = choose_index_type(n_chunks, cfg)

        if prev and not to_embed and not removed and prev.get("index_type") == index_type:
            return IndexSummary(
                prev["index_version"], index_type, len(docs), n_chunks, 0, reused, [], [], [],
                skipped, bounded, time.perf_counter() - t0, unchanged=True, no_product=no_product,
            )  # fmt: skip

        if progress.on_embed_start:
            progress.on_embed_start(len(to_embed))
        log.info("embedding %d chunks (%d reused) from %d documents", len(to_embed), reused, len(docs))
        fresh = embedder.encode([c.embedding_text() for c in to_embed], progress=progress.on_embedded)

        all_chunks: list[Chunk] = []
        parts: list[np.ndarray] = []
        cursor = 0
        documents_meta = {}
        for doc, chunks, vecs in plan:
            if vecs is None:
                vecs = fresh[cursor : cursor + len(chunks)]
                cursor += len(chunks)
            all_chunks.extend(chunks)
            parts.append(vecs.reshape(-1, embedder.dimension))
            note = next((n for p, n in bounded if p == doc.path), "")
            documents_meta[doc.doc_id] = {
                "path": doc.path, "sha256": doc.sha256, "chunks": len(chunks), "title": doc.title,
                "kind": doc.kind, "product": doc.product, "note": note,
            }  # fmt: skip
        vectors = np.concatenate(parts) if parts else np.zeros((0, embedder.dimension), np.float32)  # [N, D]
        index = build_faiss(vectors, index_type, cfg)
        version = store.next_version_name(kb)
        manifest = {
            "format": store.INDEX_FORMAT,
            "index_version": version,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "embedding_model": embedder.model_id,
            "dimension": embedder.dimension,
            "index_type": index_type,
            "hnsw": {"m": cfg.hnsw_m, "ef_construction": cfg.hnsw_ef_construction, "ef_search": cfg.hnsw_ef_search},
            "chunk_count": len(all_chunks),
            "document_count": len(docs),
            "chunker": _chunker_meta(cfg),
            "source_dir": str(source.resolve()),
            "documents": documents_meta,
            "skipped": [{"path": p, "reason": r} for p, r in skipped],
        }
        store.publish_version(kb, manifest, all_chunks, vectors, index)
        pruned = store.prune_versions(kb, cfg.keep_versions)
        if pruned:
            log.info("pruned old versions %s", pruned)
        return IndexSummary(
            version, index_type, len(docs), len(all_chunks), len(to_embed), reused, new_docs, changed_docs,
            removed, skipped, bounded, time.perf_counter() - t0, unchanged=False, no_product=no_product,
        )  # fmt: skip
