"""Camera frames at their own resolution: tiles over a region of interest, stitched, scored, mapped back.

The stitching oracle is the base extractor's own arithmetic over the whole region at once: raw-pixel features are
local (8x8 pixels, a 3x3 patch average), so tiles cut at patch boundaries and stitched from their interiors must
give exactly the features of the region computed in one piece. The detection tests use a real photograph (the
retina fundus photograph scikit-image's wheel ships, 1411 px) with a small defect a station camera would see."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch

from edgeinspect.errors import InvalidInput
from edgeinspect.models.anomaly import photos
from edgeinspect.models.anomaly.features import RawPixelExtractor, open_extractor, pool_and_concat
from edgeinspect.models.anomaly.scoring import Scorer
from edgeinspect.models.anomaly.teach import teach
from edgeinspect.models.anomaly.tiles import TiledExtractor, owners, tile_starts, tiled_for

CAMERA = (1200, 1600)  # (height, width): a station camera's frame, 7x what the raw-pixel input (224) holds
ROI = (200, 150, 1200, 900)  # x, y, width, height: where the part sits
SPOT = (640, 520)  # x, y camera px of the defect's centre, inside ROI
SPOT_RADIUS = 7  # px: 14 px across, two pixels once a 1600 px frame is squashed to 224


def region_features(region: np.ndarray, patch: int = 8) -> np.ndarray:
    """Raw-pixel features of a whole region in one piece: [gh, gw, 3 * patch^2], as RawPixelExtractor computes
    them for a square frame at its input size."""
    h, w = region.shape[0] // patch, region.shape[1] // patch
    x = region.astype(np.float32)[: h * patch, : w * patch] / 255.0
    x = x.reshape(1, h, patch, w, patch, 3).transpose(0, 5, 2, 4, 1, 3).reshape(1, 3 * patch * patch, h, w)
    return pool_and_concat([torch.from_numpy(np.ascontiguousarray(x))])[0]


def camera_frame(rng: np.random.Generator, spot: bool = False) -> np.ndarray:
    """The retina photograph placed a little differently each time, lit and noised, at the camera's size."""
    base = photos._posed(rng, "retina")  # float32 [1411, 1411, 3]
    base = cv2.resize(base, (CAMERA[1], CAMERA[0]), interpolation=cv2.INTER_LINEAR)
    if spot:
        cv2.circle(base, SPOT, SPOT_RADIUS, (20.0, 160.0, 40.0), -1, lineType=cv2.LINE_AA)
    return photos._lighting(rng, base)


def test_tiles_overlap_and_every_patch_has_one_owner_deep_inside_a_tile():
    starts = tile_starts(150, 28, 3)
    assert starts[0] == 0 and starts[-1] == 150 - 28
    assert all(b - a <= 28 - 3 for a, b in zip(starts, starts[1:], strict=False))  # neighbours overlap >= 3
    runs = owners(150, starts, 28)
    covered = [p for _, a, b in runs for p in range(a, b)]
    assert covered == list(range(150))
    for t, a, b in runs:  # away from the region's edge a patch sits >= 1 patch inside the tile it comes from
        for p in range(a, b):
            if 0 < p < 149:
                assert 1 <= p - starts[t] <= 26
    assert tile_starts(20, 28, 3) == [0]


def test_stitched_tiles_equal_the_region_computed_in_one_piece():
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 256, (*CAMERA, 3), dtype=np.uint8)
    tiled = TiledExtractor(RawPixelExtractor(224), CAMERA, ROI, scale=1.5)
    assert tiled.n_tiles > 4 and tiled.grid == (75, 100)  # 900 / 1.5 / 8, 1200 / 1.5 / 8
    got = tiled.extract([frame])[0]
    want = region_features(tiled.prepare(frame))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_tiled_bank_reopens_from_its_description_and_refuses_another_camera(tmp_path):
    tiled = TiledExtractor(RawPixelExtractor(224), CAMERA, ROI, scale=2.0)
    described = tiled.describe()
    again = open_extractor(described["name"], **json.loads(json.dumps(described["options"])))
    assert isinstance(again, TiledExtractor) and again.fingerprint == tiled.fingerprint
    assert TiledExtractor(RawPixelExtractor(224), CAMERA, ROI, scale=1.0).fingerprint != tiled.fingerprint
    assert described["grid"] == list(tiled.grid)
    with pytest.raises(InvalidInput, match="not the 1600x1200 camera frame"):
        tiled.extract([np.zeros((1080, 1920, 3), np.uint8)])
    with pytest.raises(InvalidInput, match="not inside the 1600x1200 camera frame"):
        TiledExtractor(RawPixelExtractor(224), CAMERA, (1000, 0, 700, 100), scale=1.0)


def test_teach_tiles_large_frames_by_itself_and_leaves_small_ones_squashed():
    base = RawPixelExtractor(224)
    assert tiled_for(base, (300, 300)) is base  # under 1.5x the input: squashed whole, as always
    auto = tiled_for(base, CAMERA, max_tiles=4)
    assert isinstance(auto, TiledExtractor) and auto.n_tiles <= 4 and auto.scale >= 1.0
    finer = tiled_for(base, CAMERA, max_tiles=16)
    assert finer.n_tiles <= 16 and finer.scale < auto.scale
    assert tiled_for(base, CAMERA, roi=ROI, scale=1.0).grid == (900 // 8, 1200 // 8)  # native: 1 px is 1 px


def test_a_small_defect_in_a_camera_frame_is_found_and_boxed_in_camera_pixels():
    rng = np.random.default_rng(0)
    good = [(f"{i:03d}.png", camera_frame(rng)) for i in range(8)]
    new_good = [camera_frame(rng) for _ in range(3)]
    defective = camera_frame(rng, spot=True)
    base = RawPixelExtractor(224)

    bank, _ = teach(good, base, "retina", roi=ROI, scale=1.0)
    tiled = open_extractor(bank.extractor["name"], **bank.extractor["options"])
    assert bank.extractor["options"]["tiles"]["roi"] == list(ROI) and bank.stats["tiles"] > 1
    scorer = Scorer(bank, tiled)
    goods = scorer.score(new_good)
    hit = scorer.score([defective])[0]
    assert hit.score > max(g.score for g in goods) and hit.verdict != "OK"
    assert hit.heatmap.shape == CAMERA
    x, y, w, h = ROI
    outside = np.ones(CAMERA, bool)
    outside[y : y + h, x : x + w] = False
    assert float(np.abs(hit.heatmap[outside]).max()) == 0.0  # the gate did not look outside the region
    top = hit.regions[0]  # in fractions of the camera frame
    sx, sy = SPOT[0] / CAMERA[1], SPOT[1] / CAMERA[0]
    assert top.x0 <= sx <= top.x1 and top.y0 <= sy <= top.y1
    assert (top.x1 - top.x0) * CAMERA[1] < 120  # a box around the spot, not around the frame
