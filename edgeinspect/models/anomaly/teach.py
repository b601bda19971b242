"""Good frames -> a bank: patch features, coreset, and a threshold calibrated on the good frames alone."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np

from edgeinspect.errors import InvalidInput
from edgeinspect.models.anomaly.bank import Bank, check_part
from edgeinspect.models.anomaly.coreset import greedy_coreset
from edgeinspect.models.anomaly.features import FeatureExtractor
from edgeinspect.models.anomaly.scoring import image_score
from edgeinspect.models.anomaly.tiles import DEFAULT_MAX_TILES, tiled_for
from edgeinspect.models.anomaly.whiten import SHRINKAGE, apply_whitening, fit_whitening
from edgeinspect.models.image_io import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, decode_image

# Measured 2026-12 on models/anomaly/sample.py's 4 parts (20 good teach frames, 10 good + 18 defective test frames
# each, efficientnet-lite0): mean image AUROC 0.971 (full bank) / 0.978 (25%) / 0.976 (10%) / 0.975 (5%) / 0.957
# (1%); escape 4% at 10% and above, 8% at 5%; kNN + heatmap 341 / 58 / 31 / 12 / 6 ms per frame (1 thread, busy
# 2-core box). 10% keeps AUROC within 0.01 of the full bank (DESIGN §8 found the same) and cuts kNN ~10x.
CORESET_RATIO = 0.10
# ... and at most this many patches: at 448 px a frame has 4x the patches of 224 px, and a 10% coreset of 30 frames
# (9400 patches) cost ~80 s of greedy picks and ~200 ms of kNN per frame on a busy 2-core box. 4096 patches keep
# kNN near 224 px's cost (1.9 MB at 120 channels); bench/anomaly_photos.py measures the greedy coreset's sizes.
MAX_BANK_PATCHES = 4096
# The largest leave-one-out score of N good frames is exceeded by the next good frame with probability 1/(N+1)
# (~3% at N = 30); 5% headroom above it absorbs lighting drift between the teach session and the line. Frames
# between the LOO maximum and threshold x (1 + MARGIN) are UNCERTAIN (they go to the VLM), not OK.
MARGIN = 0.05
# The border: the outer rings of a CNN's patch grid see its zero padding. On a periodic texture (the sample set's
# mesh) those edge patches are unlike any good patch of the same weave phase in 30 frames, and good frames scored
# highest there (mesh image AUROC 0.900, escapes from faint stains). Left out of the image score, the interior gives
# mesh 1.000. The gate then inspects the frame less its outer 2/28 per side at 224 px (7%): frame the camera with
# the part inside that margin, as PatchCore's resize-256 + centre-crop-224 does too. Each extractor names its own.
# The cut comes from held-out frames, not leave-one-out alone. Consecutive teach frames can share content (a surface
# photographed in overlapping views, a part that barely moves): leave-one-out then finds each frame's patches in its
# neighbours, and new good parts score above the LOO maximum. On real photographs (bench/anomaly_photos.py) the LOO
# cut flagged 17% of new good frames at 448 px; holding out a fifth of the set at a time (its patches taken out of
# the bank together), the cut sits where new frames fall. Folds are a seeded shuffle: the same set, the same cut.
HELD_OUT_FOLDS = 5
# Leave-one-out needs 2; the median/MAD outlier rule means little under 5. PatchCore-style banks want 20-30.
MIN_FRAMES = 5
# An outlier is far above the rest on both counts: modified z-score (Iglewicz & Hoaglin) over 3.5, and over
# 1.5x the median LOO score. The second guards a very uniform set (tiny MAD), where a good frame of a pose the
# others happen not to cover scores 20-40% above the median yet is exactly what the bank should learn.
OUTLIER_Z = 3.5
OUTLIER_RATIO = 1.5
# Frames are squashed to the extractor's square input: one aspect ratio per bank (2%), and none past 4:1.
ASPECT_TOLERANCE = 0.02
MAX_ASPECT = 4.0
# The vision node's default limits for an image sent to it, checked before any pixel is decoded.
MAX_FRAME_BYTES, MAX_FRAME_PIXELS = MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


class TeachError(InvalidInput):
    """A teach set the gate cannot learn from; the message tells a line engineer what to change."""

    code = "anomaly_teach_refused"


@dataclass
class Outlier:
    """A teach frame left out: it looks unlike the rest of the set (a defect, a wrong part, a bad shot)."""

    name: str
    score: float  # its leave-one-out score
    robust_z: float  # (score - median) / (1.4826 x MAD)


@dataclass
class TeachReport:
    """What teaching did: kept frames, outliers excluded, the LOO scores behind the threshold, timings."""

    part: str
    kept: list[str]
    outliers: list[Outlier]
    loo_scores: dict[str, float]  # kept frames, against the final bank without their own patches
    threshold: float
    band: tuple[float, float]
    margin: float
    coreset_ratio: float
    patches: int  # bank size (coreset)
    timings: dict = field(default_factory=dict)  # seconds: features, coreset_loo

    def summary(self) -> str:
        """A few lines for a person at the line."""
        lines = [f"part {self.part}: taught from {len(self.kept)} good frames, {self.patches} bank patches",
                 f"OK cut {self.band[0]:.4g} (the highest held-out good score): OK below it, UNCERTAIN up to "
                 f"{self.band[1]:.4g}, DEFECT above"]  # fmt: skip
        lines += [f"left out {o.name}: score {o.score:.4g}, {o.robust_z:.1f} MADs above the set's median "
                  "(a defect, another part or a bad shot? check it)" for o in self.outliers]  # fmt: skip
        return "\n".join(lines)


def frame_hash(frame: np.ndarray) -> str:
    """sha256 over a decoded frame's shape and pixels (the same frame hashes the same from any file format)."""
    h = hashlib.sha256(repr(frame.shape).encode())
    h.update(np.ascontiguousarray(frame).tobytes())
    return h.hexdigest()


def teach(
    frames: Sequence[tuple[str, np.ndarray]],
    extractor: FeatureExtractor,
    part: str,
    coreset_ratio: float = CORESET_RATIO,
    margin: float = MARGIN,
    min_frames: int = MIN_FRAMES,
    border: int | None = None,
    folds: int = HELD_OUT_FOLDS,
    max_patches: int = MAX_BANK_PATCHES,
    whiten: bool = True,
    vouched: Collection[str] = (),
    roi: Sequence[int] | None = None,
    scale: float | None = None,
    max_tiles: int = DEFAULT_MAX_TILES,
) -> tuple[Bank, TeachReport]:
    """(name, RGB uint8 frame) pairs of good parts -> an unpublished bank (version 0) and what teaching found.
    border: patch rings left out of the image score (None: the extractor's own; see "The border" above).
    folds: the cut is the highest score of frames held out a fold at a time (1: leave-one-out alone, as banks
    taught before 2026-12-07 were cut).
    whiten: fit whiten.py's whitening on the kept frames' patches; the bank stores it and scores in its units.
    max_patches: the coreset keeps coreset_ratio of the patches, at most this many (the bank records the ratio kept).
    vouched: names of frames a person declared good (the console's "add to good set"): never left out as outliers.
    roi, scale, max_tiles: where the part sits in the camera frame (x, y, width, height px) and the tiling of it
    (tiles.tiled_for: frames past 1.5x the input side, or any frame with a region, are tiled, not squashed)."""
    check_part(part)
    border = extractor.border if border is None else border
    blur = float(getattr(extractor, "blur", 0.0))
    min_frames = max(2, min_frames)
    if len(frames) < min_frames:
        raise TeachError(f"teaching part {part!r} needs at least {min_frames} good frames, got {len(frames)}: "
                         "photograph more good parts (20-30 is a good set)")  # fmt: skip
    if not 0.0 < coreset_ratio <= 1.0 or margin < 0:
        raise TeachError(f"coreset ratio must be in (0, 1] and margin >= 0 (got {coreset_ratio}, {margin})")
    names = [name for name, _ in frames]
    _check_frames(frames)
    extractor = tiled_for(extractor, frames[0][1].shape[:2], roi, scale, max_tiles)

    start = time.perf_counter()
    grid = extractor.extract([frame for _, frame in frames])  # [N, h, w, C]
    features_s = time.perf_counter() - start
    coreset_ratio = min(coreset_ratio, max_patches / (grid.shape[0] * grid.shape[1] * grid.shape[2]))
    if not 0 <= 2 * border < min(grid.shape[1:3]):
        raise TeachError(f"a border of {border} patch rings leaves nothing of the {grid.shape[1]}x{grid.shape[2]} "
                         "patch grid to inspect")  # fmt: skip
    raw = grid  # [N, h, w, C] as the extractor gives them

    def whitened(frames: list[int] | slice) -> tuple[np.ndarray, np.ndarray | None]:
        if not whiten:
            return raw[frames], None
        whitening = fit_whitening(raw[frames].reshape(-1, raw.shape[-1]))
        return apply_whitening(raw[frames], whitening), whitening

    grid, whitening = whitened(slice(None))
    loo, held, coreset = _calibration_scores(grid, coreset_ratio, border, blur, folds)
    outliers = [o for o in _outliers(names, loo) if o.name not in vouched]
    keep = [i for i, name in enumerate(names) if name not in {o.name for o in outliers}]
    if len(keep) < min_frames:
        raise TeachError(f"only {len(keep)} of {len(frames)} frames of part {part!r} look alike ({len(outliers)} "
                         f"outliers: {', '.join(o.name for o in outliers)}); need {min_frames}")  # fmt: skip
    if outliers:  # the threshold, the whitening and the bank come from the kept frames only
        kept_white, whitening = whitened(keep)
        grid = np.empty_like(grid)
        grid[keep] = kept_white
        loo, held, coreset = _calibration_scores(kept_white, coreset_ratio, border, blur, folds)
    kept_loo = loo  # [N_kept]
    coreset_s = time.perf_counter() - start - features_s

    top = float(max(kept_loo.max(), held.max()))
    threshold, band = cut_at(top, margin)
    n, h, w, c = grid.shape
    kept_grid = grid[keep].reshape(-1, c)  # [N_kept * h * w, C]
    timings = {"features_s": round(features_s, 3), "coreset_loo_s": round(coreset_s, 3)}
    med = float(np.median(kept_loo))
    stats = {
        "n_frames": n, "n_kept": len(keep), "outliers": [asdict(o) for o in outliers],
        "loo": {"min": float(kept_loo.min()), "median": med, "max": top,
                "mad": float(np.median(np.abs(kept_loo - med)))},
        "held_out": {"folds": min(folds, len(keep)), "median": float(np.median(held)), "max": float(held.max()),
                     "expected_overkill": _expected_overkill(len(keep))},
        "timings": timings, "margin": margin, "frame_size": list(frames[keep[0]][1].shape[:2]),
        "patches_taught": int(kept_grid.shape[0]),
        "whitening": {"shrinkage": SHRINKAGE} if whitening is not None else None,
        "tiles": int(getattr(extractor, "n_tiles", 1)),
    }  # fmt: skip
    bank = Bank(
        part=part, version=0, extractor=extractor.describe(), fingerprint=extractor.fingerprint,
        features=np.ascontiguousarray(kept_grid[coreset], dtype=np.float32), grid=(h, w), threshold=threshold,
        band=band, teach_hashes=[frame_hash(frames[i][1]) for i in keep], coreset_ratio=coreset_ratio,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"), stats=stats, border=border, blur=blur,
        whitening=whitening,
    )  # fmt: skip
    report = TeachReport(part, [names[i] for i in keep], outliers, dict(zip([names[i] for i in keep],
                         map(float, kept_loo), strict=True)), threshold, band, margin, coreset_ratio,
                         len(coreset), timings)  # fmt: skip
    return bank, report


def cut_at(ok_below: float, margin: float) -> tuple[float, tuple[float, float]]:
    """(threshold, UNCERTAIN band) for a gate that calls a frame OK below `ok_below`: the one rule teach and a
    threshold taken from labelled frames share."""
    threshold = ok_below * (1 + margin)
    return threshold, (ok_below, threshold * (1 + margin))


def with_labelled_threshold(bank: Bank, ok_below: float, evidence: dict) -> Bank:
    """The bank (unpublished, version 0) with its OK cut moved to an operating point chosen on labelled frames
    (`anomaly eval --adopt`); features and fingerprint unchanged, `evidence` kept in its stats."""
    if not ok_below > 0:
        raise TeachError(f"an operating point of {ok_below} cannot be a threshold: label some defective frames")
    threshold, band = cut_at(ok_below, float(bank.stats.get("margin", MARGIN)))
    stats = {**bank.stats, "threshold_from_labels": {**evidence, "from_bank": bank.bank_id}}
    return dataclasses.replace(bank, version=0, threshold=threshold, band=band, stats=stats,
                               created_at=datetime.now(UTC).isoformat(timespec="seconds"))  # fmt: skip


def _check_frames(frames: Sequence[tuple[str, np.ndarray]]) -> None:
    """Refuses frames the extractor would silently distort: not RGB uint8, too large, or of another aspect."""
    aspects = []
    for name, frame in frames:
        if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3):
            got = getattr(frame, "shape", type(frame).__name__)
            raise TeachError(f"{name}: not an RGB 8-bit picture (got {got})")
        height, width = frame.shape[:2]
        if height * width > MAX_FRAME_PIXELS:
            raise TeachError(f"{name}: {width}x{height} is over the {MAX_FRAME_PIXELS} pixel limit: use smaller frames")
        if height == 0 or width == 0 or max(width / height, height / width) > MAX_ASPECT:
            raise TeachError(f"{name}: {width}x{height} is too narrow a picture (past {MAX_ASPECT:g}:1) to learn from")
        aspects.append(width / height)
    usual = float(np.median(aspects))
    odd = [f"{name} ({f.shape[1]}x{f.shape[0]})" for (name, f), a in zip(frames, aspects, strict=True)
           if abs(a / usual - 1) > ASPECT_TOLERANCE]  # fmt: skip
    if odd:
        raise TeachError(f"frames of another shape than the rest of the set (width/height {usual:.3f}): "
                         f"{', '.join(odd)}; teach from one camera view with one crop")  # fmt: skip


def _calibration_scores(
    grid: np.ndarray, ratio: float, border: int = 0, blur: float = 0.0, folds: int = HELD_OUT_FOLDS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each frame's image score against the bank without its own patches (leave-one-out), and without its whole
    fold's patches (held out) -> (loo [N], held [N], coreset indices into grid.reshape(-1, C)). The coreset is built
    once over all frames; rebuilding it without each frame in turn would cost N coresets for a LOO maximum that
    differed by +5.0% (board) and 0.0% (metal) on the sample set at 10%, on the safe side (higher)."""
    n, h, w, c = grid.shape
    flat = grid.reshape(-1, c)  # [N * P, C], P = h * w patches per frame
    coreset = greedy_coreset(flat, ratio)  # [K]
    owner = coreset // (h * w)  # [K] frame each bank patch came from
    index = faiss.IndexFlatL2(c)
    index.add(np.ascontiguousarray(flat[coreset], dtype=np.float32))

    def scores_without(frames: np.ndarray) -> np.ndarray:
        own = np.flatnonzero(np.isin(owner, frames)).astype(np.int64)
        if len(own) == len(coreset):
            raise TeachError(f"the bank is too small to score frames against each other: raise the coreset ratio "
                             f"(now {ratio})")  # fmt: skip
        # Exact k=1 search over the bank minus these frames' own patches (FAISS skips the selected ids).
        skip_own = faiss.SearchParameters(sel=faiss.IDSelectorNot(faiss.IDSelectorBatch(own)))
        query = np.ascontiguousarray(grid[frames].reshape(-1, c), dtype=np.float32)
        dist, _ = index.search(query, 1, params=skip_own)
        patch = np.sqrt(np.maximum(dist, 0.0)).reshape(len(frames), h, w)
        return np.array([image_score(p, border, blur) for p in patch])

    loo = np.concatenate([scores_without(np.array([i])) for i in range(n)])
    held = loo.copy()
    k = min(folds, n)
    if k > 1 and k < n:
        order = np.random.default_rng(0).permutation(n)
        for f in range(k):
            out = np.sort(order[f::k])
            held[out] = scores_without(out)
    return loo, held, coreset


def _expected_overkill(n: int) -> dict:
    """Of new good frames, the share above the highest of n held-out scores: 1/(n+1) by rank, with the Wilson 95%
    interval of seeing none of n above it."""
    from edgeinspect.models.anomaly.evaluate import wilson

    rate = wilson(0, n)
    return {"rate": round(1 / (n + 1), 4), "ci95": [round(rate.lo, 4), round(rate.hi, 4)], "n": n}


def _outliers(names: Sequence[str], scores: np.ndarray) -> list[Outlier]:
    """Frames whose LOO score is far above the set's: robust z (median, MAD) over OUTLIER_Z and OUTLIER_RATIO x the
    median."""
    med = float(np.median(scores))
    mad = max(1.4826 * float(np.median(np.abs(scores - med))), 1e-12)
    z = (scores - med) / mad
    found = [Outlier(name, float(s), float(zi)) for name, s, zi in zip(names, scores, z, strict=True)
             if zi > OUTLIER_Z and s > OUTLIER_RATIO * med]  # fmt: skip
    return sorted(found, key=lambda o: -o.score)


def load_frames(folder: Path) -> list[tuple[str, np.ndarray]]:
    """Every png/jpg/bmp in a folder (not recursive), sorted by name, as (file name, RGB uint8 [H, W, 3])."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TeachError(f"{folder} is not a folder of good frames")
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in FRAME_SUFFIXES)
    frames = []
    for path in paths:
        size = path.stat().st_size
        if size > MAX_FRAME_BYTES:  # before reading it: the limit is there so we never hold it whole
            raise TeachError(f"{path.name}: {size} bytes, over the {MAX_FRAME_BYTES} byte limit for a frame")
        try:
            # decode_image reads the header first and refuses a frame over the pixel limit before decoding it.
            image = decode_image(path.read_bytes(), MAX_FRAME_BYTES, MAX_FRAME_PIXELS)
        except InvalidInput as exc:
            raise TeachError(f"{path.name}: {exc}") from exc
        frames.append((path.name, np.asarray(image, dtype=np.uint8)))
    return frames
