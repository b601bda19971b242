"""Frames kept beside their reports: content-addressed files (sha256 of the bytes as received) plus a JPEG thumbnail.

The files live in a folder; which frames exist, their sizes and when they were last stored live in the report
database (ReportStore owns the rows), so a report and its frame reference commit together. Retention is a pure
function over those rows: frames beyond the age limit, then the oldest until the rest fits the byte budget.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from edgeinspect.durable import fsync_dir

log = logging.getLogger(__name__)

# Magic bytes -> media type of the formats the vision node accepts.
_MAGIC = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"BM", "image/bmp"),
    (b"GIF8", "image/gif"),
)


@dataclass(frozen=True)
class FrameRow:
    sha256: str
    nbytes: int  # frame + thumbnail on disk
    stored_us: int  # the last time a report stored this frame (a re-sent frame counts as new)


@dataclass(frozen=True)
class StoredFrame:
    sha256: str
    nbytes: int
    media_type: str
    width: int
    height: int


def media_type(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in _MAGIC if data.startswith(magic)), "application/octet-stream")


def to_prune(oldest: list[FrameRow], total_bytes: int, now_us: int, max_bytes: int, max_age_us: int) -> list[str]:
    """Frames to delete from the oldest ones (oldest first) given the store's total: every one older than
    max_age_us (0: no age limit), then the oldest until the rest fit max_bytes."""
    doomed: list[str] = []
    for row in oldest:
        too_old = max_age_us and now_us - row.stored_us > max_age_us
        if not too_old and total_bytes <= max_bytes:
            break
        doomed.append(row.sha256)
        total_bytes -= row.nbytes
    return doomed


class FrameFiles:
    """The folder half of the frame store: write once by content hash, read, delete."""

    def __init__(self, root: Path, thumbnail_px: int = 256) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.thumbnail_px = thumbnail_px

    def _path(self, sha: str, thumbnail: bool = False) -> Path:
        if len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
            raise ValueError("frame key must be a sha256 hex digest")
        return self.root / sha[:2] / (f"{sha}.thumb.jpg" if thumbnail else sha)

    def write(self, data: bytes) -> StoredFrame:
        """Stores the frame and its thumbnail (if absent) and returns what was stored."""
        sha = hashlib.sha256(data).hexdigest()
        path = self._path(sha)
        width = height = 0
        thumb = b""
        try:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
                img.draft("RGB", (self.thumbnail_px, self.thumbnail_px))  # JPEG: decode at reduced scale
                small = img.convert("RGB")
                small.thumbnail((self.thumbnail_px, self.thumbnail_px))
                buf = io.BytesIO()
                small.save(buf, "JPEG", quality=80)
                thumb = buf.getvalue()
        except Exception as exc:  # the vision node accepted it; a frame we cannot thumbnail is still kept
            log.warning("no thumbnail for frame %s: %s", sha[:12], exc)
        _write_atomic(path, data)
        if thumb:
            _write_atomic(self._path(sha, thumbnail=True), thumb)
        return StoredFrame(sha, len(data) + len(thumb), media_type(data), width, height)

    def read(self, sha: str, thumbnail: bool = False) -> bytes | None:
        try:
            return self._path(sha, thumbnail).read_bytes()
        except FileNotFoundError:
            return None

    def _heatmap_path(self, sha: str, bank_id: str) -> Path:
        # One frame may be scored against several bank versions: its heatmap is a function of both.
        bank_key = hashlib.sha256(bank_id.encode()).hexdigest()[:16]
        return self._path(sha).with_name(f"{sha}.heat.{bank_key}.png")

    def write_heatmap(self, sha: str, bank_id: str, png: bytes) -> int:
        """Stores the anomaly gate's heatmap of frame `sha` against bank `bank_id` beside the frame; its bytes."""
        _write_atomic(self._heatmap_path(sha, bank_id), png)
        return len(png)

    def read_heatmap(self, sha: str, bank_id: str) -> bytes | None:
        try:
            return self._heatmap_path(sha, bank_id).read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, sha: str) -> None:
        for thumbnail in (False, True):
            self._path(sha, thumbnail).unlink(missing_ok=True)
        for heatmap in self._path(sha).parent.glob(f"{sha}.heat.*.png"):  # retention takes them with the frame
            heatmap.unlink(missing_ok=True)


def _write_atomic(path: Path, data: bytes) -> None:
    """Readers never see half a frame: write beside, fsync, rename."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique per writer: concurrent inspections of the same frame (same sha256) write it from several threads.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)  # the rename itself must survive a power cut before the report row points at it
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not keep the half-written copy that filled it
        raise
