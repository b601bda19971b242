"""Searching one loaded knowledge-base version. A `Searcher` is immutable: reloading builds a new one."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinspect.errors import FailedPrecondition, InvalidInput, NotFound
from edgeinspect.rag import store
from edgeinspect.rag.chunking import Chunk
from edgeinspect.rag.embed import Embedder

log = logging.getLogger(__name__)

FILTER_KEYS = ("product", "station", "doc_id")
# Documents whose front matter says `product: all` (general procedures) match every product filter.
ALL_PRODUCTS = "all"


@dataclass(frozen=True)
class Hit:
    chunk: Chunk
    score: float


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    index_version: str
    search_ms: float  # embedding + index search + chunk lookup
    index_fingerprint: str = ""  # what that version holds (store.content_fingerprint)


class Searcher:
    """A FAISS index, its chunk store and manifest for one version; safe to share across threads."""

    def __init__(self, kb: Path, embedder: Embedder, version: str | None = None):
        import faiss

        self.path = store.version_path(kb, version)
        self.manifest = store.read_manifest(self.path)
        self.version: str = self.manifest["index_version"]
        self.fingerprint: str = store.content_fingerprint(self.manifest)
        if self.manifest["embedding_model"] != embedder.model_id or self.manifest["dimension"] != embedder.dimension:
            raise FailedPrecondition(
                f"index {self.version} was built with {self.manifest['embedding_model']} "
                f"({self.manifest['dimension']}-d); this node embeds with {embedder.model_id}"
            )
        self.embedder = embedder
        self.index = faiss.read_index(str(self.path / store.INDEX))
        if hasattr(self.index, "hnsw"):  # faiss's stubs know only the base Index (and not its HNSW parts)
            self.index.hnsw.efSearch = self.manifest["hnsw"]["ef_search"]  # pyright: ignore[reportAttributeAccessIssue]
        self._con = store.open_chunks_db(self.path / store.CHUNKS_DB)
        self._lock = threading.Lock()  # one sqlite connection, many gRPC worker threads
        rows = self._con.execute("SELECT row, doc_id, station, product FROM chunks ORDER BY row").fetchall()
        # Filter columns held in memory so a filtered search does not scan SQLite.
        self._doc = np.array([r[1] for r in rows], dtype=object)
        self._station = np.array([r[2] for r in rows], dtype=object)
        self._products = [frozenset(json.loads(r[3])) for r in rows]
        if self.index.ntotal != len(rows):
            raise FailedPrecondition(f"index {self.version}: {self.index.ntotal} vectors but {len(rows)} chunks")

    @property
    def chunk_count(self) -> int:
        return int(self.index.ntotal)

    def _allowed_rows(self, filters: Mapping[str, str]) -> np.ndarray | None:
        unknown = set(filters) - set(FILTER_KEYS)
        if unknown:
            raise InvalidInput(f"unknown filter(s) {sorted(unknown)}; allowed: {', '.join(FILTER_KEYS)}")
        mask = np.ones(self.chunk_count, dtype=bool)
        active = False
        for key, value in filters.items():
            if not value:
                continue
            active = True
            if key == "product":
                mask &= np.array([value in p or ALL_PRODUCTS in p for p in self._products], dtype=bool)
            elif key == "station":
                # `station: all` (a procedure for every station) matches every station filter, as product does.
                mask &= (self._station == value) | (self._station == ALL_PRODUCTS)
            else:
                mask &= self._doc == value
        return np.flatnonzero(mask) if active else None

    def search_vector(self, qvec: np.ndarray, k: int, filters: Mapping[str, str] | None = None) -> list[Hit]:
        """qvec: [1, D] unit vector."""
        import faiss

        allowed = self._allowed_rows(filters or {})
        if allowed is not None and len(allowed) == 0:
            return []
        params = None
        if allowed is not None:
            sel = faiss.IDSelectorBatch(allowed.astype(np.int64))
            if hasattr(self.index, "hnsw"):
                # A selective filter starves HNSW's beam: widen it so filtered recall holds up.
                hnsw_ef = self.index.hnsw.efSearch  # pyright: ignore[reportAttributeAccessIssue]  # stubs: Index only
                ef = max(hnsw_ef, 4 * k, 256)
                hnsw = faiss.SearchParametersHNSW  # pyright: ignore[reportAttributeAccessIssue]  # not in faiss's stubs
                params = hnsw(sel=sel, efSearch=ef)
            else:
                params = faiss.SearchParameters(sel=sel)  # pyright: ignore[reportCallIssue]  # stubs lack its keywords
        k_eff = min(k, self.chunk_count)
        if k_eff == 0:
            return []
        scores, ids = self.index.search(np.ascontiguousarray(qvec, dtype=np.float32), k_eff, params=params)
        found = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
        with self._lock:
            chunks = store.read_chunks_by_rows(self._con, [i for i, _ in found])
        return [Hit(chunks[i], s) for i, s in found if i in chunks]

    def search(self, query: str, k: int, filters: Mapping[str, str] | None = None) -> SearchResult:
        if not query.strip():
            raise InvalidInput("query is empty")
        if k <= 0:
            raise InvalidInput(f"k must be at least 1, got {k}")
        t0 = time.perf_counter()
        qvec = self.embedder.encode_query(query)  # [1, D]
        hits = self.search_vector(qvec, k, filters)
        return SearchResult(hits, self.version, (time.perf_counter() - t0) * 1000.0, self.fingerprint)


def verify_kb(kb: Path, check_sources: bool = True) -> list[str]:
    """Problems found (empty: all good): version files against the manifest, and source files against the hashes."""
    import faiss

    from edgeinspect.rag.documents import source_sha256

    problems: list[str] = []
    try:
        path = store.version_path(kb)
    except (FailedPrecondition, NotFound) as e:
        return [str(e)]
    manifest = store.read_manifest(path)
    for name, digest in manifest.get("files", {}).items():
        f = path / name
        if not f.is_file():
            problems.append(f"{name}: missing from {path}")
        elif store.sha256_file(f) != digest:
            problems.append(f"{name}: content does not match the manifest (corrupted?)")
    if problems:
        return problems
    index = faiss.read_index(str(path / store.INDEX))
    con = store.open_chunks_db(path / store.CHUNKS_DB)
    try:
        n_rows = con.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        per_doc = dict(con.execute("SELECT doc_id, COUNT(*) FROM chunks GROUP BY doc_id").fetchall())
    finally:
        con.close()
    vectors = np.load(path / store.VECTORS, mmap_mode="r")
    if not (index.ntotal == n_rows == len(vectors) == manifest["chunk_count"]):
        problems.append(
            f"sizes disagree: index {index.ntotal}, chunk store {n_rows}, vectors {len(vectors)}, "
            f"manifest {manifest['chunk_count']}"
        )
    if index.d != manifest["dimension"]:
        problems.append(f"index dimension {index.d} != manifest {manifest['dimension']}")
    for doc_id, meta in manifest["documents"].items():
        if per_doc.get(doc_id, 0) != meta["chunks"]:
            problems.append(f"{doc_id}: manifest lists {meta['chunks']} chunks, store holds {per_doc.get(doc_id, 0)}")
    if check_sources:
        src = Path(manifest["source_dir"])
        indexed = {meta["path"] for meta in manifest["documents"].values()}
        for doc_id, meta in manifest["documents"].items():
            f = src / meta["path"]
            if not f.is_file():
                problems.append(f"{doc_id}: source {f} no longer exists (re-index to drop it)")
            elif source_sha256(f) != meta["sha256"]:
                problems.append(f"{doc_id}: source {f} changed since indexing (re-index)")
        if src.is_dir():
            from edgeinspect.rag.documents import SUPPORTED_SUFFIXES, scan_folder

            skipped = {s["path"] for s in manifest.get("skipped", [])}
            for f in scan_folder(src):
                rel = f.relative_to(src).as_posix()
                if f.suffix.lower() in SUPPORTED_SUFFIXES and rel not in indexed and rel not in skipped:
                    problems.append(f"{rel}: new source file not in the index (re-index)")
    return problems
