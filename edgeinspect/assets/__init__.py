"""Sample media shipped with the package (made by tools/make_samples.py): part stills, a conveyor video, and
the ingest config that replays the video."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent


def asset_path(name: str) -> Path:
    """The path of a packaged asset; FileNotFoundError names the ones that exist when `name` is not one."""
    path = ASSETS_DIR / name
    if not path.is_file() or path.suffix == ".py":
        known = sorted(p.name for p in ASSETS_DIR.iterdir() if p.is_file() and p.suffix != ".py")
        raise FileNotFoundError(f"no asset {name!r} in {ASSETS_DIR}; available: {', '.join(known)}")
    return path


def sample_image() -> Path:
    """A still of a die-cast housing with a visible scratch (640x480 JPEG)."""
    return asset_path("part_scratch.jpg")
