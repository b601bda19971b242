"""Turning retrieved spec chunks into prompt context for the gateway (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _get(chunk: Any, name: str, default: Any = "") -> Any:
    # Accepts our Hit/Chunk objects, SpecChunk protobufs and plain dicts alike.
    if isinstance(chunk, dict):
        return chunk.get(name, default)
    if hasattr(chunk, "chunk") and not hasattr(chunk, name):
        return _get(chunk.chunk, name, default) if name != "score" else getattr(chunk, "score", default)
    return getattr(chunk, name, default)


def format_context(chunks: Iterable[Any], max_chars: int) -> str:
    """Numbered spec excerpts, best first, cut to at most max_chars; each names its document and section.

    A chunk that does not fit whole is shortened (at a word boundary) if at least 120 characters of it fit,
    otherwise left out, so the prompt never ends in a bare header.
    """
    parts: list[str] = []
    used = 0
    for n, chunk in enumerate(chunks, start=1):
        title = _get(chunk, "title") or _get(chunk, "doc_id")
        section = _get(chunk, "section")
        page = _get(chunk, "page", 0)
        where = " / ".join(s for s in (str(title), str(section)) if s)
        if page:
            where += f" (p. {page})"
        header = f"[{n}] {_get(chunk, 'doc_id')}: {where}\n"
        body = " ".join(str(_get(chunk, "text")).split())
        sep = 2 if parts else 0
        room = max_chars - used - sep - len(header)
        if room < min(120, len(body)):
            break
        if len(body) > room:
            cut = body.rfind(" ", 0, room - 1)
            body = body[: cut if cut > 0 else room - 1] + "…"
        parts.append(header + body)
        used += sep + len(header) + len(body)
    return "\n\n".join(parts)
