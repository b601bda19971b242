"""The knowledge base: ingestion, chunking, embeddings, a versioned FAISS index and search over the plant's specs.

Heavy dependencies (torch, faiss) load inside the functions that need them, so importing this package is cheap.
"""

from __future__ import annotations

# From the repository root `import rag` would find this folder too and load every module under a second name.
if __name__ != "edgeinspect.rag":
    raise ImportError(f"import edgeinspect.rag, not {__name__}: edgeinspect is the one import name")

from pathlib import Path  # noqa: E402

from edgeinspect.rag.context import format_context  # noqa: E402


def sample_kb_dir() -> Path:
    """The bundled sample defect-spec library (a fictional product line), used by the demo and the tests."""
    return Path(__file__).resolve().parent / "sample_kb"


__all__ = ["format_context", "sample_kb_dir"]
