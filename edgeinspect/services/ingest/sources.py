"""Frame sources over OpenCV's FFmpeg backend (files, HTTP, RTSP, TCP/UDP), image folders and V4L2 devices."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import numpy as np

from edgeinspect.errors import InvalidInput, Unavailable

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
NETWORK_SCHEMES = ("http://", "https://", "rtsp://", "rtsps://", "tcp://", "udp://", "rtmp://")

# OpenCV reads OPENCV_FFMPEG_CAPTURE_OPTIONS from the process environment at each open, so the RTSP transport of
# one camera must not leak into another camera's concurrent open: opens are serialised on this lock.
_CAPTURE_OPTIONS_LOCK = threading.Lock()
CAPTURE_OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"


class SourceKind(StrEnum):
    file = "file"
    folder = "folder"
    network = "network"
    device = "device"


@dataclass(frozen=True)
class SourceSpec:
    """Where frames come from and how to open it."""

    kind: SourceKind
    location: str  # path, URL, or device index as text
    rtsp_transport: str = "tcp"
    realtime: bool = True  # files and folders: pace at the frame rate
    loop: bool = False
    folder_fps: float = 2.0
    open_timeout_s: float = 5.0
    read_timeout_s: float = 5.0  # the watchdog: FFmpeg aborts a read that gets no data this long


def classify(source: str) -> SourceKind:
    """The kind of a configured source string (no I/O beyond a stat)."""
    if source.startswith(NETWORK_SCHEMES):
        return SourceKind.network
    if source.startswith("usb:") or source.isdigit() or source.startswith("/dev/video"):
        return SourceKind.device
    if Path(source).is_dir():
        return SourceKind.folder
    return SourceKind.file


def resolve_asset(source: str) -> str:
    """`asset:NAME` names a file shipped in edgeinspect/assets (the embedded sample video)."""
    if source.startswith("asset:"):
        from edgeinspect.assets import asset_path

        return str(asset_path(source.removeprefix("asset:")))
    return source


@dataclass
class Frame:
    image: np.ndarray  # [H, W, 3] uint8 BGR
    index: int  # frames read from this source since the reader started (across reopens)
    wall_time: float  # time.time() when the frame was read: the capture time
    pts_s: float | None  # position in the stream (files), None for live sources


class FrameSource(Protocol):
    def read(self) -> np.ndarray | None:
        """The next frame ([H, W, 3] uint8 BGR), or None at end of stream or when the stream failed."""

    def position_s(self) -> float | None:
        """The stream position of the last frame read, for files."""

    def close(self) -> None: ...


class CaptureSource:
    """cv2.VideoCapture with open/read deadlines; files are paced to their frame rate when `realtime`."""

    def __init__(self, spec: SourceSpec) -> None:
        import cv2

        self._cv2 = cv2
        self._spec = spec
        self._cap = _open_capture(spec)
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        self._period = 1.0 / fps if spec.kind is SourceKind.file and spec.realtime and 0 < fps < 1000 else 0.0
        self._next_due = time.monotonic()

    def read(self) -> np.ndarray | None:
        if self._period:
            delay = self._next_due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._next_due = max(self._next_due + self._period, time.monotonic() - self._period)
        ok, image = self._cap.read()
        return image if ok and image is not None and image.size else None

    def position_s(self) -> float | None:
        if self._spec.kind is not SourceKind.file:
            return None
        return self._cap.get(self._cv2.CAP_PROP_POS_MSEC) / 1000.0

    def close(self) -> None:
        self._cap.release()


def _open_capture(spec: SourceSpec):  # -> cv2.VideoCapture
    import cv2

    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(spec.open_timeout_s * 1000),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(spec.read_timeout_s * 1000),
    ]  # fmt: skip
    if spec.kind is SourceKind.device:
        index = int(spec.location.removeprefix("usb:").removeprefix("/dev/video"))
        cap = cv2.VideoCapture(index, cv2.CAP_V4L2)
    elif spec.kind is SourceKind.file and not Path(spec.location).is_file():
        raise InvalidInput(f"video file {spec.location} does not exist")
    else:
        with _CAPTURE_OPTIONS_LOCK:
            previous = os.environ.get(CAPTURE_OPTIONS_ENV)
            if spec.location.startswith(("rtsp://", "rtsps://")):
                os.environ[CAPTURE_OPTIONS_ENV] = f"rtsp_transport;{spec.rtsp_transport}"
            else:
                os.environ.pop(CAPTURE_OPTIONS_ENV, None)
            try:
                cap = cv2.VideoCapture(spec.location, cv2.CAP_FFMPEG, params)
            finally:
                if previous is None:
                    os.environ.pop(CAPTURE_OPTIONS_ENV, None)
                else:
                    os.environ[CAPTURE_OPTIONS_ENV] = previous
    if not cap.isOpened():
        cap.release()
        if spec.kind is SourceKind.file:
            raise InvalidInput(f"{spec.location} is not a video OpenCV/FFmpeg can decode")
        raise Unavailable(f"could not open {spec.location} within {spec.open_timeout_s:.1f}s")
    return cap


class FolderSource:
    """Images of a folder in name order, at `folder_fps` when realtime; unreadable files are skipped and logged."""

    def __init__(self, spec: SourceSpec) -> None:
        import cv2

        self._cv2 = cv2
        self._spec = spec
        self._paths = sorted(p for p in Path(spec.location).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self._paths:
            raise InvalidInput(f"folder {spec.location} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        self._i = 0
        self._period = 1.0 / spec.folder_fps if spec.realtime else 0.0
        self._next_due = time.monotonic()

    def read(self) -> np.ndarray | None:
        while self._i < len(self._paths):
            path = self._paths[self._i]
            self._i += 1
            image = self._cv2.imread(str(path), self._cv2.IMREAD_COLOR)
            if image is None:
                logger.warning("skipping %s: not an image OpenCV can decode", path)
                continue
            if self._period:
                delay = self._next_due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._next_due = max(self._next_due + self._period, time.monotonic() - self._period)
            return image
        return None

    def position_s(self) -> float | None:
        return (self._i - 1) / self._spec.folder_fps

    def close(self) -> None:
        self._paths = []


def open_source(spec: SourceSpec) -> FrameSource:
    """Opens a source; raises InvalidInput (will never work as configured) or Unavailable (may work later)."""
    if spec.kind is SourceKind.folder:
        return FolderSource(spec)
    return CaptureSource(spec)
