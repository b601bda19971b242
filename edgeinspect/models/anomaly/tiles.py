"""Camera frames at their own resolution: a region of interest cut into overlapping tiles of the extractor's input
size, features stitched back into one patch grid over the region, heatmaps placed back in camera pixels.

Squashing a 5 MP frame (2448 x 2048) to a 448 px square shrinks it 5.5x: a 10 px defect becomes two pixels, a
quarter of one stride-8 patch, and vanishes. Tiling keeps the aspect and a chosen scale (camera px per input px,
1 = native) and pays for it in forwards: one per tile. The region of interest (where the part sits in the camera's
frame) is cut first, so the gate spends its tiles on the part, not on the conveyor around it.

Geometry, in input pixels (camera px / scale) and patches (stride px of the extractor, 8 for every CNN here):

    region (w x h camera px) --resize 1/scale--> W' x H' (multiples of the stride, each >= the tile side S)
    tiles: S x S windows, first at 0, last flush with the far edge, evenly spaced, overlapping >= 2 x border patches
    stitched grid [H'/stride, W'/stride, C]: each patch taken from the tile where it sits farthest from an edge

A CNN's patches near a tile's edge see its zero padding (features.FeatureExtractor.border); with the overlap, every
patch of the stitched grid comes from a tile interior, except at the region's own outer edge, which the bank's
border leaves out as before. The stitched grid is what teach, the coreset and the kNN see: a tiled bank is a bank.

A tiled extractor is an ordinary extractor to the rest of the gate: its describe() is the base extractor's with a
"tiles" option (region, scale, camera size) that open_extractor reads back, and its fingerprint covers both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from edgeinspect.errors import InvalidInput
from edgeinspect.models.anomaly.features import FeatureExtractor, fingerprint_of

# A frame up to this many times the extractor's input side is squashed whole, as before tiling existed (the same
# features, the same fingerprints: banks taught on small frames are untouched). Past it, `teach` tiles.
SQUASH_UP_TO = 1.5
# Tiles per frame when teach picks the scale itself. Each tile is one forward at the input size (448 px: ~0.1 s on
# a quiet 2-core Zen 4, ~0.3 s on a loaded Xeon); 4 tiles keep a 5 MP frame near the 1 s takt budget at 2.8x
# (against 5.5x squashed). bench/anomaly_tiles.py measures the curve: AUROC and ms per frame against tiles.
DEFAULT_MAX_TILES = 4
# The overlap between neighbouring tiles, in patches, beyond twice the base's border (never less than one patch).
MIN_OVERLAP = 1


def check_roi(roi: Sequence[int], camera: tuple[int, int]) -> tuple[int, int, int, int]:
    """(x, y, width, height) in camera pixels, inside a camera frame of (height, width)."""
    if len(roi) != 4:
        raise InvalidInput(f"a region of interest is x,y,width,height in camera pixels (got {list(roi)})")
    x, y, w, h = (int(v) for v in roi)
    height, width = camera
    if x < 0 or y < 0 or w < 1 or h < 1 or x + w > width or y + h > height:
        raise InvalidInput(f"region of interest x={x} y={y} {w}x{h} is not inside the {width}x{height} camera frame")
    return x, y, w, h


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start offsets (patches) of tiles of `tile` patches covering `length`, neighbours overlapping >= `overlap`."""
    if length <= tile:
        return [0]
    count = math.ceil((length - tile) / (tile - overlap)) + 1
    return [round(i * (length - tile) / (count - 1)) for i in range(count)]


def owners(length: int, starts: Sequence[int], tile: int) -> list[tuple[int, int, int]]:
    """(tile index, from, to) runs over 0..length: each patch belongs to the tile it sits deepest inside."""
    best = [max(range(len(starts)), key=lambda t: (min(p - starts[t], starts[t] + tile - 1 - p)
                                                   if starts[t] <= p < starts[t] + tile else -1))
            for p in range(length)]  # fmt: skip
    runs, begin = [], 0
    for p in range(1, length + 1):
        if p == length or best[p] != best[begin]:
            runs.append((best[begin], begin, p))
            begin = p
    return runs


def cuts(base: FeatureExtractor) -> tuple[int, int, int]:
    """(stride px per patch, patches per tile side, least overlap in patches) of tiles for `base`: neighbours
    overlap past both their zero-padded borders."""
    stride = base.input_size // int(base.describe()["grid"][0])
    return stride, base.input_size // stride, 2 * base.border + MIN_OVERLAP


def region_grid(size: tuple[int, int], scale: float, stride: int, tile: int) -> tuple[int, int]:
    """Patches (rows, columns) of a region of (height, width) camera px at `scale`: never shorter than one tile (a
    small region is scaled up to the tile, as squashing did)."""
    h, w = (max(tile, round(side / scale / stride)) for side in size)
    return h, w


def tiles_for_scale(size: tuple[int, int], scale: float, stride: int, tile: int, overlap: int) -> int:
    """How many tiles a region of (height, width) camera px takes at `scale` (stride, tile, overlap: cuts())."""
    return math.prod(len(tile_starts(n, tile, overlap)) for n in region_grid(size, scale, stride, tile))


class TiledExtractor:
    """A base extractor run tile by tile over a region of a camera frame, its patch grids stitched into one."""

    def __init__(self, base: FeatureExtractor, camera: Sequence[int], roi: Sequence[int] | None, scale: float):
        if isinstance(base, TiledExtractor):
            raise InvalidInput("an extractor is tiled once")
        if getattr(base, "name", "") == "siglip":
            raise InvalidInput("siglip features are the vision tower's own view of the whole frame: a region of "
                               "interest and tiles are for the CNN extractors (efficientnet-lite, onnx)")  # fmt: skip
        self.base, self.name = base, base.name
        self.camera = (int(camera[0]), int(camera[1]))  # (height, width) of the frames this was set up for
        self.roi = check_roi(roi if roi is not None else (0, 0, self.camera[1], self.camera[0]), self.camera)
        described = base.describe()
        self.input_size = base.input_size
        self.stride, self.tile, self.overlap = cuts(base)  # px per patch, patches per tile side, least overlap
        self.border, self.blur = base.border, float(getattr(base, "blur", 0.0))
        _, _, w, h = self.roi
        # Never a region side shorter than one tile: a small region is scaled up to the tile, as squashing did.
        self.scale = round(min(float(scale), min(w, h) / self.input_size), 6)  # as the bank records it
        if not self.scale > 0:
            raise InvalidInput(f"tile scale must be > 0 (got {scale})")
        self.grid = region_grid((h, w), self.scale, self.stride, self.tile)  # patches
        self.size = (self.grid[0] * self.stride, self.grid[1] * self.stride)  # (H', W') input px of the region
        self.starts = [tile_starts(n, self.tile, self.overlap) for n in self.grid]  # rows, columns
        self.runs = [owners(n, s, self.tile) for n, s in zip(self.grid, self.starts, strict=True)]
        self.n_tiles = len(self.starts[0]) * len(self.starts[1])
        self._described = described
        tiles = {"roi": list(self.roi), "scale": self.scale, "camera": list(self.camera)}
        self.options = {**described["options"], "tiles": tiles}
        self.fingerprint = fingerprint_of("tiled", base.fingerprint, tiles, base.input_size, None)

    def prepare(self, frame: np.ndarray) -> np.ndarray:
        """A camera frame -> its region at the tiles' scale [H', W', 3]; a frame already prepared passes as it is
        (the vision node keeps teach frames prepared, not at camera size)."""
        if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3):
            raise InvalidInput(f"a frame must be an RGB uint8 [H, W, 3] array (got {getattr(frame, 'shape', frame)})")
        shape = tuple(frame.shape[:2])
        if shape == self.size and shape != self.camera:
            return frame
        if shape != self.camera:
            height, width = self.camera
            raise InvalidInput(f"a {shape[1]}x{shape[0]} frame is not the {width}x{height} camera frame this "
                               "bank's tiles and region were taught on: teach the part on this camera")  # fmt: skip
        x, y, w, h = self.roi
        region = frame[y : y + h, x : x + w]
        return cv2.resize(region, (self.size[1], self.size[0]), interpolation=cv2.INTER_AREA)

    def extract(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """Camera frames -> [N, H'/stride, W'/stride, C]: every tile of every frame through the base in batches (the
        base refuses an empty list)."""
        s, t = self.stride, self.tile * self.stride
        crops = []
        for frame in frames:
            region = self.prepare(frame)
            crops += [region[r * s : r * s + t, c * s : c * s + t] for r in self.starts[0] for c in self.starts[1]]
        per_tile = self.base.extract(crops)  # [N * T, tile, tile, C]
        n, cols = len(frames), len(self.starts[1])
        out = np.empty((n, *self.grid, per_tile.shape[-1]), np.float32)
        per_frame = per_tile.reshape(n, self.n_tiles, *per_tile.shape[1:])
        for ti, r0, r1 in self.runs[0]:
            for tj, c0, c1 in self.runs[1]:
                rs, cs = self.starts[0][ti], self.starts[1][tj]
                out[:, r0:r1, c0:c1] = per_frame[:, ti * cols + tj, r0 - rs : r1 - rs, c0 - cs : c1 - cs]
        return out

    def heatmap(self, patch: np.ndarray, frame_size: tuple[int, int], sigma: float) -> np.ndarray:
        """Patch scores [H'/stride, W'/stride] -> [H, W] float32 at the frame's size, the region's scores placed
        where the region sits (0 outside it: the gate did not look there)."""
        from edgeinspect.models.anomaly.scoring import smooth_to

        x, y, w, h = self.roi
        if tuple(frame_size) != self.camera:  # a prepared frame: the region is the whole of it
            return smooth_to(patch, self.size, sigma, tuple(frame_size))
        out = np.zeros(frame_size, np.float32)
        out[y : y + h, x : x + w] = smooth_to(patch, self.size, sigma, (h, w))
        return out

    def describe(self) -> dict:
        return {**self._described, "options": self.options, "fingerprint": self.fingerprint,
                "grid": [int(self.grid[0]), int(self.grid[1])]}  # fmt: skip


def tiled_for(
    extractor: FeatureExtractor,
    camera: tuple[int, int],
    roi: Sequence[int] | None = None,
    scale: float | None = None,
    max_tiles: int = DEFAULT_MAX_TILES,
) -> FeatureExtractor:
    """The extractor a bank of frames of `camera` (height, width) is taught with: the base itself where frames are
    small and no region is named (squashed whole, as always), else tiled over the region at `scale`, or at the
    finest scale (>= 1, native at most) that keeps to `max_tiles` per frame."""
    if isinstance(extractor, TiledExtractor):
        return extractor
    camera = (int(camera[0]), int(camera[1]))
    if getattr(extractor, "name", "") == "siglip":
        if roi is not None or scale is not None:
            TiledExtractor(extractor, camera, roi, 1.0)  # raises the reason
        return extractor
    box = check_roi(roi, camera) if roi is not None else (0, 0, camera[1], camera[0])
    size = (box[3], box[2])
    if roi is None and scale is None and max(size) <= SQUASH_UP_TO * extractor.input_size:
        return extractor
    if scale is None:
        if max_tiles < 1:
            raise InvalidInput(f"max tiles must be >= 1 (got {max_tiles})")
        # An elongated region keeps its aspect: past the scale where its short side is one tile, no fewer tiles.
        scale, finest, geometry = 1.0, min(size) / extractor.input_size, cuts(extractor)
        while scale < finest and tiles_for_scale(size, scale, *geometry) > max_tiles:
            scale *= 1.05
    return TiledExtractor(extractor, camera, roi, scale)
