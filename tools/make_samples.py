"""Generates the project's sample media into edgeinspect/assets/: four still images of a die-cast housing (OK,
scratch, dent, missing hole), a conveyor video with parts passing and gaps of static belt between them, and a
picture of the empty belt (the change gate's background).

Seeded and deterministic: running it twice gives the same pixels (the JPEG/MPEG-4 encoders are deterministic
for the same OpenCV build). Run: .venv/bin/python tools/make_samples.py [--out DIR]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

ASSETS = Path(__file__).resolve().parents[1] / "edgeinspect" / "assets"
SEED = 20240611

STILL_SIZE = (640, 480)  # (w, h)
VIDEO_SIZE = (640, 360)
VIDEO_FPS = 10
VIDEO_SECONDS = 20
JPEG_QUALITY = 88


@dataclass(frozen=True)
class Defects:
    scratch: bool = False
    dent: bool = False
    missing_hole: bool = False


def smooth_noise(rng: np.random.Generator, h: int, w: int, scale: int) -> np.ndarray:
    """Low-frequency noise in [-1, 1]: random grid upsampled, the look of cast metal and worn belt rubber."""
    grid = rng.standard_normal((max(2, h // scale), max(2, w // scale))).astype(np.float32)
    up = cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
    return np.clip(up / 2.5, -1.0, 1.0)


def belt_texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Dark rubber belt with lengthwise wear and faint cross seams: [h, w, 3] float32 in 0..255."""
    base = 58.0 + 6.0 * smooth_noise(rng, h, w, 24) + 3.0 * rng.standard_normal((h, w)).astype(np.float32)
    # Wear streaks run along the travel direction (x), so they are constant in x with some fading.
    streaks = rng.standard_normal(h).astype(np.float32)
    streaks = cv2.GaussianBlur(streaks.reshape(-1, 1), (1, 5), 0).reshape(-1)
    base += 4.0 * streaks[:, None]
    for x in range(0, w, 173):  # belt splice seams every ~173 px
        base[:, x : x + 2] -= 12.0
    belt = np.stack([base * 0.97, base, base * 1.03], axis=-1)  # slightly cool grey
    return belt


def render_part(rng: np.random.Generator, width: int, defects: Defects) -> tuple[np.ndarray, np.ndarray]:
    """A top-down die-cast aluminium housing: BGR float32 [h, w, 3] and alpha float32 [h, w], h = 0.7 * w."""
    w, h = width, int(width * 0.7)
    s = width / 300.0  # all geometry is drawn for a 300 px wide part and scaled
    mask = np.zeros((h, w), np.uint8)
    r = int(28 * s)
    cv2.rectangle(mask, (r, 0), (w - 1 - r, h - 1), 255, -1)
    cv2.rectangle(mask, (0, r), (w - 1, h - 1 - r), 255, -1)
    for cx, cy in [(r, r), (w - 1 - r, r), (r, h - 1 - r), (w - 1 - r, h - 1 - r)]:
        cv2.circle(mask, (cx, cy), r, 255, -1, cv2.LINE_AA)

    # Cast aluminium: light grey, mottled, brighter towards the top-left light.
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    shade = 168.0 + 10.0 * smooth_noise(rng, h, w, int(12 * s) + 1) + 4.0 * rng.standard_normal((h, w))
    shade += 18.0 * (1.0 - (xx / w + yy / h) / 2.0)
    # Chamfered rim: a darker band inside the outline.
    dist = cv2.distanceTransform((mask > 0).astype(np.uint8), cv2.DIST_L2, 5)
    shade -= 30.0 * np.clip(1.0 - dist / (7.0 * s), 0.0, 1.0)
    # Recessed pocket in the middle with two ribs across it.
    pocket = np.zeros((h, w), np.uint8)
    cv2.rectangle(pocket, (int(70 * s), int(45 * s)), (w - int(70 * s), h - int(45 * s)), 255, -1)
    shade[pocket > 0] -= 22.0
    for rx in (int(125 * s), int(175 * s)):
        cv2.rectangle(shade, (rx, int(45 * s)), (rx + int(6 * s), h - int(45 * s)), 190.0, -1)

    holes = np.zeros((h, w), np.uint8)
    boss_centres = [
        (int(36 * s), int(36 * s)),
        (w - int(36 * s), int(36 * s)),
        (int(36 * s), h - int(36 * s)),
        (w - int(36 * s), h - int(36 * s)),
    ]
    for i, (cx, cy) in enumerate(boss_centres):
        # Raised boss: a bright ring with a shadowed lower-right side.
        cv2.circle(shade, (cx + int(2 * s), cy + int(2 * s)), int(17 * s), 130.0, -1, cv2.LINE_AA)
        cv2.circle(shade, (cx, cy), int(16 * s), 205.0, -1, cv2.LINE_AA)
        if defects.missing_hole and i == 3:
            continue  # the boss is cast but never drilled: solid metal where the hole should be
        cv2.circle(holes, (cx, cy), int(8 * s), 255, -1, cv2.LINE_AA)
    # Central bore.
    cv2.circle(shade, (w // 2, h // 2), int(26 * s), 200.0, -1, cv2.LINE_AA)
    cv2.circle(holes, (w // 2, h // 2), int(15 * s), 255, -1, cv2.LINE_AA)
    shade[holes > 0] = 25.0  # through-holes look black from above

    if defects.scratch:
        # A thin bright gouge with a dark edge, slightly curved, across the top face.
        x0, y0 = int(80 * s), int(150 * s)
        t = np.linspace(0, 1, 24)
        xs, ys = x0 + t * 150 * s, y0 - (t * 95 * s + 10 * s * np.sin(t * 3.0))
        pts = np.stack([xs, ys], axis=1).astype(np.int32)
        cv2.polylines(shade, [pts + [0, 2]], False, 110.0, max(1, int(2 * s)), cv2.LINE_AA)
        cv2.polylines(shade, [pts], False, 245.0, max(1, int(1.5 * s)), cv2.LINE_AA)
    if defects.dent:
        # A shallow dent: shading gradient dark on the lit side, bright on the far side (light from top-left).
        cx, cy, rad = int(215 * s), int(158 * s), 27.0 * s
        d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        inside = np.clip(1.0 - d / rad, 0.0, 1.0)
        slope = ((xx - cx) + (yy - cy)) / rad
        shade += 90.0 * np.sqrt(inside) * slope - 35.0 * inside

    shade = np.clip(shade, 0, 255)
    bgr = np.stack([shade * 1.01, shade, shade * 0.985], axis=-1)  # aluminium: faintly blue
    alpha = cv2.GaussianBlur(mask.astype(np.float32) / 255.0, (3, 3), 0)
    alpha[holes > 0] = 0.25  # the belt shows faintly through the holes
    return bgr.astype(np.float32), alpha


def paste(scene: np.ndarray, img: np.ndarray | None, alpha: np.ndarray, x: int, y: int) -> None:
    """Blends `img` (or black, when None) into `scene` in place at (x, y) by `alpha`, clipped to the scene."""
    sh, sw = scene.shape[:2]
    ph, pw = alpha.shape
    sx0, sy0, sx1, sy1 = max(0, x), max(0, y), min(sw, x + pw), min(sh, y + ph)
    if sx1 <= sx0 or sy1 <= sy0:
        return
    a = alpha[sy0 - y : sy1 - y, sx0 - x : sx1 - x, None]
    region = scene[sy0:sy1, sx0:sx1]
    fill = 0.0 if img is None else img[sy0 - y : sy1 - y, sx0 - x : sx1 - x]
    region[:] = region * (1.0 - a) + fill * a


def composite(scene: np.ndarray, part: np.ndarray, alpha: np.ndarray, x: int, y: int) -> None:
    """Puts a part on the belt at (x, y) with a soft drop shadow (light from the top-left)."""
    paste(scene, None, cv2.GaussianBlur(alpha, (21, 21), 0) * 0.55, x + 6, y + 8)
    paste(scene, part, alpha, x, y)


def lighting(h: int, w: int) -> np.ndarray:
    """Fixed overhead lighting: brighter centre-left, falling off to the right and the edges ([h, w, 1])."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    d = np.sqrt(((xx - 0.4 * w) / w) ** 2 + ((yy - 0.45 * h) / h) ** 2)
    return (1.12 - 0.55 * d)[..., None]


def finish(scene: np.ndarray, light: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Applies lighting and sensor noise, returns uint8 BGR."""
    out = scene * light + rng.normal(0.0, 2.5, scene.shape).astype(np.float32)
    return np.clip(out, 0, 255).astype(np.uint8)


STILLS = {
    "part_ok.jpg": Defects(),
    "part_scratch.jpg": Defects(scratch=True),
    "part_dent.jpg": Defects(dent=True),
    "part_missing_hole.jpg": Defects(missing_hole=True),
}


def make_stills(out: Path) -> list[Path]:
    w, h = STILL_SIZE
    light = lighting(h, w)
    written = []
    for i, (name, defects) in enumerate(STILLS.items()):
        rng = np.random.default_rng(SEED + i)
        scene = belt_texture(np.random.default_rng(SEED), h, w + 64)[:, 32 : 32 + w].copy()
        part, alpha = render_part(np.random.default_rng(SEED + 100), 400, defects)
        # Parts sit slightly differently on the belt each time.
        x = (w - part.shape[1]) // 2 + int(rng.integers(-12, 13))
        y = (h - part.shape[0]) // 2 + int(rng.integers(-10, 11))
        composite(scene, part, alpha, x, y)
        path = out / name
        cv2.imwrite(str(path), finish(scene, light, rng), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        written.append(path)
    return written


# The video: each part rides in (belt moving), stops under the camera, rides out; then the belt stands empty.
VIDEO_PARTS = [
    Defects(),
    Defects(scratch=True),
    Defects(),
    Defects(dent=True),
    Defects(missing_hole=True),
]
ENTER, DWELL, EXIT, GAP = 8, 12, 8, 12  # frames per phase; 40 frames = 4 s per part, 5 parts = 20 s


def belt_positions() -> list[tuple[int | None, float]]:
    """Per frame: (index of the part on the belt or None, its progress 0..1 from entering to leaving)."""
    frames: list[tuple[int | None, float]] = []
    for i in range(len(VIDEO_PARTS)):
        for f in range(ENTER):
            frames.append((i, 0.5 * (f + 1) / ENTER))
        frames += [(i, 0.5)] * DWELL
        for f in range(EXIT):
            frames.append((i, 0.5 + 0.5 * (f + 1) / EXIT))
        frames += [(None, 0.0)] * GAP
    return frames


def make_video(out: Path) -> Path:
    w, h = VIDEO_SIZE
    light = lighting(h, w)
    part_w = 260
    travel = w + part_w  # from fully left of the frame to fully right of it
    belt_len = w + travel * len(VIDEO_PARTS) + 8  # enough texture for the whole run, no wrap-around
    belt = belt_texture(np.random.default_rng(SEED), h, belt_len)
    sprites = [render_part(np.random.default_rng(SEED + 100), part_w, d) for d in VIDEO_PARTS]
    rng = np.random.default_rng(SEED + 7)
    path = out / "conveyor.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), VIDEO_FPS, (w, h))
    if not writer.isOpened():
        raise RuntimeError("OpenCV could not open an mp4v VideoWriter (FFmpeg backend missing?)")
    belt_offset = 0
    prev_x = None
    try:
        for idx, progress in belt_positions():
            if idx is None:
                prev_x = None  # belt stands still between parts: identical frames up to sensor noise
                x = None
            else:
                x = int(-part_w + progress * travel)
                if prev_x is not None:
                    belt_offset += x - prev_x
                prev_x = x
            # The belt moves right with the part: the visible window slides left along the texture.
            start = belt_len - w - belt_offset
            scene = belt[:, start : start + w].copy()
            if x is not None:
                part, alpha = sprites[idx]
                composite(scene, part, alpha, x, (h - part.shape[0]) // 2)
            writer.write(finish(scene, light, rng))
    finally:
        writer.release()
    # The empty station, for change gating's background: frames that look like this hold no part.
    empty = belt[:, belt_len - 2 * w : belt_len - w].copy()
    cv2.imwrite(str(out / "conveyor_empty.jpg"), finish(empty, light, rng), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSETS, help="output folder (default: the package's)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for p in [*make_stills(args.out), make_video(args.out), args.out / "conveyor_empty.jpg"]:
        print(f"{p}  {p.stat().st_size / 1024:.0f} kB")


if __name__ == "__main__":
    main()
