"""The knowledge-base folder: immutable version directories and an atomically flipped CURRENT pointer.

    KB/
      CURRENT                  one line: the served version name (replaced with os.replace)
      .lock                    flock held by the one indexer writing
      versions/v000007/        manifest.json, chunks.sqlite, vectors.npy, index.faiss
      versions/.staging-*      a build in progress (or one killed mid-way; removed by the next indexer)

A version directory is complete before it gets its final name, and CURRENT names only complete versions, so a
crash at any point leaves the previous version whole and served.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np

from edgeinspect.durable import fsync_dir
from edgeinspect.errors import FailedPrecondition, NotFound
from edgeinspect.rag.chunking import Chunk

INDEX_FORMAT = 1
MANIFEST = "manifest.json"
CHUNKS_DB = "chunks.sqlite"
VECTORS = "vectors.npy"
INDEX = "index.faiss"
DATA_FILES = (CHUNKS_DB, VECTORS, INDEX)

_SCHEMA = """
CREATE TABLE chunks (
  row INTEGER PRIMARY KEY, chunk_id TEXT NOT NULL UNIQUE, doc_id TEXT NOT NULL, path TEXT NOT NULL,
  title TEXT NOT NULL, section TEXT NOT NULL, page INTEGER NOT NULL, text TEXT NOT NULL,
  product TEXT NOT NULL, station TEXT NOT NULL, defect_classes TEXT NOT NULL, severities TEXT NOT NULL
);
CREATE INDEX chunks_doc ON chunks(doc_id);
"""
_COLUMNS = "chunk_id, doc_id, path, title, section, page, text, product, station, defect_classes, severities"


def versions_dir(kb: Path) -> Path:
    return kb / "versions"


def current_version(kb: Path) -> str | None:
    """The served version name, or None for a KB never indexed."""
    try:
        name = (kb / "CURRENT").read_text().strip()
    except FileNotFoundError:
        return None
    return name or None


def version_path(kb: Path, version: str | None = None) -> Path:
    version = version or current_version(kb)
    if version is None:
        raise NotFound(f"no knowledge base at {kb}: run `edgeinspect kb index DIR --kb {kb}` first")
    path = versions_dir(kb) / version
    if not (path / MANIFEST).is_file():
        raise FailedPrecondition(f"knowledge base {kb}: version {version} named by CURRENT is missing")
    return path


def next_version_name(kb: Path) -> str:
    numbers = [int(p.name[1:]) for p in versions_dir(kb).glob("v[0-9]*") if p.name[1:].isdigit()]
    return f"v{max(numbers, default=0) + 1:06d}"


def read_manifest(path: Path) -> dict:
    return json.loads((path / MANIFEST).read_text())


def content_fingerprint(manifest: dict) -> str:
    """What a version holds, in 12 hex digits: its documents' contents, embedding model, chunker and index type.
    Two KB folders indexed from the same specs agree on it whatever their version names (which count per folder)."""
    held = {key: manifest.get(key) for key in ("format", "embedding_model", "dimension", "index_type", "chunker")}
    held["documents"] = {doc_id: meta["sha256"] for doc_id, meta in manifest["documents"].items()}
    return hashlib.sha256(json.dumps(held, sort_keys=True).encode()).hexdigest()[:12]


@contextmanager
def writer_lock(kb: Path) -> Iterator[None]:
    """One indexer per KB; a second one fails at once instead of racing for the same version name."""
    kb.mkdir(parents=True, exist_ok=True)
    with (kb / ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise FailedPrecondition(f"another indexer is writing {kb}") from e
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def remove_stale_staging(kb: Path) -> list[str]:
    """Removes builds left by a killed indexer (call under writer_lock)."""
    removed = []
    for p in versions_dir(kb).glob(".staging-*"):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return removed


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def write_chunks_db(path: Path, chunks: list[Chunk]) -> None:
    con = sqlite3.connect(path)
    try:
        con.executescript(_SCHEMA)
        con.executemany(
            f"INSERT INTO chunks (row, {_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    i,
                    c.chunk_id,
                    c.doc_id,
                    c.path,
                    c.title,
                    c.section,
                    c.page,
                    c.text,
                    json.dumps(c.product),
                    c.station,
                    json.dumps(c.defect_classes),
                    json.dumps(c.severities),
                )
                for i, c in enumerate(chunks)
            ],
        )
        con.commit()
    finally:
        con.close()


def row_to_chunk(row: tuple) -> Chunk:
    chunk_id, doc_id, path, title, section, page, text, product, station, classes, severities = row
    return Chunk(
        chunk_id=chunk_id,
        doc_id=doc_id,
        path=path,
        title=title,
        section=section,
        page=page,
        text=text,
        product=json.loads(product),
        station=station,
        defect_classes=json.loads(classes),
        severities=json.loads(severities),
    )


def open_chunks_db(path: Path) -> sqlite3.Connection:
    """Read-only connection shareable across threads (callers serialise access with their own lock)."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


def read_doc_chunks(con: sqlite3.Connection, doc_id: str) -> tuple[list[int], list[Chunk]]:
    rows = con.execute(f"SELECT row, {_COLUMNS} FROM chunks WHERE doc_id = ? ORDER BY row", (doc_id,)).fetchall()
    return [r[0] for r in rows], [row_to_chunk(r[1:]) for r in rows]


def read_chunks_by_rows(con: sqlite3.Connection, rows: list[int]) -> dict[int, Chunk]:
    if not rows:
        return {}
    marks = ",".join("?" * len(rows))
    found = con.execute(f"SELECT row, {_COLUMNS} FROM chunks WHERE row IN ({marks})", rows).fetchall()
    return {r[0]: row_to_chunk(r[1:]) for r in found}


def publish_version(kb: Path, manifest: dict, chunks: list[Chunk], vectors: np.ndarray, index) -> Path:
    """Writes a complete version directory, then flips CURRENT to it (call under writer_lock)."""
    import faiss

    version = manifest["index_version"]
    versions_dir(kb).mkdir(parents=True, exist_ok=True)
    staging = versions_dir(kb) / f".staging-{version}-{os.getpid()}"
    staging.mkdir()
    write_chunks_db(staging / CHUNKS_DB, chunks)
    np.save(staging / VECTORS, vectors)  # [N, D] float32, row i = chunk row i
    faiss.write_index(index, str(staging / INDEX))
    manifest = {**manifest, "files": {}}
    for name in DATA_FILES:
        _fsync_file(staging / name)
        manifest["files"][name] = sha256_file(staging / name)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    _fsync_file(staging / MANIFEST)
    final = versions_dir(kb) / version
    os.rename(staging, final)
    fsync_dir(versions_dir(kb))
    tmp = kb / f".CURRENT.{os.getpid()}"
    tmp.write_text(version + "\n")
    _fsync_file(tmp)
    os.replace(tmp, kb / "CURRENT")
    fsync_dir(kb)
    return final


def prune_versions(kb: Path, keep: int) -> list[str]:
    """Drops all but the newest `keep` versions; a server still on an older one keeps its open files (POSIX)."""
    current = current_version(kb)
    names = sorted(p.name for p in versions_dir(kb).glob("v[0-9]*"))
    doomed = [n for n in names[: max(0, len(names) - keep)] if n != current]
    for n in doomed:
        shutil.rmtree(versions_dir(kb) / n, ignore_errors=True)
    return doomed


def chunk_dict(c: Chunk) -> dict:
    return asdict(c)
