"""The knowledge base: ingestion, chunking, embeddings, a versioned FAISS index and search over the plant's specs.

Heavy dependencies (torch, faiss) load inside the functions that need them, so importing this package is cheap.
"""

from __future__ import annotations

from pathlib import Path

from edgeinspect.rag.context import format_context


def sample_kb_dir() -> Path:
    """The bundled sample defect-spec library (a fictional product line), used by the demo and the tests."""
    return Path(__file__).resolve().parent / "sample_kb"


__all__ = ["format_context", "sample_kb_dir"]
