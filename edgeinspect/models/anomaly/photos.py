"""A seeded set cut from real photographs that a package ships, in the same layout as sample.py's drawn set.

Drawn parts are too easy to tell methods apart (DESIGN §8): this set is what the gate is judged on. The photographs
are scikit-image's bundled ones (inside its wheel, under skimage/data/, never fetched by pooch), taken by people
outside the project and released as CC0 or public domain (see PHOTOS). They are read as files: skimage itself is
never imported.

    ROOT/PART/train/good/000.png              good frames, cut from the teach area of the photograph
    ROOT/PART/test/good/000.png               good frames, cut from another area, disjoint from the teach area
    ROOT/PART/test/<kind>/000.png             defective frames (test area), defects as sample.py paints them
    ROOT/PART/ground_truth/<kind>/000_mask.png
    ROOT/PART/defects.json                    {"test/<kind>/000.png": {"kind", "severity", "box"}}

Textures (brick: regular courses; gravel: loose stones; grass: vegetation): the photo's top half is the teach area,
its bottom half the test area; a frame is a 128 px crop scaled to 256 px, with its own lighting gain, gradient and
sensor noise. Defects: sample.py's scratch, hole, stain and crack painters at severities 1..3, and `foreign`, a
26/36/48 px square of another photograph pasted in. Camera resolution (retina, 1411 x 1411 px, kept native): the
whole photograph under a small pose, lighting and noise change per frame, as a fixed camera sees one part after
another; defects of 10-30 px, what squashing to 224 px erases.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import cv2
import numpy as np

from edgeinspect.errors import FailedPrecondition, InvalidInput
from edgeinspect.models.anomaly import sample
from edgeinspect.models.anomaly.sample import CANVAS, PAD, Scene

# Bump when the cutting or painting changes: cached sets are keyed by it.
GENERATOR_VERSION = 1
SKIMAGE_PIP = "pip install scikit-image  # its wheel carries the photographs under skimage/data/"


@dataclass(frozen=True)
class Photo:
    file: str  # under skimage/data/
    credit: str  # who took it and its licence, as scikit-image's own docstring states


PHOTOS = {
    "brick": Photo("brick.png", "CC0 Textures (Bricks25), CC0"),
    "gravel": Photo("gravel.png", "CC0 Textures (Gravel04), CC0"),
    "grass": Photo("grass.png", "linolafett on DeviantArt (Grass 01), CC0"),
    "retina": Photo("retina.jpg", "Mikael Häggström, fundus photograph, Wikimedia Commons, CC0"),
}

CROP = 128  # texture crop side in photo pixels
FRAME = 256  # texture frame side: the crop scaled 2x, what a close camera sees
GAIN, GRADIENT, NOISE_SIGMA = 0.08, 0.05, 2.0  # per-frame lighting and sensor noise, as sample.py
POSE_SHIFT_PX, POSE_DEG = 4.0, 1.0  # camera-resolution part: a fixed camera, the part placed again each time
FOREIGN_SIDE = {1: 26, 2: 36, 3: 48}  # frame px of the pasted square of another photograph


@dataclass(frozen=True)
class Surface:
    """A part cut from one photograph: its frames and where a defect may land."""

    photo: str
    regular: bool
    foreign: str  # the photograph a `foreign` defect pastes a piece of
    native: bool = False  # frames are the whole photograph at its own resolution


PARTS: dict[str, Surface] = {
    "brick": Surface("brick", regular=True, foreign="gravel"),
    "gravel": Surface("gravel", regular=False, foreign="grass"),
    "grass": Surface("grass", regular=False, foreign="brick"),
    "retina": Surface("retina", regular=True, foreign="gravel", native=True),
}
TEXTURES = [p for p, s in PARTS.items() if not s.native]


def data_dir() -> Path:
    """skimage/data inside the installed wheel, found without importing skimage (its imports are heavy)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise FailedPrecondition(f"the photograph set needs scikit-image's bundled photographs: {SKIMAGE_PIP}")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@cache
def photo(name: str) -> np.ndarray:
    """A bundled photograph as RGB uint8 [H, W, 3] (the grey ones repeated over three channels)."""
    path = data_dir() / PHOTOS[name].file
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)  # BGR, grey expanded
    if image is None:
        raise FailedPrecondition(f"{path}: missing or unreadable in this scikit-image install: {SKIMAGE_PIP}")
    image = np.ascontiguousarray(image[..., ::-1])
    image.flags.writeable = False
    return image


# ---- frames ---------------------------------------------------------------------------------------------------


def _lighting(rng: np.random.Generator, image: np.ndarray) -> np.ndarray:
    """float32 [H, W, 3] -> uint8 with a lighting gain, a falloff across the frame and sensor noise."""
    h, w = image.shape[:2]
    g = rng.uniform(-GRADIENT, GRADIENT, 2)
    light = (1 + rng.uniform(-GAIN, GAIN)) * (
        1
        + g[0] * np.linspace(-1, 1, w, dtype=np.float32)[None, :]
        + g[1] * np.linspace(-1, 1, h, dtype=np.float32)[:, None]
    )  # [H, W]
    noisy = image * light[..., None] + rng.normal(0, NOISE_SIGMA, image.shape).astype(np.float32)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def _texture_crop(rng: np.random.Generator, name: str, area: str) -> np.ndarray:
    """A FRAME x FRAME float32 view of a CROP x CROP crop from the photo's top (teach) or bottom (test) half."""
    image = photo(name)
    h, w = image.shape[:2]
    rows = (0, h // 2 - CROP) if area == "teach" else (h // 2, h - CROP)
    y, x = int(rng.integers(rows[0], rows[1] + 1)), int(rng.integers(0, w - CROP + 1))
    crop = image[y : y + CROP, x : x + CROP].astype(np.float32)
    return cv2.resize(crop, (FRAME, FRAME), interpolation=cv2.INTER_CUBIC)


def _posed(rng: np.random.Generator, name: str) -> np.ndarray:
    """The whole photograph, float32, shifted and turned a little (border reflected)."""
    image = photo(name).astype(np.float32)
    h, w = image.shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), rng.uniform(-POSE_DEG, POSE_DEG), 1.0)
    m[:, 2] += rng.uniform(-POSE_SHIFT_PX, POSE_SHIFT_PX, 2)
    return cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)


def _base(rng: np.random.Generator, part: str, area: str) -> np.ndarray:
    surface = PARTS[part]
    return _posed(rng, surface.photo) if surface.native else _texture_crop(rng, surface.photo, area)


def _where(image: np.ndarray, native: bool) -> np.ndarray:
    """[H, W] bool: where a defect may sit (the retina's lit disc, the whole texture)."""
    if not native:
        return np.ones(image.shape[:2], bool)
    lit = (image.mean(axis=-1) > 40).astype(np.uint8)
    return cv2.erode(lit, np.ones((61, 61), np.uint8)) > 0  # off the disc's dark rim


# ---- defects --------------------------------------------------------------------------------------------------


def foreign(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int, source: str, scale: float) -> None:
    """A square of another photograph (at this frame's scale) pasted where sample.py's painters put a defect."""
    side = FOREIGN_SIDE[severity]
    x, y = sample._spot(rng, scene, 30)
    other = photo(source)
    src = max(4, round(side / scale))  # photo pixels that cover `side` frame pixels
    sy, sx = int(rng.integers(0, other.shape[0] - src)), int(rng.integers(0, other.shape[1] - src))
    piece = cv2.resize(
        other[sy : sy + src, sx : sx + src].astype(np.float32), (side, side), interpolation=cv2.INTER_CUBIC
    )
    y0, x0 = y - side // 2, x - side // 2
    scene.image[y0 : y0 + side, x0 : x0 + side] = piece
    mask[y0 : y0 + side, x0 : x0 + side] = 255


Painter = Callable[[np.random.Generator, Scene, np.ndarray, int], None]
KINDS: dict[str, Painter | None] = {
    "scratch": sample.scratch,
    "hole": sample.hole,
    "stain": sample.stain,
    "crack": sample.crack,
    "foreign": None,  # foreign(), which needs the part's other photograph
}


def _paint(rng: np.random.Generator, part: str, image: np.ndarray, kind: str, severity: int) -> np.ndarray:
    """Paints one defect into image (float32 [H, W, 3], in place) inside a CANVAS window; returns its mask [H, W]."""
    surface = PARTS[part]
    h, w = image.shape[:2]
    where = _where(image, surface.native)
    # The painters work on a CANVAS-sized scene and pick a spot inside its PAD margin: cut a window whose middle is
    # on the surface (a texture frame is smaller than CANVAS: reflect-padded, then cut back).
    padded = cv2.copyMakeBorder(image, PAD, PAD, PAD, PAD, cv2.BORDER_REFLECT) if not surface.native else image
    ok = np.pad(where, PAD) if not surface.native else where
    y0 = x0 = 0  # a texture frame padded is the window
    if surface.native:
        ys, xs = np.nonzero(ok[CANVAS // 2 : h - CANVAS // 2, CANVAS // 2 : w - CANVAS // 2])  # window middles
        i = int(rng.integers(len(xs)))
        y0, x0 = int(ys[i]), int(xs[i])
    window = padded[y0 : y0 + CANVAS, x0 : x0 + CANVAS].copy()
    scene = Scene(image=window, surface=ok[y0 : y0 + CANVAS, x0 : x0 + CANVAS].copy())
    mask = np.zeros((CANVAS, CANVAS), np.uint8)
    painter = KINDS[kind]
    if painter is None:
        foreign(rng, scene, mask, severity, surface.foreign, 1.0 if surface.native else FRAME / CROP)
    else:
        painter(rng, scene, mask, severity)
    padded[y0 : y0 + CANVAS, x0 : x0 + CANVAS] = scene.image
    full = np.zeros(padded.shape[:2], np.uint8)
    full[y0 : y0 + CANVAS, x0 : x0 + CANVAS] = mask
    if not surface.native:
        image[:] = padded[PAD : PAD + h, PAD : PAD + w]
        return full[PAD : PAD + h, PAD : PAD + w]
    return full


def good_frame(part: str, rng: np.random.Generator, area: str = "test") -> np.ndarray:
    """One good frame of `part` from its teach or test area: RGB uint8."""
    return _lighting(rng, _base(rng, part, area))


def defect_frame(part: str, kind: str, severity: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One defective frame from the test area and its mask (uint8 0/255); the defect always lands inside."""
    while True:
        image = _base(rng, part, "test")
        mask = _paint(rng, part, image, kind, severity)
        if mask.any():
            return _lighting(rng, image), mask


# ---- the set on disk ------------------------------------------------------------------------------------------


def write_part(root: Path, part: str, seed: int, n_train: int, n_test_good: int, per_severity: int) -> dict:
    """Writes one part's folders; returns its counts. Each part draws from its own stream of the seed."""
    rng = np.random.default_rng([seed, sorted(PARTS).index(part), GENERATOR_VERSION])
    base = root / part
    for i in range(n_train):
        sample._save(base / "train" / "good" / f"{i:03d}.png", good_frame(part, rng, "teach"))
    for i in range(n_test_good):
        sample._save(base / "test" / "good" / f"{i:03d}.png", good_frame(part, rng, "test"))
    labels: dict[str, dict] = {}
    for kind in KINDS:
        i = 0
        for severity in (1, 2, 3):
            for _ in range(per_severity):
                frame, mask = defect_frame(part, kind, severity, rng)
                sample._save(base / "test" / kind / f"{i:03d}.png", frame)
                sample._save(base / "ground_truth" / kind / f"{i:03d}_mask.png", mask)
                labels[f"test/{kind}/{i:03d}.png"] = {"kind": kind, "severity": severity, "box": sample._box(mask)}
                i += 1
    (base / "defects.json").write_text(json.dumps(labels, indent=1) + "\n")
    s = PARTS[part]
    return {"train": n_train, "test_good": n_test_good, "defects": len(labels), "kinds": list(KINDS),
            "photo": PHOTOS[s.photo].file, "credit": PHOTOS[s.photo].credit, "regular": s.regular,
            "frame": list(good_frame(part, np.random.default_rng(0)).shape[:2])}  # fmt: skip


def write_photo_set(
    root: str | Path,
    parts: list[str] | None = None,
    seed: int = 0,
    n_train: int = 30,
    n_test_good: int = 20,
    per_severity: int = 2,
) -> dict:
    """Writes the photograph set under `root` (the layout above); returns {part: counts}."""
    chosen = parts or list(PARTS)
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        raise InvalidInput(f"unknown photograph part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    root = Path(root)
    return {p: write_part(root, p, seed, n_train, n_test_good, per_severity) for p in chosen}


def cached_photo_set(seed: int = 0, parts: list[str] | None = None, **counts) -> Path:
    """The set for (seed, parts, counts), written once and reused (tests, bench); see sample.cached_set."""
    chosen = sorted(parts or PARTS)
    key = "-".join([f"v{GENERATOR_VERSION}", f"seed{seed}", *chosen, *(f"{k}{v}" for k, v in sorted(counts.items()))])
    final = sample.sample_cache_dir().parent / "anomaly-photos" / key
    return sample.cached_set(final, lambda tmp: write_photo_set(tmp, chosen, seed=seed, **counts))
