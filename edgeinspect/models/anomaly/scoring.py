"""Frames -> anomaly score, heatmap and regions against a taught bank (PatchCore: k=1 nearest good patch)."""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import cv2
import faiss
import numpy as np

from edgeinspect.errors import FailedPrecondition, InvalidInput
from edgeinspect.models.anomaly.bank import Bank
from edgeinspect.models.anomaly.features import FeatureExtractor
from edgeinspect.models.anomaly.whiten import apply_whitening

# The gate's verdicts in the report's own words (inspection.proto Verdict; vision.proto AnomalyVerdict): one vocabulary.
OK, DEFECT, UNCERTAIN = "OK", "DEFECT", "UNCERTAIN"
# PatchCore's smoothing, sigma 4 px at the extractor's input size (224 px: half a stride-8 patch), applied there
# and not at the frame's size so the same bank smooths the same way whatever the camera resolution.
BLUR_SIGMA = 4.0
MAX_REGIONS = 8
# The heatmap PNG carries the raw scores beside the picture, in a private ancillary PNG chunk (viewers skip it):
# ">II" grid height and width, then zlib(float16 little-endian scores [h, w]) at the pixel-AUROC grid
# (evaluate.pixel_grid). A picture's colours cannot be read back into scores; these are the scores themselves.
SCORES_CHUNK = b"eiSc"


class BankMismatch(FailedPrecondition):
    """A bank taught with other features than this extractor computes: its distances would mean nothing."""

    code = "anomaly_bank_mismatch"


@dataclass
class Region:
    """A connected area of the heatmap above the threshold, in fractions of the frame (0..1)."""

    x0: float
    y0: float
    x1: float
    y1: float
    peak: float  # highest heatmap value inside
    area: float  # fraction of the frame's pixels


@dataclass
class AnomalyResult:
    """One frame's gate outcome."""

    score: float  # max patch distance to the bank
    threshold: float
    verdict: str  # OK | DEFECT | UNCERTAIN
    heatmap: np.ndarray  # [H, W] float32 at the frame's size, same units as score
    regions: list[Region]  # hottest first
    bank_id: str
    fingerprint: str
    timings: dict = field(default_factory=dict)  # ms: features, knn, post


def verdict_of(score: float, band: tuple[float, float]) -> str:
    """Below the band (the OK cut) OK, above it DEFECT, inside it UNCERTAIN."""
    low, high = band
    return OK if score < low else DEFECT if score > high else UNCERTAIN


class Scorer:
    """Scores frames against one bank with the extractor it was taught with; the FAISS index is built once."""

    def __init__(self, bank: Bank, extractor: FeatureExtractor):
        if bank.fingerprint != extractor.fingerprint:
            raise BankMismatch(
                f"bank {bank.bank_id} was taught with {bank.extractor.get('name')} features (fingerprint "
                f"{bank.fingerprint}), but this extractor is {extractor.name} (fingerprint {extractor.fingerprint}): "
                "re-teach the part with this extractor, or score with the extractor the bank names"
            )
        self.bank, self.extractor = bank, extractor
        features = np.ascontiguousarray(bank.features, dtype=np.float32)  # [K, C]
        self.index = faiss.IndexFlatL2(features.shape[1])
        self.index.add(features)

    def score(self, frames: Sequence[np.ndarray]) -> list[AnomalyResult]:
        """RGB uint8 frames [H, W, 3] of any size -> one result per frame."""
        start = time.perf_counter()
        grid = self.extractor.extract(frames)  # [N, h, w, C]
        per_frame_ms = 1000 * (time.perf_counter() - start) / len(frames)
        results = self.score_features(grid, [f.shape[:2] for f in frames])
        for r in results:
            r.timings["features_ms"] = per_frame_ms
        return results

    def score_features(self, grid: np.ndarray, frame_sizes: Sequence[tuple[int, int]]) -> list[AnomalyResult]:
        """Features computed elsewhere (the vision node's hidden states): grid [N, h, w, C], frame (H, W) each."""
        n, h, w, c = grid.shape
        if (h, w) != tuple(self.bank.grid) or c != self.bank.features.shape[1]:
            raise InvalidInput(f"feature grid {h}x{w}x{c} does not match bank {self.bank.bank_id} "
                               f"({self.bank.grid[0]}x{self.bank.grid[1]}x{self.bank.features.shape[1]})")  # fmt: skip
        if len(frame_sizes) != n:
            raise InvalidInput(f"{n} feature grids but {len(frame_sizes)} frame sizes")
        start = time.perf_counter()
        grid = apply_whitening(grid, self.bank.whitening)  # the bank's features are stored whitened
        squared, _ = self.index.search(np.ascontiguousarray(grid.reshape(-1, c), dtype=np.float32), 1)  # [N*h*w, 1]
        patch = np.sqrt(np.maximum(squared, 0)).reshape(n, h, w)  # [N, h, w] distance to the nearest good patch
        knn_ms = 1000 * (time.perf_counter() - start) / n
        return [self._result(patch[i], frame_sizes[i], knn_ms) for i in range(n)]

    def _result(self, patch: np.ndarray, frame_size: tuple[int, int], knn_ms: float) -> AnomalyResult:
        start = time.perf_counter()
        score = image_score(patch, self.bank.border, self.bank.blur)
        patch = inspected(patch, self.bank.border)
        verdict = verdict_of(score, self.bank.band)
        heatmap = heatmap_of(self.extractor, patch, frame_size)  # [H, W]
        regions: list[Region] = []
        if verdict != OK:
            # Blurring shaves a lone hot patch below the threshold; a flagged frame still names its hottest spot.
            regions = find_regions(heatmap, min(self.bank.threshold, 0.9 * float(heatmap.max())))
        post_ms = 1000 * (time.perf_counter() - start)
        return AnomalyResult(score, self.bank.threshold, verdict, heatmap, regions, self.bank.bank_id,
                             self.bank.fingerprint, {"knn_ms": knn_ms, "post_ms": post_ms})  # fmt: skip


def inspected(patch: np.ndarray, border: int) -> np.ndarray:
    """Patch scores [h, w] with the outer `border` rings zeroed: the area the gate inspects (its ROI)."""
    if border <= 0:
        return patch
    out = np.zeros_like(patch)
    out[border:-border, border:-border] = patch[border:-border, border:-border]
    return out


def image_score(patch: np.ndarray, border: int, blur: float) -> float:
    """The image score: the max of the patch scores [h, w] inside the border, Gaussian-smoothed at `blur` patches
    first (over the inspected area alone: the border's left-out rings do not dilute its edge).

    On irregular surfaces (loose stones, vegetation) a good frame's highest patch is a lone one the bank happens not
    to cover; a defect lights several neighbours. Smoothing at 1 patch lifted image AUROC on bench/anomaly_photos.py
    (see features.EfficientNetLite0Extractor.blur); the heatmap keeps the raw scores."""
    if blur <= 0:
        return float(inspected(patch, border).max())
    inside = patch[border : patch.shape[0] - border, border : patch.shape[1] - border].astype(np.float32)
    return float(cv2.GaussianBlur(inside, (0, 0), blur).max())


def heatmap_of(extractor: FeatureExtractor, patch: np.ndarray, frame_size: tuple[int, int]) -> np.ndarray:
    """Patch scores [h, w] -> a smoothed heatmap [H, W] float32 at the frame's size: over the whole frame where it
    was squashed to the input, over the region where it was tiled (tiles.TiledExtractor.heatmap)."""
    place = getattr(extractor, "heatmap", None)
    if place is not None:
        return place(patch, frame_size, BLUR_SIGMA)
    return smooth_to(patch, (extractor.input_size, extractor.input_size), BLUR_SIGMA, frame_size)


def smooth_to(patch: np.ndarray, input_size: tuple[int, int], sigma: float, out_size: tuple[int, int]) -> np.ndarray:
    """Patch scores [h, w] -> up to the input's (H', W') px, Gaussian-smoothed at `sigma` input px (kernel 33 px
    at sigma 4, as PatchCore), -> [H, W] float32 at out_size."""
    at_input = cv2.resize(patch.astype(np.float32), (input_size[1], input_size[0]), interpolation=cv2.INTER_LINEAR)
    at_input = cv2.GaussianBlur(at_input, (0, 0), sigma)
    height, width = out_size
    return cv2.resize(at_input, (int(width), int(height)), interpolation=cv2.INTER_LINEAR)


def find_regions(heatmap: np.ndarray, level: float) -> list[Region]:
    """Connected components of heatmap > level as boxes in frame fractions, highest peak first."""
    height, width = heatmap.shape
    count, labels, stats, _ = cv2.connectedComponentsWithStats((heatmap > level).astype(np.uint8), connectivity=8)
    regions = []
    for i in range(1, count):  # 0 is the background
        x, y, w, h, pixels = (int(v) for v in stats[i])
        peak = float(heatmap[y : y + h, x : x + w][labels[y : y + h, x : x + w] == i].max())
        regions.append(
            Region(x / width, y / height, (x + w) / width, (y + h) / height, peak, pixels / (width * height))
        )
    regions.sort(key=lambda r: (-r.peak, -r.area))
    return regions[:MAX_REGIONS]


def heatmap_png(frame_rgb: np.ndarray, heatmap: np.ndarray, threshold: float) -> bytes:
    """The frame with the heatmap over it (blue cool, red hot; the threshold sits mid-scale) and region boxes; the
    raw scores ride along in SCORES_CHUNK (heatmap_scores reads them) so that pixel AUROC needs no second file."""
    height, width = frame_rgb.shape[:2]
    if heatmap.shape != (height, width):
        heatmap = cv2.resize(heatmap, (width, height), interpolation=cv2.INTER_LINEAR)
    scale = np.clip(heatmap / (2.0 * threshold), 0.0, 1.0) if threshold > 0 else np.zeros_like(heatmap)  # [H, W]
    colours = cv2.applyColorMap((255 * scale).astype(np.uint8), cv2.COLORMAP_JET)  # [H, W, 3] BGR
    # Cool areas stay close to the photo so a person still sees the part; hot areas take the colour.
    alpha = (0.25 + 0.5 * scale)[..., None]
    frame_bgr = cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2BGR).astype(np.float32)
    picture = (frame_bgr * (1 - alpha) + colours.astype(np.float32) * alpha).astype(np.uint8)
    line = max(1, round(min(height, width) / 200))
    for r in find_regions(heatmap, threshold):
        p0 = (int(r.x0 * width), int(r.y0 * height))
        p1 = (min(width - 1, int(r.x1 * width)), min(height - 1, int(r.y1 * height)))
        cv2.rectangle(picture, p0, p1, (0, 0, 0), line + 2)  # dark outline: the box reads on any colour
        cv2.rectangle(picture, p0, p1, (255, 255, 255), line)
    ok, png = cv2.imencode(".png", picture)
    if not ok:
        raise InvalidInput(f"could not encode a {width}x{height} heatmap picture as PNG")
    return _with_scores(png.tobytes(), pixel_grid(heatmap))


def pixel_grid(heatmap: np.ndarray) -> np.ndarray:
    """A frame-sized heatmap [H, W] at the grid pixel AUROC ranks ([h, w], at most PIXEL_GRID on the long side)."""
    from edgeinspect.models.anomaly.evaluate import grid_size

    size = grid_size(heatmap.shape)
    heatmap = heatmap.astype(np.float32)
    return heatmap if size is None else cv2.resize(heatmap, size, interpolation=cv2.INTER_AREA)


def heatmap_scores(png: bytes) -> np.ndarray | None:
    """The raw scores [h, w] float32 a heatmap PNG carries (see SCORES_CHUNK), or None where it carries none."""
    pos = 8  # after the PNG signature
    while pos + 8 <= len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == SCORES_CHUNK:
            h, w = struct.unpack(">II", data[:8])
            values = np.frombuffer(zlib.decompress(data[8:]), dtype="<f2")
            if values.size != h * w:
                raise InvalidInput(f"heatmap scores hold {values.size} values for a {h}x{w} grid: corrupted")
            return values.reshape(h, w).astype(np.float32)
        pos += 12 + length  # length, type, data, crc
    return None


def _with_scores(png: bytes, scores: np.ndarray) -> bytes:
    """`png` with SCORES_CHUNK inserted before its closing IEND chunk (the last 12 bytes)."""
    finite = np.clip(scores, 0.0, float(np.finfo(np.float16).max))  # distances: never negative, never past fp16
    h, w = finite.shape
    data = struct.pack(">II", h, w) + zlib.compress(finite.astype("<f2").tobytes(), 6)
    chunk = struct.pack(">I", len(data)) + SCORES_CHUNK + data
    chunk += struct.pack(">I", zlib.crc32(SCORES_CHUNK + data) & 0xFFFFFFFF)
    return png[:-12] + chunk + png[-12:]
