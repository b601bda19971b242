"""Reading a folder of specs (Markdown, plain text, PDF) into documents, or a skip reason per bad file.

Bad input never stops indexing: every file either becomes a `Document` or a `Skipped` with a reason a quality
engineer can act on. Large files are bounded (read up to `max_bytes`) and flagged, not rejected.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

log = logging.getLogger(__name__)

TEXT_SUFFIXES = {".md", ".markdown", ".txt"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | PDF_SUFFIXES
DEFAULT_MAX_BYTES = 2 * 1024 * 1024
# A PDF's front matter: `<name>.yaml` (or .yml) beside `<name>.pdf`, since Word and most PDF tools cannot set the
# custom document-info keys (/Product, /Station...) the PDF itself could carry. The sidecar's fields win.
SIDECAR_SUFFIXES = (".yaml", ".yml")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*\r?\n", re.DOTALL)


@dataclass(frozen=True)
class Page:
    """Text of one page (PDF) or the whole body (text files, page 0)."""

    number: int
    text: str


@dataclass(frozen=True)
class Document:
    doc_id: str
    path: str  # relative to the source folder, POSIX separators
    sha256: str  # of the whole file, so a change anywhere re-embeds
    kind: str  # markdown | text | pdf
    title: str
    pages: list[Page]
    product: list[str] = field(default_factory=list)
    station: str = ""
    defect_classes: list[str] = field(default_factory=list)
    severities: list[str] = field(default_factory=list)
    note: str = ""  # set when the file was bounded (truncated), shown in the summary


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sidecar_for(path: Path) -> Path | None:
    """The front-matter sidecar of a PDF, if there is one."""
    if path.suffix.lower() not in PDF_SUFFIXES:
        return None
    return next((c for c in (path.with_suffix(s) for s in SIDECAR_SUFFIXES) if c.is_file()), None)


def is_sidecar(path: Path) -> bool:
    return path.suffix.lower() in SIDECAR_SUFFIXES and any(path.with_suffix(s).is_file() for s in (".pdf", ".PDF"))


def source_sha256(path: Path) -> str:
    """What a document's content hash covers: the file, and its sidecar (editing it re-indexes the PDF)."""
    sha = file_sha256(path)
    sidecar = sidecar_for(path)
    if sidecar is None:
        return sha
    return hashlib.sha256(f"{sha}:{file_sha256(sidecar)}".encode()).hexdigest()


def doc_id_for(rel_path: str) -> str:
    """Stable id from the relative path: folder/name without suffix."""
    return rel_path.rsplit(".", 1)[0] if "." in Path(rel_path).name else rel_path


def scan_folder(root: Path) -> list[Path]:
    """Every regular file below root (hidden files and folders, and PDFs' sidecars, skipped), sorted."""
    files = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file() or is_sidecar(p):
            continue
        files.append(p)
    return files


def read_document(path: Path, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Document | Skipped:
    """One file -> Document, or Skipped with the reason."""
    rel = path.relative_to(root).as_posix()
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        return Skipped(rel, f"unsupported file type '{suffix or '(none)'}' (expected .md, .txt or .pdf)")
    size = path.stat().st_size
    if size == 0:
        return Skipped(rel, "empty file")
    sha = source_sha256(path)
    if suffix in PDF_SUFFIXES:
        return _read_pdf(path, rel, sha, size, max_bytes)
    return _read_text(path, rel, sha, size, max_bytes, "markdown" if suffix != ".txt" else "text")


def _read_text(path: Path, rel: str, sha: str, size: int, max_bytes: int, kind: str) -> Document | Skipped:
    with path.open("rb") as f:
        raw = f.read(max_bytes)
    if b"\x00" in raw[:8192]:
        return Skipped(rel, "binary content (NUL bytes) in a text file")
    truncated = size > max_bytes
    try:
        # A cut may split a multi-byte character at the end: drop the partial tail, not the file.
        text = raw.decode("utf-8", errors="strict" if not truncated else "ignore")
    except UnicodeDecodeError as e:
        return Skipped(rel, f"not UTF-8 text (byte {e.start}): binary or wrong encoding")
    meta, body = split_front_matter(text)
    if meta is None:
        return Skipped(rel, "front matter is not valid YAML mapping")
    if not body.strip():
        return Skipped(rel, "no text (empty or front matter only)")
    note = f"truncated: read first {max_bytes // 1024} KiB of {size // 1024} KiB" if truncated else ""
    return _document(rel, sha, kind, meta, [Page(0, body)], note, default_title=_first_heading(body))


def _read_pdf(path: Path, rel: str, sha: str, size: int, max_bytes: int) -> Document | Skipped:
    from pypdf import PdfReader

    if size > max_bytes * 8:
        return Skipped(rel, f"PDF too large ({size // 1024} KiB > {max_bytes * 8 // 1024} KiB)")
    try:
        reader = PdfReader(io.BytesIO(path.read_bytes()))
        if reader.is_encrypted:
            # Some PDFs are encrypted only against editing: an empty user password opens them.
            try:
                opened = reader.decrypt("")
            except Exception as e:  # pypdf raises several types (e.g. DependencyError for AES)
                return Skipped(rel, f"encrypted PDF, cannot decrypt: {e}")
            if not opened:
                return Skipped(rel, "encrypted PDF (password required)")
        pages = [Page(i + 1, page.extract_text() or "") for i, page in enumerate(reader.pages)]
        info = reader.metadata or {}
    except Exception as e:  # a corrupt PDF can fail anywhere in pypdf's parser, with many exception types
        return Skipped(rel, f"unreadable PDF: {type(e).__name__}: {e}")
    pages = [p for p in pages if p.text.strip()]
    if not pages:
        return Skipped(rel, "PDF has no extractable text (scanned image?)")
    meta = {
        "title": info.get("/Title"),
        "product": info.get("/Product"),
        "station": info.get("/Station"),
        "defect_classes": info.get("/DefectClasses"),
        "severities": info.get("/Severities"),
    }
    meta = {k: str(v) for k, v in meta.items() if v}
    sidecar = sidecar_for(path)
    if sidecar is not None:
        try:
            extra = yaml.safe_load(sidecar.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            return Skipped(rel, f"sidecar {sidecar.name} is not valid YAML: {' '.join(str(e).split())[:200]}")
        if extra is not None and not isinstance(extra, dict):
            return Skipped(rel, f"sidecar {sidecar.name} is not a YAML mapping (fields like product: HSG-210)")
        meta.update(extra or {})
    return _document(rel, sha, "pdf", meta, pages, "", default_title=pages[0].text.strip().splitlines()[0])


def split_front_matter(text: str) -> tuple[dict | None, str]:
    """(metadata, body); metadata is {} without front matter and None if it is not a YAML mapping."""
    text = text.lstrip("\ufeff")
    m = _FRONT_MATTER.match(text)
    if not m:
        return {}, text
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return None, text
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        return None, text
    return meta, text[m.end() :]


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v).strip() for v in value if str(v).strip()]
    return [s.strip() for s in str(value).split(",") if s.strip()]


def _first_heading(body: str) -> str:
    for line in body.splitlines():
        if line.strip():
            return line.strip().lstrip("#").strip()[:120]
    return ""


def _document(rel: str, sha: str, kind: str, meta: dict, pages: list[Page], note: str, default_title: str):
    return Document(
        doc_id=str(meta.get("doc_id") or doc_id_for(rel)),
        path=rel,
        sha256=sha,
        kind=kind,
        title=str(meta.get("title") or default_title or Path(rel).stem),
        pages=pages,
        product=_as_list(meta.get("product")),
        station=str(meta.get("station") or ""),
        defect_classes=_as_list(meta.get("defect_classes")),
        severities=_as_list(meta.get("severities")),
        note=note,
    )
