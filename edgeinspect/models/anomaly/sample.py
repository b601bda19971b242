"""A procedurally drawn, seeded sample set for the anomaly gate, in the MVTec AD folder layout.

    ROOT/PART/train/good/000.png ...          good frames to teach from
    ROOT/PART/test/good/000.png ...           good frames to score
    ROOT/PART/test/<kind>/000.png ...         defective frames
    ROOT/PART/ground_truth/<kind>/000_mask.png
    ROOT/PART/defects.json                    {"test/<kind>/000.png": {"kind", "severity", "box"}}

Our own drawing code (MVTec AD itself is CC BY-NC-SA: never shipped). Each part is drawn on a canvas larger than the
frame, defects and their masks on the same canvas, then one random pose (shift, rotation), lighting and sensor noise
per frame, so a good frame is never a copy of another. Severity 1 is faint or small yet visible to a person.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

# Bump when the drawing changes: cached sets are keyed by it.
GENERATOR_VERSION = 1
SIZE = 256  # frame side, px
PAD = 24  # canvas margin that the pose can pull in without showing an edge
CANVAS = SIZE + 2 * PAD

# Per-frame line variation: what a fixed camera over a conveyor sees from one part to the next.
SHIFT_PX = 4.0
ROTATE_DEG = 2.0
GAIN = 0.08  # +- global lighting gain
GRADIENT = 0.05  # +- lighting falloff across the frame
NOISE_SIGMA = 2.0  # sensor noise, 8-bit levels


@dataclass
class Scene:
    """A part drawn in canvas coordinates: the image ([C, C, 3] float32 0..255) and what defects need to know."""

    image: np.ndarray  # [C, C, 3] float32
    surface: np.ndarray  # [C, C] bool: where a surface defect may land
    background: np.ndarray | None = None  # [C, C, 3] float32: what a cut-away part reveals
    pads: list[tuple[int, int, int, int]] | None = None  # board pads (x0, y0, x1, y1)
    ring: tuple[float, float, float, float] | None = None  # object: (cx, cy, r_in, r_out)
    body: np.ndarray | None = None  # [C, C] float32 0..1: where the part is (a crack stops at its edge)
    dirt: tuple[float, float, float] = (25.0, 22.0, 20.0)  # foreign matter's colour, chosen to show on this part
    hole_scale: float = 1.0  # a hole must take out more than the gap between a mesh's threads to be seen


# ---- parts ----------------------------------------------------------------------------------------------------


def _streaks(rng: np.random.Generator, length: int) -> np.ndarray:
    """[C, C] float32 in about -1..1: noise smeared along x, the look of brushed or rolled metal."""
    noise = rng.normal(0.0, 1.0, (CANVAS, CANVAS)).astype(np.float32)
    smeared = cv2.blur(noise, (length, 1))
    return smeared / (smeared.std() + 1e-6)


def draw_metal(rng: np.random.Generator) -> Scene:
    """Brushed stainless: fine horizontal streaks over a cool grey, a soft sheen band."""
    fine, coarse = _streaks(rng, 41), _streaks(rng, 121)
    y = np.linspace(-1.0, 1.0, CANVAS, dtype=np.float32)[:, None]
    sheen = 12.0 * np.exp(-((y - rng.uniform(-0.3, 0.3)) ** 2) / 0.3)  # [C, 1]
    grey = 150.0 + 9.0 * fine + 5.0 * coarse + sheen  # [C, C]
    image = np.stack([grey * 0.97, grey * 0.99, grey * 1.03], axis=-1)
    return Scene(image=image.astype(np.float32), surface=np.ones((CANVAS, CANVAS), bool))


def draw_mesh(rng: np.random.Generator) -> Scene:
    """Plain-woven wire mesh: threads every 12 px that pass over and under one another, dark gaps between."""
    period = 12.0
    phase = rng.uniform(0, period, 2)
    yy, xx = np.mgrid[0:CANVAS, 0:CANVAS].astype(np.float32)
    u, v = (xx + phase[0]) / period, (yy + phase[1]) / period
    du, dv = u - np.floor(u) - 0.5, v - np.floor(v) - 0.5  # -0.5..0.5 inside each cell
    vertical = np.exp(-((du / 0.22) ** 2))  # a thread along y at each cell's middle column
    horizontal = np.exp(-((dv / 0.22) ** 2))
    over = (np.floor(u) + np.floor(v)) % 2 == 0  # which thread is on top at this crossing
    # The thread underneath dips, so it is shaded darker near the crossing.
    v_shade = np.where(over, 1.0, 0.55 + 0.45 * np.abs(dv) * 2)
    h_shade = np.where(over, 0.55 + 0.45 * np.abs(du) * 2, 1.0)
    lum = np.maximum(vertical * v_shade, horizontal * h_shade)  # [C, C] 0..1
    grain = cv2.GaussianBlur(rng.normal(0, 1, (CANVAS, CANVAS)).astype(np.float32), (0, 0), 1.5)
    grey = 35.0 + 165.0 * lum + 6.0 * grain * lum
    image = np.stack([grey * 1.02, grey * 1.0, grey * 0.9], axis=-1)  # slightly warm: brass wire
    surface = np.ones((CANVAS, CANVAS), bool)
    # Rust on brass; a hole at least half a weave period wide, else it hides in a gap.
    return Scene(image=image.astype(np.float32), surface=surface, dirt=(230.0, 95.0, 25.0), hole_scale=1.6)


_BOARD_GREEN = np.array([28.0, 96.0, 52.0], np.float32)
_COPPER = np.array([205.0, 165.0, 80.0], np.float32)
_SILK = np.array([225.0, 228.0, 220.0], np.float32)


def _board_layout() -> tuple[list[tuple[int, int, int, int]], list[list[tuple[int, int]]], list[tuple[int, int]]]:
    """The one board design every frame shows: pads, traces (polylines), vias; fixed, not per frame."""
    rng = np.random.default_rng(1234)
    pads: list[tuple[int, int, int, int]] = []
    o = PAD
    for i in range(8):  # an SOIC-16 footprint: two rows of eight
        x = o + 70 + i * 15
        pads.append((x, o + 62, x + 8, o + 78))
        pads.append((x, o + 112, x + 8, o + 128))
    for j, (x, y) in enumerate([(40, 170), (100, 180), (160, 172), (200, 40), (40, 40)]):  # two-pad passives
        if j % 2:
            pads += [(o + x, o + y, o + x + 12, o + y + 10), (o + x + 24, o + y, o + x + 36, o + y + 10)]
        else:
            pads += [(o + x, o + y, o + x + 10, o + y + 12), (o + x, o + y + 24, o + x + 10, o + y + 36)]
    traces: list[list[tuple[int, int]]] = []
    for x0, y0, x1, y1 in pads[:16]:
        cx = (x0 + x1) // 2
        top = y0 < o + 90
        y_end = o + int(rng.integers(12, 40)) if top else o + 256 - int(rng.integers(10, 30))
        bend = cx + int(rng.integers(-20, 20))
        traces.append([(cx, y0 if top else y1), (cx, (y0 + y_end) // 2), (bend, y_end)])
    vias = [(o + int(rng.integers(20, 236)), o + int(rng.integers(140, 236))) for _ in range(9)]
    return pads, traces, vias


_LAYOUT = _board_layout()


def draw_board(rng: np.random.Generator) -> Scene:
    """A green PCB: an SOIC footprint, passives' pads, traces, vias and silkscreen; the same design every frame."""
    pads, traces, vias = _LAYOUT
    green = _BOARD_GREEN * rng.uniform(0.97, 1.03)
    image = np.empty((CANVAS, CANVAS, 3), np.float32)
    image[:] = green
    weave = cv2.GaussianBlur(rng.normal(0, 1, (CANVAS, CANVAS)).astype(np.float32), (0, 0), 2.0)
    image += 3.0 * weave[..., None]  # the glass-fibre weave under the solder mask
    dark_copper = tuple(float(c) for c in (_BOARD_GREEN * 1.25 + 10))  # traces under the mask: lighter green
    for line in traces:
        cv2.polylines(image, [np.array(line, np.int32)], False, dark_copper, 3, cv2.LINE_AA)
    cv2.rectangle(image, (PAD + 62, PAD + 84), (PAD + 194, PAD + 106), tuple(float(c) for c in _SILK), 1)
    cv2.circle(image, (PAD + 68, PAD + 90), 2, tuple(float(c) for c in _SILK), -1, cv2.LINE_AA)
    for x, y in vias:
        cv2.circle(image, (x, y), 5, tuple(float(c) for c in _COPPER * 0.9), -1, cv2.LINE_AA)
        cv2.circle(image, (x, y), 2, (20.0, 20.0, 20.0), -1, cv2.LINE_AA)
    for x0, y0, x1, y1 in pads:
        cv2.rectangle(image, (x0, y0), (x1, y1), tuple(float(c) for c in _COPPER), -1)
    surface = np.zeros((CANVAS, CANVAS), bool)
    surface[PAD + 10 : PAD + SIZE - 10, PAD + 10 : PAD + SIZE - 10] = True
    return Scene(image=image, surface=surface, background=None, pads=pads)


def draw_washer(rng: np.random.Generator) -> Scene:
    """A machined steel washer with four bolt holes on a dark rubber conveyor belt."""
    belt = cv2.GaussianBlur(rng.normal(0, 1, (CANVAS, CANVAS)).astype(np.float32), (0, 0), 3.0)
    background = np.stack([45.0 + 4.0 * belt] * 3, axis=-1).astype(np.float32)
    c = CANVAS / 2.0
    r_in, r_out = 34.0, 92.0
    yy, xx = np.mgrid[0:CANVAS, 0:CANVAS].astype(np.float32)
    r = np.hypot(xx - c, yy - c)
    theta = np.arctan2(yy - c, xx - c)
    body = (r >= r_in) & (r <= r_out)
    for k in range(4):  # bolt holes on a 63 px circle
        a = k * np.pi / 2 + np.pi / 4
        body &= np.hypot(xx - c - 63 * np.cos(a), yy - c - 63 * np.sin(a)) > 9.0
    # Turned steel: concentric tool marks, lit from the top left.
    marks = 6.0 * np.sin(r * 2.1 + rng.uniform(0, 6.3)) + 3.0 * np.sin(r * 0.7)
    light = 22.0 * np.cos(theta + 2.36)
    steel = 165.0 + marks + light  # [C, C]
    part = np.stack([steel * 0.98, steel, steel * 1.02], axis=-1)
    soft = cv2.GaussianBlur(body.astype(np.float32), (0, 0), 0.8)[..., None]  # anti-aliased edge
    image = background * (1 - soft) + part * soft
    surface = (r >= r_in + 6) & (r <= r_out - 6)
    ring = (c, c, r_in, r_out)
    return Scene(image=image.astype(np.float32), surface=surface, background=background, ring=ring, body=soft[..., 0])


# ---- defects --------------------------------------------------------------------------------------------------
# Each draws into scene.image and mask ([C, C] uint8) in place; severity 1..3 scales size and contrast.


def _spot(rng: np.random.Generator, scene: Scene, margin: int = 30) -> tuple[int, int]:
    """A point on the part's defect-able surface, away from the canvas edge so the pose keeps it in frame."""
    ys, xs = np.nonzero(scene.surface[PAD + margin : PAD + SIZE - margin, PAD + margin : PAD + SIZE - margin])
    i = int(rng.integers(len(xs)))
    return int(xs[i]) + PAD + margin, int(ys[i]) + PAD + margin


def _stroke(scene: Scene, mask: np.ndarray, points: np.ndarray, width: int, delta: float) -> None:
    """A line of `width` px whose brightness differs from the surface by `delta` levels."""
    layer = np.zeros(mask.shape, np.float32)
    cv2.polylines(layer, [points.astype(np.int32)], False, 1.0, width, cv2.LINE_AA)
    if scene.body is not None:
        layer *= scene.body
    scene.image += delta * layer[..., None]
    mask[layer > 0.3] = 255


def scratch(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int) -> None:
    length, width, delta = {1: (34, 2, 45), 2: (60, 2, 75), 3: (100, 3, 100)}[severity]
    x, y = _spot(rng, scene, 40)
    a = rng.uniform(0, np.pi)
    t = np.linspace(-0.5, 0.5, 12)[:, None]
    bow = rng.uniform(-0.08, 0.08) * length * (1 - 4 * t**2)  # a slight curve, as a dragged burr leaves
    pts = np.hstack([x + t * length * np.cos(a) - bow * np.sin(a), y + t * length * np.sin(a) + bow * np.cos(a)])
    sign = 1.0 if scene.image[y, x].mean() < 110 else -1.0  # bright on dark surfaces, dark on bright ones
    _stroke(scene, mask, pts, width, sign * delta)


def crack(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int) -> None:
    length, width, delta = {1: (30, 2, -55), 2: (55, 2, -85), 3: (90, 3, -115)}[severity]
    x, y = _spot(rng, scene, 40)
    a = rng.uniform(0, 2 * np.pi)
    pts = [(float(x), float(y))]
    for _ in range(length // 5):  # a jagged random walk, as a fatigue crack runs
        a += rng.normal(0, 0.5)
        pts.append((pts[-1][0] + 5 * np.cos(a), pts[-1][1] + 5 * np.sin(a)))
    _stroke(scene, mask, np.array(pts), width, delta)


def hole(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int) -> None:
    radius = round({1: 4, 2: 7, 3: 11}[severity] * scene.hole_scale)
    x, y = _spot(rng, scene)
    layer = np.zeros(mask.shape, np.float32)
    cv2.circle(layer, (x, y), radius, 1.0, -1, cv2.LINE_AA)
    rim = np.zeros_like(layer)
    cv2.circle(rim, (x, y), radius + 2, 1.0, 2, cv2.LINE_AA)  # a burr around the punched edge
    hole_colour = np.array([18.0, 18.0, 20.0], np.float32)
    scene.image = scene.image * (1 - layer[..., None]) + hole_colour * layer[..., None] + 25.0 * rim[..., None]
    mask[(layer > 0.3) | (rim > 0.5)] = 255


def stain(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int) -> None:
    radius, alpha = {1: (11, 0.3), 2: (16, 0.42), 3: (24, 0.55)}[severity]
    x, y = _spot(rng, scene)
    layer = np.zeros(mask.shape, np.float32)
    axes = (radius, int(radius * rng.uniform(0.55, 0.9)))
    cv2.ellipse(layer, (x, y), axes, float(rng.uniform(0, 180)), 0, 360, 1.0, -1, cv2.LINE_AA)
    layer = cv2.GaussianBlur(layer, (0, 0), radius * 0.25) * alpha  # soft-edged, as dried coolant
    oil = np.array([110.0, 72.0, 30.0], np.float32)  # brownish residue
    scene.image = scene.image * (1 - layer[..., None]) + oil * layer[..., None]
    mask[layer > alpha * 0.4] = 255


def contamination(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int) -> None:
    """Foreign matter: dark specks and, at higher severity, a fibre."""
    specks, fibre = {1: (2, 0), 2: (4, 30), 3: (7, 55)}[severity]
    x, y = _spot(rng, scene, 40)
    layer = np.zeros(mask.shape, np.float32)
    for _ in range(specks):
        px, py = x + int(rng.integers(-12, 13)), y + int(rng.integers(-12, 13))
        cv2.circle(layer, (px, py), int(rng.integers(2, 4)), 1.0, -1, cv2.LINE_AA)
    if fibre:
        a = rng.uniform(0, np.pi)
        t = np.linspace(0, 1, 10)[:, None]
        wiggle = 4 * np.sin(t * 6 + rng.uniform(0, 6))
        pts = np.hstack(
            [x + t * fibre * np.cos(a) - wiggle * np.sin(a), y + t * fibre * np.sin(a) + wiggle * np.cos(a)]
        )
        cv2.polylines(layer, [pts.astype(np.int32)], False, 1.0, 2, cv2.LINE_AA)
    dirt = np.array(scene.dirt, np.float32)
    scene.image = scene.image * (1 - layer[..., None]) + dirt * layer[..., None]
    mask[layer > 0.3] = 255


def missing_pad(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int) -> None:
    """Pads left bare (solder mask over them, only their traces remain): one IC pad, one passive pad, or three."""
    pads = scene.pads or []
    ic, passive = list(range(16)), list(range(16, len(pads)))
    chosen = {1: [int(rng.choice(ic))], 2: [int(rng.choice(passive))]}.get(severity)
    if chosen is None:
        start = int(rng.integers(0, 6)) * 2 + int(rng.integers(0, 2))
        chosen = [start, start + 2, start + 4]  # three neighbours in one row
    for i in chosen:
        x0, y0, x1, y1 = pads[i]
        scene.image[y0 : y1 + 1, x0 : x1 + 1] = _BOARD_GREEN * 1.05
        mask[y0 : y1 + 1, x0 : x1 + 1] = 255


def notch(rng: np.random.Generator, scene: Scene, mask: np.ndarray, severity: int) -> None:
    """A bite out of the washer's outer rim: the belt shows through."""
    cx, cy, _, r_out = scene.ring or (CANVAS / 2, CANVAS / 2, 0, 80)
    radius = {1: 5, 2: 9, 3: 15}[severity]
    a = rng.uniform(0, 2 * np.pi)
    x, y = int(cx + (r_out + radius * 0.2) * np.cos(a)), int(cy + (r_out + radius * 0.2) * np.sin(a))
    layer = np.zeros(mask.shape, np.float32)
    cv2.circle(layer, (x, y), radius, 1.0, -1, cv2.LINE_AA)
    part = np.abs(scene.image - scene.background).mean(axis=-1) > 20  # only where the washer was
    layer *= part
    scene.image = scene.image * (1 - layer[..., None]) + scene.background * layer[..., None]
    mask[layer > 0.3] = 255


Draw = Callable[[np.random.Generator], Scene]
Defect = Callable[[np.random.Generator, Scene, np.ndarray, int], None]
# part -> (drawing, defect kinds): two textures, a board, an object.
PARTS: dict[str, tuple[Draw, dict[str, Defect]]] = {
    "metal": (draw_metal, {"scratch": scratch, "hole": hole, "crack": crack}),
    "mesh": (draw_mesh, {"hole": hole, "contamination": contamination, "stain": stain}),
    "board": (draw_board, {"scratch": scratch, "contamination": contamination, "missing_pad": missing_pad}),
    "washer": (draw_washer, {"crack": crack, "notch": notch, "stain": stain}),
}


# ---- frames ---------------------------------------------------------------------------------------------------


def _finish(rng: np.random.Generator, image: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pose, lighting and sensor noise: canvas [C, C, 3] float32 -> frame [S, S, 3] uint8 and mask [S, S] uint8."""
    angle = rng.uniform(-ROTATE_DEG, ROTATE_DEG)
    shift = rng.uniform(-SHIFT_PX, SHIFT_PX, 2)
    m = cv2.getRotationMatrix2D((CANVAS / 2, CANVAS / 2), angle, 1.0)
    m[:, 2] += shift - PAD  # and crop the canvas margin away
    frame = cv2.warpAffine(image, m, (SIZE, SIZE), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    warped = cv2.warpAffine(mask, m, (SIZE, SIZE), flags=cv2.INTER_LINEAR)
    g = rng.uniform(-GRADIENT, GRADIENT, 2)
    ramp = np.linspace(-1, 1, SIZE, dtype=np.float32)
    light = (1 + rng.uniform(-GAIN, GAIN)) * (1 + g[0] * ramp[None, :] + g[1] * ramp[:, None])  # [S, S]
    frame = frame * light[..., None] + rng.normal(0, NOISE_SIGMA, frame.shape)
    return np.clip(frame, 0, 255).astype(np.uint8), np.where(warped >= 128, 255, 0).astype(np.uint8)


def good_frame(part: str, rng: np.random.Generator) -> np.ndarray:
    """One good frame of `part`: [S, S, 3] RGB uint8."""
    scene = PARTS[part][0](rng)
    frame, _ = _finish(rng, scene.image, np.zeros((CANVAS, CANVAS), np.uint8))
    return frame


def defect_frame(part: str, kind: str, severity: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One defective frame and its mask: ([S, S, 3] RGB uint8, [S, S] uint8 0/255)."""
    draw, kinds = PARTS[part]
    while True:  # a defect the pose pushed out of frame (rare) is drawn again: every defect frame shows one
        scene = draw(rng)
        mask = np.zeros((CANVAS, CANVAS), np.uint8)
        kinds[kind](rng, scene, mask, severity)
        frame, warped = _finish(rng, scene.image, mask)
        if warped.any():
            return frame, warped


def _box(mask: np.ndarray) -> list[float]:
    """The mask's bounding box as frame fractions (x0, y0, x1, y1), the form Defect.box uses."""
    ys, xs = np.nonzero(mask)
    h, w = mask.shape
    return [round(xs.min() / w, 4), round(ys.min() / h, 4), round((xs.max() + 1) / w, 4), round((ys.max() + 1) / h, 4)]


def _save(path: Path, rgb: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    bgr = rgb[..., ::-1] if rgb.ndim == 3 else rgb
    if not cv2.imwrite(str(path), np.ascontiguousarray(bgr)):
        raise OSError(f"could not write {path}")


def write_part(root: Path, part: str, seed: int, n_train: int, n_test_good: int, per_severity: int) -> dict:
    """Writes one part's folders; returns its counts. Each part draws from its own stream of the seed."""
    rng = np.random.default_rng([seed, sorted(PARTS).index(part)])
    base = root / part
    for i in range(n_train):
        _save(base / "train" / "good" / f"{i:03d}.png", good_frame(part, rng))
    for i in range(n_test_good):
        _save(base / "test" / "good" / f"{i:03d}.png", good_frame(part, rng))
    labels: dict[str, dict] = {}
    for kind in PARTS[part][1]:
        i = 0
        for severity in (1, 2, 3):
            for _ in range(per_severity):
                frame, mask = defect_frame(part, kind, severity, rng)
                _save(base / "test" / kind / f"{i:03d}.png", frame)
                _save(base / "ground_truth" / kind / f"{i:03d}_mask.png", mask)
                labels[f"test/{kind}/{i:03d}.png"] = {"kind": kind, "severity": severity, "box": _box(mask)}
                i += 1
    (base / "defects.json").write_text(json.dumps(labels, indent=1) + "\n")
    return {"train": n_train, "test_good": n_test_good, "defects": len(labels), "kinds": list(PARTS[part][1])}


def write_sample_set(
    root: str | Path,
    parts: list[str] | None = None,
    seed: int = 0,
    n_train: int = 30,
    n_test_good: int = 15,
    per_severity: int = 2,
) -> dict:
    """Writes the sample set under `root` (MVTec layout, see the module doc); returns {part: counts}."""
    chosen = parts or list(PARTS)
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        from edgeinspect.errors import InvalidInput

        raise InvalidInput(f"unknown sample part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    root = Path(root)
    return {p: write_part(root, p, seed, n_train, n_test_good, per_severity) for p in chosen}


def sample_cache_dir() -> Path:
    base = os.environ.get("EDGEINSPECT_SAMPLE_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "edgeinspect" / "anomaly-sample"


def cached_sample_set(seed: int = 0) -> Path:
    """The full default sample set for `seed`, generated once per generator version and reused (tests, bench)."""
    return cached_set(
        sample_cache_dir() / f"v{GENERATOR_VERSION}-seed{seed}", lambda tmp: write_sample_set(tmp, seed=seed)
    )


def cached_set(final: Path, write: Callable[[Path], dict]) -> Path:
    """`final`, written once by write(folder) -> summary and reused: written to a temporary sibling and renamed into
    place, so a concurrent or interrupted run never leaves a half-written set behind that a later run would trust."""
    if (final / "COMPLETE").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        summary = write(tmp)
        (tmp / "COMPLETE").write_text(json.dumps(summary) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first: theirs is as good as ours
            if not (final / "COMPLETE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
