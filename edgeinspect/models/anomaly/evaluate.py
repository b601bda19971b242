"""Measures a taught bank on a labelled folder in the MVTec AD layout (see sample.py for the layout).

Figures: image AUROC (rank based, ties shared), pixel AUROC (every test pixel that has a mask, good frames counting as
all-good), escape (defective frames the gate calls OK) and overkill (good frames it flags) at the bank's own
threshold with Wilson 95% intervals, and an operating point chosen on these labelled frames for a target escape rate.
UNCERTAIN counts as flagged: such a frame goes on to the VLM, so the gate did not let it pass.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edgeinspect.errors import InvalidInput, NotFound

PIXEL_GRID = 256  # pixel AUROC on frames scaled to at most this long side: a 5 MP camera would rank millions of pixels
Z95 = 1.959964  # two-sided 95% normal quantile
# A defect counts as located when the heatmap's hottest pixel lies within this fraction of the frame's side of its
# mask: about one stride-16 feature cell, the resolution the heatmap has before it is upsampled.
LOCATE_FRACTION = 0.06


@dataclass
class Rate:
    """k of n, with its Wilson 95% interval (sound at k=0 and for small n, unlike the normal approximation)."""

    k: int
    n: int
    rate: float
    lo: float
    hi: float


def wilson(k: int, n: int, z: float = Z95) -> Rate:
    if n == 0:
        return Rate(0, 0, 0.0, 0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Rate(k, n, p, max(0.0, centre - half), min(1.0, centre + half))


def auroc(negatives: np.ndarray, positives: np.ndarray) -> float:
    """P(positive scores above negative) + half P(tie): the Mann-Whitney U statistic, ranks averaged over ties."""
    neg, pos = np.asarray(negatives, np.float64).ravel(), np.asarray(positives, np.float64).ravel()
    if len(neg) == 0 or len(pos) == 0:
        return float("nan")
    values = np.concatenate([neg, pos])  # [N]
    uniq, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)  # 1-based rank of each distinct value's last copy
    mean_rank = (upper - (counts - 1) / 2.0)[inverse]  # [N] tied values share their average rank
    u = mean_rank[len(neg) :].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(neg) * len(pos)))


def roc_curve(negatives: np.ndarray, positives: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate, threshold) with a frame flagged when score >= threshold."""
    scores = np.concatenate([negatives, positives]).astype(np.float64)
    labels = np.concatenate([np.zeros(len(negatives)), np.ones(len(positives))])
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    last = np.r_[np.nonzero(np.diff(scores))[0], len(scores) - 1]  # the end of each group of tied scores
    tpr = np.r_[0.0, np.cumsum(labels)[last] / max(1, len(positives))]
    fpr = np.r_[0.0, np.cumsum(1 - labels)[last] / max(1, len(negatives))]
    return fpr, tpr, np.r_[np.inf, scores[last]]


def operating_point(good: np.ndarray, defect: np.ndarray, target_escape: float) -> dict:
    """The highest threshold (fewest false alarms) at which at most `target_escape` of the defects pass as OK."""
    if len(defect) == 0:
        return {"target_escape": target_escape, "threshold": None, "escape": None, "overkill": None}
    ranked = np.sort(defect)
    allowed = int(math.floor(target_escape * len(ranked) + 1e-9))  # defects allowed under the threshold
    threshold = float(ranked[min(allowed, len(ranked) - 1)])
    return {
        "target_escape": target_escape,
        "threshold": threshold,
        "escape": float(np.mean(defect < threshold)),
        "overkill": float(np.mean(good >= threshold)) if len(good) else None,
    }


@dataclass
class Miss:
    file: str
    kind: str
    severity: int | None
    score: float


@dataclass
class Sample:
    """One labelled test frame as eval reads it."""

    file: str  # relative to the part folder, e.g. test/scratch/000.png
    kind: str  # "good" or the defect kind
    severity: int | None
    mask: Path | None


@dataclass
class EvalResult:
    part: str
    bank_id: str
    fingerprint: str
    threshold: float
    n_good: int
    n_defect: int
    image_auroc: float
    pixel_auroc: float | None  # None: no ground-truth masks
    escape: Rate
    overkill: Rate
    operating: dict
    misses: list[Miss]
    false_alarms: list[str]
    by_kind: dict[str, dict[str, int]]  # kind -> {"n", "caught"}
    by_severity: dict[str, dict[str, int]]  # "1".."3" -> {"n", "caught"}
    ms_per_frame: float
    scores: dict[str, float] = field(default_factory=dict)  # file -> image score
    located: dict[str, bool] = field(default_factory=dict)  # defect file with a mask -> heatmap peak on it

    def roc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        good = np.array([s for f, s in self.scores.items() if f.startswith("test/good/")])
        bad = np.array([s for f, s in self.scores.items() if not f.startswith("test/good/")])
        return roc_curve(good, bad)

    def to_json(self) -> dict:
        """The machine form: rates are fractions 0..1, intervals are [lo, hi]."""
        return {
            "part": self.part,
            "bank_id": self.bank_id,
            "fingerprint": self.fingerprint,
            "image_auroc": _round(self.image_auroc),
            "pixel_auroc": _round(self.pixel_auroc),
            "escape": _round(self.escape.rate),
            "escape_ci95": [_round(self.escape.lo), _round(self.escape.hi)],
            "overkill": _round(self.overkill.rate),
            "overkill_ci95": [_round(self.overkill.lo), _round(self.overkill.hi)],
            "threshold": _round(self.threshold),
            "n_good": self.n_good,
            "n_defect": self.n_defect,
            "escaped": self.escape.k,
            "flagged_good": self.overkill.k,
            "operating_point": {k: _round(v) if isinstance(v, float) else v for k, v in self.operating.items()},
            "misses": [asdict(m) | {"score": _round(m.score)} for m in self.misses],
            "false_alarms": self.false_alarms,
            "by_kind": self.by_kind,
            "by_severity": self.by_severity,
            "located": {"k": sum(self.located.values()), "n": len(self.located)},
            "ms_per_frame": round(self.ms_per_frame, 2),
        }


def _round(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def list_samples(part_dir: Path) -> list[Sample]:
    """test/good and test/<kind> frames with their masks (ground_truth/<kind>/<stem>_mask.png) and severities."""
    test = part_dir / "test"
    if not test.is_dir():
        raise NotFound(f"{test}: no test folder (expected the MVTec layout PART/test/<good|kind>/*.png)")
    labels_file = part_dir / "defects.json"
    labels = json.loads(labels_file.read_text()) if labels_file.is_file() else {}
    samples = []
    for kind_dir in sorted(p for p in test.iterdir() if p.is_dir()):
        kind = kind_dir.name
        for frame in sorted(p for p in kind_dir.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp")):
            rel = f"test/{kind}/{frame.name}"
            mask = part_dir / "ground_truth" / kind / f"{frame.stem}_mask.png"
            severity = labels.get(rel, {}).get("severity")
            samples.append(Sample(rel, kind, severity, mask if kind != "good" and mask.is_file() else None))
    if not any(s.kind == "good" for s in samples) or all(s.kind == "good" for s in samples):
        raise InvalidInput(f"{test}: eval needs both test/good frames and at least one test/<defect kind> folder")
    return samples


def read_mask(path: Path, frame_shape: tuple[int, int], frame_file: str) -> np.ndarray:
    """A ground-truth mask as [H, W] bool; refuses one whose size differs from its frame's."""
    import cv2

    mask = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    if mask is None:
        raise InvalidInput(f"{path}: not a readable mask image")
    if mask.shape != frame_shape:
        raise InvalidInput(
            f"{path}: mask is {mask.shape[1]}x{mask.shape[0]} but its frame {frame_file} is "
            f"{frame_shape[1]}x{frame_shape[0]}; a mask must match its frame's size"
        )
    return mask > 127


def grid_size(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """cv2's (width, height) of a frame [H, W] scaled to at most PIXEL_GRID on the long side; None: no scaling."""
    h, w = shape[:2]
    scale = PIXEL_GRID / max(h, w)
    return (max(1, round(w * scale)), max(1, round(h * scale))) if scale < 1 else None


def grid_mask(mask: np.ndarray) -> np.ndarray:
    """A mask [H, W] bool at the pixel-AUROC grid [h, w]."""
    import cv2

    size = grid_size(mask.shape)
    if size is None:
        return mask
    # A cell counts as defective when a quarter of it is: thin cracks must not vanish in the scaling.
    return cv2.resize(mask.astype(np.float32), size, interpolation=cv2.INTER_AREA) >= 0.25


def pixel_auroc(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> float | None:
    """Pixel AUROC over (scores [h, w], labels [h, w] bool) pairs at the pixel grid; None with no pair."""
    if not pairs:
        return None
    scores = np.concatenate([s.ravel() for s, _ in pairs])
    labels = np.concatenate([m.ravel() for _, m in pairs])
    return auroc(scores[~labels], scores[labels])


def read_frame(path: Path) -> np.ndarray:
    """One frame file -> [H, W, 3] RGB uint8, under the same size limits as a teach frame (teach.load_frames)."""
    from edgeinspect.models.anomaly.teach import MAX_FRAME_BYTES, MAX_FRAME_PIXELS
    from edgeinspect.models.image_io import decode_image

    size = path.stat().st_size
    if size > MAX_FRAME_BYTES:
        raise InvalidInput(f"{path}: {size} bytes, over the {MAX_FRAME_BYTES} byte limit for a frame")
    try:
        image = decode_image(path.read_bytes(), MAX_FRAME_BYTES, MAX_FRAME_PIXELS)
    except InvalidInput as exc:
        raise InvalidInput(f"{path}: {exc}") from exc
    return np.asarray(image, dtype=np.uint8)


def evaluate(
    part_dir: str | Path,
    scorer,
    load: Callable[[Path], np.ndarray] = read_frame,
    target_escape: float = 0.05,
    batch: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Scores every test frame of one part with `scorer` (a scoring.Scorer) and returns the figures.

    `load` reads one frame file into [H, W, 3] RGB uint8 (the caller's loader, with its size and format limits)."""
    import time

    part_dir = Path(part_dir)
    samples = list_samples(part_dir)
    # Masks are checked against their frames before any scoring: a bad set fails in seconds, not after the run.
    masks: dict[str, np.ndarray] = {}
    frames: list[np.ndarray] = []
    for s in samples:
        frame = load(part_dir / s.file)  # [H, W, 3] uint8
        frames.append(frame)
        if s.mask is not None:
            masks[s.file] = read_mask(s.mask, frame.shape[:2], s.file)
    results = []
    t0 = time.perf_counter()
    for i in range(0, len(frames), batch):
        results += scorer.score(frames[i : i + batch])
        if progress:
            progress(min(i + batch, len(frames)), len(frames))
    ms = (time.perf_counter() - t0) * 1e3 / max(1, len(frames))
    return _figures(part_dir.name, samples, frames, masks, results, target_escape, ms)


def _figures(part, samples: Sequence[Sample], frames, masks, results, target_escape: float, ms: float) -> EvalResult:
    good_idx = [i for i, s in enumerate(samples) if s.kind == "good"]
    bad_idx = [i for i, s in enumerate(samples) if s.kind != "good"]
    scores = np.array([r.score for r in results], np.float64)  # [N]
    flagged = np.array([r.verdict != "OK" for r in results])  # UNCERTAIN goes to the VLM: not a pass

    from edgeinspect.models.anomaly.scoring import pixel_grid

    pairs = []
    if masks:
        for i, s in enumerate(samples):
            if s.kind == "good" or s.file in masks:
                truth = masks.get(s.file, np.zeros(frames[i].shape[:2], bool))
                pairs.append((pixel_grid(np.asarray(results[i].heatmap, np.float32)), grid_mask(truth)))

    by_kind: dict[str, dict[str, int]] = {}
    by_severity: dict[str, dict[str, int]] = {}
    for i in bad_idx:
        s = samples[i]
        for table, key in ((by_kind, s.kind), (by_severity, str(s.severity) if s.severity else "?")):
            row = table.setdefault(key, {"n": 0, "caught": 0})
            row["n"] += 1
            row["caught"] += int(flagged[i])
    first = results[0]
    return EvalResult(
        part=part,
        bank_id=str(getattr(first, "bank_id", "")),
        fingerprint=str(getattr(first, "fingerprint", "")),
        threshold=float(first.threshold),
        n_good=len(good_idx),
        n_defect=len(bad_idx),
        image_auroc=auroc(scores[good_idx], scores[bad_idx]),
        pixel_auroc=pixel_auroc(pairs),
        escape=wilson(int((~flagged[bad_idx]).sum()), len(bad_idx)),
        overkill=wilson(int(flagged[good_idx].sum()), len(good_idx)),
        operating=operating_point(scores[good_idx], scores[bad_idx], target_escape),
        misses=[
            Miss(samples[i].file, samples[i].kind, samples[i].severity, float(scores[i]))
            for i in bad_idx
            if not flagged[i]
        ],
        false_alarms=[samples[i].file for i in good_idx if flagged[i]],
        by_kind=by_kind,
        by_severity=dict(sorted(by_severity.items())),
        ms_per_frame=ms,
        scores={s.file: float(scores[i]) for i, s in enumerate(samples)},
        located={
            samples[i].file: _peak_on(results[i].heatmap, masks[samples[i].file])
            for i in bad_idx
            if samples[i].file in masks
        },
    )


def _peak_on(heatmap: np.ndarray, mask: np.ndarray) -> bool:
    """Whether the heatmap's hottest pixel lies on the mask, or within LOCATE_FRACTION of the frame's side of it."""
    y, x = np.unravel_index(int(np.argmax(heatmap)), heatmap.shape)
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return False
    tolerance = LOCATE_FRACTION * max(mask.shape)
    return bool(np.min((ys - y) ** 2 + (xs - x) ** 2) <= tolerance**2)


@dataclass(frozen=True)
class RocCurve:
    """One curve of a ROC picture: its legend label, the curve, and the operating point to mark on it."""

    label: str
    fpr: np.ndarray  # [K]
    tpr: np.ndarray  # [K]
    point: tuple[float, float]  # (overkill, 1 - escape) at the threshold in use


def roc_png(results: Sequence[EvalResult], path: str | Path) -> Path:
    """One ROC curve per part, with the bank's threshold marked on each; written as a PNG (Agg, no display)."""
    curves = []
    for r in results:
        fpr, tpr, _ = r.roc()
        curves.append(RocCurve(f"{r.part} (AUROC {r.image_auroc:.3f})", fpr, tpr, (r.overkill.rate, 1 - r.escape.rate)))
    return draw_roc(curves, path, "anomaly gate ROC (dot: the bank's threshold)")


def draw_roc(curves: Sequence[RocCurve], path: str | Path, title: str) -> Path:
    """ROC curves with their operating points as one PNG (Agg, no display); offline eval and `edgeinspect eval`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    for c in curves:
        ax.plot(c.fpr, c.tpr, label=c.label)
        ax.plot([c.point[0]], [c.point[1]], "o", color=ax.lines[-1].get_color())
    ax.plot([0, 1], [0, 1], ":", color="grey", linewidth=0.8)
    ax.set(xlabel="overkill (good frames flagged)", ylabel="1 - escape (defects flagged)", xlim=(-0.02, 1.02))
    ax.set(ylim=(-0.02, 1.02), title=title)
    ax.legend(loc="lower right", fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
