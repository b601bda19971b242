"""A generated MVTec-layout set of the sample part (tools/make_samples.py's renderer): good and defect folders."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFECT_TYPES = {"scratch": {"scratch": True}, "dent": {"dent": True}, "missing_hole": {"missing_hole": True}}


def _make_samples():
    # run_path (not an import): tools/ is not a package, and the module must not shadow anything on sys.path.
    return SimpleNamespace(**runpy.run_path(str(ROOT / "tools" / "make_samples.py"), run_name="make_samples"))


def make_mvtec_set(root: Path, part: str = "HSG-210", good: int = 4, per_defect: int = 2) -> Path:
    """root/<part>/test/{good,scratch,dent,missing_hole}/NNN.png (320x240), each a differently placed part;
    also root/<part>/train/good (unused by eval, as in MVTec). Returns root."""
    ms = _make_samples()
    w, h = 320, 240
    light = ms.lighting(h, w)
    belt = ms.belt_texture(np.random.default_rng(ms.SEED), h, w + 64)
    folders = {"good": ms.Defects(), **{name: ms.Defects(**kw) for name, kw in DEFECT_TYPES.items()}}
    for k, (name, defects) in enumerate(folders.items()):
        out = root / part / "test" / name
        out.mkdir(parents=True, exist_ok=True)
        sprite, alpha = ms.render_part(np.random.default_rng(ms.SEED + 100), 200, defects)
        for i in range(good if name == "good" else per_defect):
            rng = np.random.default_rng(1000 * k + i)
            scene = belt[:, 32 : 32 + w].copy()
            x = (w - sprite.shape[1]) // 2 + int(rng.integers(-20, 21))
            y = (h - sprite.shape[0]) // 2 + int(rng.integers(-15, 16))
            ms.composite(scene, sprite, alpha, x, y)
            cv2.imwrite(str(out / f"{i:03d}.png"), ms.finish(scene, light, rng))
    (root / part / "train" / "good").mkdir(parents=True, exist_ok=True)
    return root
