"""Splitting a document into bounded, overlapping chunks along its headings (pure functions)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgeinspect.rag.documents import Document

# Bumped whenever chunking changes, so an incremental index re-chunks every document.
CHUNKER_VERSION = 1

_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
# Plain text / PDF headings: "3.2 Burrs", "4 ACCEPTANCE LIMITS", "SECTION 2 - ...". Short lines only.
_NUMBERED_HEADING = re.compile(r"^(\d+(\.\d+){0,3}\.?|[A-Z]\.)\s+[A-Z][^\n]{1,70}$")
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


@dataclass(frozen=True)
class ChunkConfig:
    max_chars: int = 900
    overlap_chars: int = 150
    min_chars: int = 40  # a fragment shorter than this is merged into its neighbour
    max_chunks_per_doc: int = 400


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    path: str
    title: str
    section: str
    page: int
    text: str
    product: list[str]
    station: str
    defect_classes: list[str]
    severities: list[str]

    def embedding_text(self) -> str:
        """What gets embedded: document title and section give a bare paragraph its context."""
        return f"{self.title} | {self.section}\n{self.text}" if self.section else f"{self.title}\n{self.text}"


def sections(text: str, markdown: bool) -> list[tuple[str, str]]:
    """[(heading path, body)]; text before the first heading gets heading ''."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    current: list[str] = []
    heading = ""
    for line in text.splitlines():
        level, title = _heading(line, markdown)
        if level:
            out.append((heading, "\n".join(current)))
            current = []
            # Keep the parent heading so "3.2 Burrs" reads "Acceptance limits > Burrs" when embedded.
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            heading = " > ".join(t for _, t in stack[-2:])
        else:
            current.append(line)
    out.append((heading, "\n".join(current)))
    return [(h, b.strip()) for h, b in out if b.strip()]


def _heading(line: str, markdown: bool) -> tuple[int, str]:
    s = line.strip()
    if markdown:
        m = _MD_HEADING.match(s)
        return (len(m.group(1)), m.group(2).strip()) if m else (0, "")
    if len(s) <= 80 and _NUMBERED_HEADING.match(s) and not s.endswith((".", ",", ";")):
        return (s.split()[0].rstrip(".").count(".") + 1, s)
    return 0, ""


def split_bounded(text: str, max_chars: int, overlap: int) -> list[str]:
    """Pieces of at most max_chars, cut at paragraph, then sentence, then word boundaries, with overlap."""
    if len(text) <= max_chars:
        return [text]
    units = _units(text, max_chars)
    pieces: list[str] = []
    cur = ""
    for u in units:
        if cur and len(cur) + 1 + len(u) > max_chars:
            pieces.append(cur)
            tail = _tail(cur, overlap)
            cur = f"{tail} {u}" if tail and len(tail) + 1 + len(u) <= max_chars else u
        else:
            cur = f"{cur}\n{u}" if cur else u
    if cur:
        pieces.append(cur)
    return pieces


def _units(text: str, max_chars: int) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        if len(para) <= max_chars:
            out.append(para)
            continue
        for sent in _SENTENCE_END.split(para):
            while len(sent) > max_chars:  # a run-on "sentence" (tables, logs): cut at a space
                cut = sent.rfind(" ", 0, max_chars)
                cut = cut if cut > max_chars // 2 else max_chars
                out.append(sent[:cut])
                sent = sent[cut:].lstrip()
            if sent:
                out.append(sent)
    return out


def _tail(text: str, overlap: int) -> str:
    if overlap <= 0:
        return ""
    tail = text[-overlap:]
    space = tail.find(" ")
    return tail[space + 1 :] if 0 <= space < len(tail) - 1 else tail


def chunk_document(doc: Document, cfg: ChunkConfig) -> tuple[list[Chunk], bool]:
    """(chunks, truncated): at most cfg.max_chunks_per_doc chunks per document."""
    chunks: list[Chunk] = []
    markdown = doc.kind == "markdown"
    for page in doc.pages:
        for heading, body in sections(page.text, markdown):
            for piece in split_bounded(body, cfg.max_chars, cfg.overlap_chars):
                if len(piece) < cfg.min_chars and chunks and chunks[-1].section == heading:
                    continue  # a stray fragment after an overlap cut adds nothing retrievable
                chunks.append(
                    Chunk(
                        chunk_id=f"{doc.doc_id}#{len(chunks)}",
                        doc_id=doc.doc_id,
                        path=doc.path,
                        title=doc.title,
                        section=heading,
                        page=page.number,
                        text=piece,
                        product=doc.product,
                        station=doc.station,
                        defect_classes=doc.defect_classes,
                        severities=doc.severities,
                    )
                )
                if len(chunks) >= cfg.max_chunks_per_doc:
                    return chunks, True
    return chunks, False
