"""A bank's teach frames, kept beside the bank store so "add to good set" re-teaches from exactly the same frames.

    <banks>/<part>/frames/<content hash 16>/0000.png ...   kept teach frames as the extractor sees them
    <banks>/<part>/frames/<content hash 16>/frames.json    {"frame_size": [h, w], "names": [...]}

Keyed by the bank's content hash (known before publish, independent of the version number), written whole under a
temporary name and renamed into place before the bank is published: a bank that becomes CURRENT already has its
frames. Frames are stored as the extractor sees them: squashed to its square input size (resizing an input-sized
frame to the input size is the identity), or for a tiled bank its region at the tiles' scale (tiles.py: a prepared
frame passes as it is), so a re-teach reproduces their features exactly.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from edgeinspect.durable import write_folder
from edgeinspect.models.anomaly.bank import Bank

FOLDER = "frames"
META = "frames.json"


@dataclass
class TeachFrames:
    """The frames a bank was taught from, as the extractor saw them."""

    names: list[str]
    frames: list[np.ndarray]  # each uint8 RGB as the extractor sees it (see as_seen)
    frame_size: tuple[int, int]  # (h, w) of the camera frames they were made from: new frames must match its aspect


def as_seen(extractor, frame: np.ndarray) -> np.ndarray:
    """A camera frame [H, W, 3] uint8 -> what `extractor` sees of it: its region at the tiles' scale (tiled), or
    [S, S, 3] squashed exactly as the extractors resize (features.resize_batch)."""
    prepare = getattr(extractor, "prepare", None)
    if prepare is not None:
        return prepare(frame)
    size = extractor.input_size
    return cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)


def folder_of(root: Path, bank: Bank) -> Path:
    return Path(root) / bank.part / FOLDER / bank.content_hash[:16]


def save(root: Path, bank: Bank, kept: TeachFrames) -> Path | None:
    """Writes the kept frames for `bank` (before it is published); returns the folder when this call created it."""
    final = folder_of(root, bank)
    if final.is_dir():  # the same content taught again: the frames are the same too
        return None
    files = {}
    for i, frame in enumerate(kept.frames):
        ok, png = cv2.imencode(".png", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        if not ok:
            raise OSError(f"could not encode teach frame {kept.names[i]} as PNG")
        files[f"{i:04d}.png"] = png.tobytes()
    files[META] = json.dumps({"frame_size": list(kept.frame_size), "names": list(kept.names)}, indent=2).encode()
    write_folder(final, files)
    return final


def load(root: Path, bank: Bank) -> TeachFrames | None:
    """The frames `bank` was taught from, or None where none were kept (a bank taught elsewhere, e.g. the CLI)."""
    folder = folder_of(root, bank)
    try:
        meta = json.loads((folder / META).read_text())
    except FileNotFoundError:
        return None
    frames = []
    for i in range(len(meta["names"])):
        bgr = cv2.imread(str(folder / f"{i:04d}.png"), cv2.IMREAD_COLOR)
        if bgr is None:
            return None
        frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    return TeachFrames(list(meta["names"]), frames, tuple(meta["frame_size"]))


def remove(folder: Path | None) -> None:
    """Drops frames written for a bank that was then not published."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def keep_named(frames: TeachFrames, names: Sequence[str]) -> TeachFrames:
    """The subset of `frames` named in `names` (teaching's kept frames), in that order."""
    by_name = dict(zip(frames.names, frames.frames, strict=True))
    return TeachFrames(list(names), [by_name[n] for n in names], frames.frame_size)
