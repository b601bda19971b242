"""What the VLM is shown of a part the anomaly gate flagged, beside the frame: the flagged region cut from the
full-resolution frame (with a margin), and a good frame of the same part for reference.

The crop comes from the bytes the request carried: the vision processor squashes a whole camera frame to 384 px, where
a defect the gate saw may be a few pixels; squashed from the crop, it fills the image. The reference comes from the
gateway's own store: the vision node keeps its teach frames, but Score names none of them and no RPC serves them, so
the reference is the nearest (small grayscale thumbnails, L2) of the part's newest kept frames that were good: passed
by the gate under the same bank version, and not overruled by a person's review.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import cv2
import numpy as np

from edgeinspect.services.gateway.reports.reader import ReportReader
from edgeinspect.v1 import inspection_pb2, vision_pb2

# The words that tell the model which image is which, by role; numbered in the prompt's order.
CAPTIONS = {
    "frame": "the whole part.",
    "crop": "the flagged region, enlarged.",
    "reference": "a good part for reference.",
}
MARGIN = 0.5  # each side of the flagged box gains half its size: the defect with its surroundings
MIN_SIDE = 0.125  # of the frame's shorter side: a region of a few pixels is still shown with some context
CANDIDATES = 8  # good reports of the part read for the reference, newest first
THUMB = 32  # thumbnail side for the nearest-frame distance
JPEG_QUALITY = 95
DECODE = cv2.IMREAD_IGNORE_ORIENTATION  # as the vision node reads frames (PIL, EXIF orientation not applied)


class Region(Protocol):
    """A flagged region as fractions of the frame (vision_pb2.AnomalyRegion, inspection_pb2.BoundingBox)."""

    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Evidence:
    """The images shown after the frame (encoded files, in order) and the prompt's record of every image."""

    images: list[bytes]
    shown: list[inspection_pb2.PromptImage]

    @property
    def captions(self) -> tuple[str, ...]:
        return tuple(f"Image {i}: {CAPTIONS[p.role]}" for i, p in enumerate(self.shown, 1))


def crop_box(regions: Sequence[Region], width: int, height: int, margin: float = MARGIN) -> tuple[int, ...] | None:
    """(x0, y0, x1, y1) in pixels: the regions' union padded by `margin` of its size per side, made square (the vision
    processor squashes every image to a square), at least MIN_SIDE of the shorter side, moved inside the frame; None
    without a region (the whole frame was unusual: the frame itself is the evidence)."""
    if not regions:
        return None
    fx0, fy0 = min(r.x for r in regions), min(r.y for r in regions)
    fx1, fy1 = max(r.x + r.width for r in regions), max(r.y + r.height for r in regions)
    short = min(width, height)
    side = max((fx1 - fx0) * width, (fy1 - fy0) * height) * (1 + 2 * margin)
    side = max(1, round(min(max(side, MIN_SIDE * short), short)))
    x0 = min(max(round((fx0 + fx1) / 2 * width - side / 2), 0), width - side)
    y0 = min(max(round((fy0 + fy1) / 2 * height - side / 2), 0), height - side)
    return x0, y0, x0 + side, y0 + side


def decode(image: bytes, flags: int = cv2.IMREAD_COLOR) -> np.ndarray | None:
    """[H, W, 3] uint8 BGR (or [H, W] with IMREAD_GRAYSCALE); None for a file this OpenCV build does not read and
    Pillow on the vision node did (the edge lets six formats in): that frame is explained without the crop."""
    return cv2.imdecode(np.frombuffer(image, np.uint8), flags | DECODE)


def crop(image: bytes, regions: Sequence[Region]) -> tuple[bytes, inspection_pb2.BoundingBox] | None:
    """The flagged region cut from the full-resolution frame as JPEG, and the cut as fractions of the frame."""
    frame = decode(image)  # [H, W, 3]
    if frame is None:
        return None
    box = crop_box(regions, frame.shape[1], frame.shape[0])
    if box is None:
        return None
    height, width = frame.shape[:2]
    x0, y0, x1, y1 = box
    ok, jpeg = cv2.imencode(".jpg", frame[y0:y1, x0:x1], [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise ValueError("OpenCV could not encode the crop as JPEG")
    cut = inspection_pb2.BoundingBox(x=x0 / width, y=y0 / height, width=(x1 - x0) / width, height=(y1 - y0) / height)
    return jpeg.tobytes(), cut


def thumbnail(image: bytes) -> np.ndarray | None:
    """[THUMB, THUMB] float32 grayscale: what the nearest-frame distance compares."""
    gray = decode(image, cv2.IMREAD_GRAYSCALE)
    return None if gray is None else cv2.resize(gray, (THUMB, THUMB), interpolation=cv2.INTER_AREA).astype(np.float32)


def nearest(image: bytes, candidates: Sequence[bytes]) -> int:
    """The index of the candidate frame nearest the flagged one (L2 over grayscale thumbnails)."""
    mine = thumbnail(image)
    if mine is None:
        return 0  # the newest
    thumbs = [thumbnail(c) for c in candidates]
    return int(np.argmin([np.inf if t is None else np.square(t - mine).sum() for t in thumbs]))


def is_good(report: inspection_pb2.DefectReport, bank_id: str) -> bool:
    """Passed by the gate under this bank version, and not overruled by a person (reports come with their review)."""
    passed = report.anomaly.decided_by == inspection_pb2.DECIDED_BY_GATE and report.anomaly.bank_id == bank_id
    overruled = report.review.verdict not in (inspection_pb2.VERDICT_UNSPECIFIED, inspection_pb2.VERDICT_OK)
    return passed and report.verdict == inspection_pb2.VERDICT_OK and not overruled


def reference(reader: ReportReader, image: bytes, part: str, bank_id: str) -> tuple[bytes, str] | None:
    """A good frame of the part (bytes, its report id), the nearest of the newest CANDIDATES kept; None: none kept."""
    reports, _ = reader.list(part=part, verdict=inspection_pb2.VERDICT_OK, page_size=4 * CANDIDATES)
    frames: list[tuple[bytes, str]] = []
    for report in (r for r in reports if is_good(r, bank_id)):
        answer = reader.image(report.report_id)
        if answer.state == inspection_pb2.IMAGE_STATE_STORED:
            frames.append((answer.data, report.report_id))
            if len(frames) == CANDIDATES:
                break
    if not frames:
        return None
    return frames[nearest(image, [data for data, _ in frames])]


def collect(image: bytes, score: vision_pb2.AnomalyScore, part: str, reader: ReportReader | None) -> Evidence:
    """The crop (where the gate named a region) and the reference (where a good frame is kept), in that order."""
    images: list[bytes] = []
    shown = [inspection_pb2.PromptImage(role="frame")]
    cut = crop(image, score.regions)
    if cut is not None:
        images.append(cut[0])
        shown.append(inspection_pb2.PromptImage(role="crop", box=cut[1]))
    good = reference(reader, image, part, score.bank_id) if reader is not None else None
    if good is not None:
        images.append(good[0])
        shown.append(inspection_pb2.PromptImage(role="reference", report_id=good[1]))
    return Evidence(images, shown)
