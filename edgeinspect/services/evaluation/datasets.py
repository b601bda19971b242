"""Labelled image sets -> Samples. Three layouts: the MVTec AD convention (`<part>/test/good/*.png`,
`<part>/test/<defect_type>/*.png`), a CSV manifest (path,label,classes), and operator reviews stored by the
gateway (reviewed reports become labels: see reviews.py)."""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgeinspect.errors import InvalidInput

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp"})
GOOD, DEFECT = "good", "defect"
_LABEL_WORDS = {
    "good": GOOD,
    "ok": GOOD,
    "pass": GOOD,
    "defect": DEFECT,
    "defective": DEFECT,
    "bad": DEFECT,
    "ng": DEFECT,
    "fail": DEFECT,
}


@dataclass(frozen=True)
class Sample:
    """One labelled frame. `rel` is its path relative to the dataset root: with the content hash it keys results."""

    path: Path
    rel: str
    label: str  # GOOD | DEFECT
    classes: tuple[str, ...]  # true defect classes (normalised), empty for good parts
    part: str

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def normalise_class(name: str, class_map: Mapping[str, str] | None = None) -> str:
    """`Missing_Hole`, `missing-hole` and `missing hole` are one class; a class map renames folder names to the
    spec's class names (`missing hole` -> `missing feature`)."""
    norm = " ".join(name.replace("_", " ").replace("-", " ").lower().split())
    if class_map:
        norm = class_map.get(norm, norm)
    return norm


def parse_class_map(pairs: Iterable[str]) -> dict[str, str]:
    """`dataset name=spec name` pairs (CLI --class-map) -> a normalised mapping."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise InvalidInput(
                f"--class-map {pair!r}: write DATASET_CLASS=SPEC_CLASS, e.g. missing_hole=missing feature"
            )
        src, dst = pair.split("=", 1)
        out[normalise_class(src)] = normalise_class(dst)
    return out


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _mvtec_parts(root: Path, part: str) -> list[Path]:
    if (root / "test").is_dir():  # DATASET is one part's folder
        if part and part != root.name:
            raise InvalidInput(f"{root} holds part {root.name!r}, not {part!r}")
        return [root]
    if part:
        if not (root / part / "test").is_dir():
            known = sorted(p.name for p in root.iterdir() if (p / "test").is_dir())
            raise InvalidInput(f"no {part}/test folder in {root}; parts there: {', '.join(known) or 'none'}")
        return [root / part]
    return sorted(p for p in root.iterdir() if (p / "test").is_dir())


def load_mvtec(root: Path, part: str = "", class_map: Mapping[str, str] | None = None) -> list[Sample]:
    """`<part>/test/good/*` are good parts, `<part>/test/<defect_type>/*` defective ones of that class. DATASET is
    the folder holding the parts (`--part` picks one) or one part's folder."""
    samples = []
    for part_dir in _mvtec_parts(root, part):
        for cls_dir in sorted(p for p in (part_dir / "test").iterdir() if p.is_dir()):
            good = cls_dir.name == GOOD
            classes = () if good else (normalise_class(cls_dir.name, class_map),)
            for img in _images(cls_dir):
                samples.append(
                    Sample(img, img.relative_to(root).as_posix(), GOOD if good else DEFECT, classes, part_dir.name)
                )
    if not samples:
        raise InvalidInput(f"no images found in the MVTec layout under {root} (<part>/test/good/*.png, ...)")
    return samples


def load_manifest(csv_path: Path, part: str = "", class_map: Mapping[str, str] | None = None) -> list[Sample]:
    """A CSV with a header `path,label,classes` (and optionally `part`): paths relative to the CSV's folder, label
    good/ok or defect/ng, classes separated by `;` or `|`. `--part` keeps the rows of one part (and names it)."""
    root = csv_path.parent
    samples = []
    with csv_path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"path", "label"} - set(reader.fieldnames or [])
        if missing:
            raise InvalidInput(f"{csv_path}: the header needs the columns path,label[,classes][,part]")
        for line, row in enumerate(reader, start=2):
            label = _LABEL_WORDS.get((row.get("label") or "").strip().lower())
            if label is None:
                raise InvalidInput(f"{csv_path}:{line}: label {row.get('label')!r} is neither good/ok nor defect/ng")
            raw = (row.get("classes") or "").replace("|", ";")
            classes = tuple(sorted({normalise_class(c, class_map) for c in raw.split(";") if c.strip()}))
            if label == GOOD and classes:
                raise InvalidInput(f"{csv_path}:{line}: a good part cannot carry defect classes {list(classes)}")
            row_part = (row.get("part") or "").strip()
            if part and row_part and row_part != part:
                continue
            path = (root / row["path"].strip()).resolve()
            if not path.is_file():
                raise InvalidInput(f"{csv_path}:{line}: no image at {row['path']!r}")
            samples.append(Sample(path, row["path"].strip(), label, classes, row_part or part))
    if not samples:
        raise InvalidInput(f"{csv_path}: no rows" + (f" for part {part!r}" if part else ""))
    return samples


def load_dataset(dataset: Path, part: str = "", class_map: Mapping[str, str] | None = None) -> tuple[str, list[Sample]]:
    """(layout name, samples) for a folder (MVTec) or a .csv manifest."""
    if dataset.is_file() and dataset.suffix.lower() == ".csv":
        return "manifest", load_manifest(dataset, part, class_map)
    if dataset.is_dir():
        return "mvtec", load_mvtec(dataset, part, class_map)
    raise InvalidInput(f"{dataset}: expected an MVTec-layout folder or a .csv manifest")
