"""The vision node's anomaly banks: every part's current bank with its extractor; loads, reloads, Teach, Promote, and
moves between nodes. The gate (anomaly.py) scores against what the keeper holds.

Banks come from the bank store (models/anomaly/bank.py) and are reloaded when a part's CURRENT changes on disk
(another node or `edgeinspect anomaly` published, promoted or rolled back). A staged version (a Teach with stage) is
read for Info only and never scored against until Promote makes it current (models/anomaly/golive.py). Extractors
are built once and shared by fingerprint; `siglip` uses this node's own tower when the Encode backend is torch with
the same weights. Scoring and teaching run in worker threads, one extraction at a time per extractor.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import torch
from prometheus_client import Counter, Gauge, Info

from edgeinspect.errors import EdgeInspectError, FailedPrecondition, InvalidInput, NotFound
from edgeinspect.models.anomaly import golive
from edgeinspect.models.anomaly.bank import Bank, BankArchive, BankStore
from edgeinspect.models.anomaly.features import FeatureExtractor, open_extractor
from edgeinspect.models.anomaly.scoring import Scorer
from edgeinspect.models.anomaly.teach import ASPECT_TOLERANCE, MAX_ASPECT, Outlier, TeachError, teach
from edgeinspect.models.anomaly.tiles import tiled_for
from edgeinspect.models.image_io import decode_image
from edgeinspect.services.vision import teach_frames
from edgeinspect.services.vision.backends import Backend, TorchBackend
from edgeinspect.services.vision.settings import AnomalyExtractor, VisionSettings
from edgeinspect.services.vision.teach_frames import TeachFrames

log = logging.getLogger(__name__)

BANK_VERSION = Gauge(
    "edgeinspect_anomaly_bank_version", "the bank version this node scores each part against", ["part"]
)
BANK_INFO = Info("edgeinspect_anomaly_bank", "the bank this node scores each part against", ["part"])
TEACHES = Counter("edgeinspect_anomaly_teaches", "Teach calls by result (published | refused)", ["result"])


@dataclass(frozen=True)
class TeachCall:
    """A Teach request, checked at the edge."""

    part: str
    frames: list[bytes]
    add_to_current: bool
    extractor: str  # "": the node's default (a fresh teach) or the current bank's (add_to_current)
    stage: bool = False  # publish as the part's staged version (held back until promoted)


@dataclass(frozen=True)
class TeachOutcome:
    bank: Bank
    outliers: list[Outlier]
    frames: int  # good frames the bank was taught from
    teach_ms: float
    staged: bool


@dataclass(frozen=True)
class HeldBank:
    """A part's CURRENT version as this node holds it: a scorer, or the reason it was refused."""

    part: str
    version: int
    scorer: Scorer | None
    lock: threading.Lock | None  # its extractor's: one extraction at a time
    frames: int
    refused: str = ""

    @property
    def bank(self) -> Bank:
        if self.scorer is None:
            raise FailedPrecondition(self.refused)
        return self.scorer.bank


class Extractors:
    """Feature extractors built once, shared by fingerprint; each with a lock (extractors are not re-entrant)."""

    def __init__(self, checkpoint: Path, backend: Backend) -> None:
        self.checkpoint, self.backend = checkpoint, backend
        self._by_key: dict[str, FeatureExtractor] = {}
        self._by_fingerprint: dict[str, FeatureExtractor] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, name: str, options: dict) -> tuple[FeatureExtractor, threading.Lock]:
        """The extractor `name` with `options` (siglip: on this node's checkpoint, whatever path a bank recorded)."""
        options = dict(options)
        if name == AnomalyExtractor.siglip:
            options["checkpoint"] = str(self.checkpoint)
            options.setdefault("weights", getattr(self.backend, "weights", "fp32"))
        key = json.dumps([name, options], sort_keys=True, default=str)
        with self._guard:
            extractor = self._by_key.get(key)
            if extractor is None:
                extractor = self._build(name, options)
                # Another option spelling (defaults left out or written out) that computes the same features.
                extractor = self._by_fingerprint.setdefault(extractor.fingerprint, extractor)
                self._by_key[key] = extractor
            lock = self._locks.setdefault(extractor.fingerprint, threading.Lock())
        return extractor, lock

    def _build(self, name: str, options: dict) -> FeatureExtractor:
        start = time.perf_counter()
        if name == AnomalyExtractor.siglip:
            options = {**options, "tower": self._shared_tower(options["weights"])}
        extractor = open_extractor(name, **options)
        log.info("anomaly features %s ready in %.0f ms (fingerprint %s)", name,
                 1e3 * (time.perf_counter() - start), extractor.fingerprint)  # fmt: skip
        return extractor

    def _shared_tower(self, weights: str):
        """The tower Encode already holds where it runs torch with the same weights (no second copy), else None:
        the extractor then loads its own."""
        backend = self.backend
        if isinstance(backend, TorchBackend) and backend.weights == weights:
            log.info("siglip anomaly features use this node's own %s vision tower", weights)
            return backend.tower
        log.info("siglip anomaly features load their own %s vision tower (Encode runs %s %s)",
                 weights, backend.name, getattr(backend, "weights", ""))  # fmt: skip
        return None


def decode_rgb(data: bytes, cfg: VisionSettings) -> np.ndarray:
    """An encoded frame within this node's image limits -> [H, W, 3] uint8 (Score and Teach alike)."""
    image = decode_image(data, cfg.max_image_bytes, cfg.max_image_pixels)
    return np.asarray(image, dtype=np.uint8)


class BankKeeper:
    """Owns the node's banks: loads, reloads, teaches, promotes; `close` stops the reload thread."""

    def __init__(self, cfg: VisionSettings, checkpoint: Path, backend: Backend) -> None:
        self.cfg, self.settings = cfg, cfg.anomaly
        if cfg.threads > 0:
            # The node's thread budget holds for the gate too: FAISS's OpenMP pool and torch's default to every
            # core, and on a shared 2-core box their spinning threads made a 10-frame teach ~10x slower.
            faiss.omp_set_num_threads(cfg.threads)
            torch.set_num_threads(cfg.threads)
        self.store = BankStore(self.settings.banks_dir)
        self.extractors = Extractors(checkpoint, backend)
        self._held: dict[str, HeldBank] = {}
        self._staged: dict[str, Bank] = {}  # part -> its staged version (Info only: never scored against)
        self._held_lock = threading.Lock()
        self._teach_lock = threading.Lock()  # one teach at a time: each holds its frames decoded
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def open(cls, cfg: VisionSettings, checkpoint: Path, backend: Backend) -> BankKeeper:
        """Loads every part's current bank (slow: off the event loop), then watches the store for new versions."""
        keeper = cls(cfg, checkpoint, backend)
        keeper.refresh()
        keeper._watcher = threading.Thread(target=keeper._watch, name="anomaly-banks", daemon=True)
        keeper._watcher.start()
        held = keeper.banks()
        log.info("anomaly gate: %d bank(s) in %s%s", len(held), keeper.store.root,
                 "".join(f"; {h.bank.bank_id}" for h in held))  # fmt: skip
        return keeper

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()

    # ---- banks ---------------------------------------------------------------------------------------------

    def banks(self) -> list[HeldBank]:
        """The parts this node can score, by part name."""
        with self._held_lock:
            return [h for _, h in sorted(self._held.items()) if h.scorer is not None]

    def staged(self) -> list[Bank]:
        """Each part's staged version, by part name."""
        with self._held_lock:
            return [b for _, b in sorted(self._staged.items())]

    def refresh(self) -> list[str]:
        """Loads each part whose CURRENT names another version than the one held; returns the parts it loaded."""
        changed = []
        parts = self.store.list_parts()
        for part in parts:
            self._follow_staged(part)
            version = self._current_version(part)
            with self._held_lock:
                held = self._held.get(part)
            if version is None or (held is not None and held.version == version):
                continue
            self._install(self._load(part, version))
            changed.append(part)
        with self._held_lock:
            gone = [p for p in self._held if p not in parts]
            for part in [p for p in self._staged if p not in parts]:
                del self._staged[part]
        for part in gone:
            self._forget(part)
        return changed

    def _follow_staged(self, part: str) -> None:
        try:
            number = self.store.staged_version(part)
            with self._held_lock:
                held = self._staged.get(part)
            if number is not None and (held is None or held.version != number):
                bank = self.store.load(part, number)
                with self._held_lock:
                    self._staged[part] = bank
            elif number is None and held is not None:
                with self._held_lock:
                    self._staged.pop(part, None)
        except (EdgeInspectError, OSError) as exc:  # a STAGED being written: look again at the next poll
            log.warning("part %s: staged anomaly bank not readable yet: %s", part, exc)

    def _current_version(self, part: str) -> int | None:
        try:
            return self.store.current_version(part)
        except FailedPrecondition:  # a CURRENT being written by hand: look again at the next poll
            return None

    def _load(self, part: str, version: int) -> HeldBank:
        try:
            bank = self.store.load(part, version)
            return self._hold(bank)
        except (EdgeInspectError, OSError, ValueError, KeyError) as exc:
            reason = f"part {part!r}: this vision node refuses anomaly bank v{version}: {exc}"
            log.error("%s", reason)
            return HeldBank(part, version, None, None, 0, refused=reason)

    def _hold(self, bank: Bank) -> HeldBank:
        extractor, lock = self.extractors.get(bank.extractor["name"], bank.extractor.get("options", {}))
        scorer = Scorer(bank, extractor)  # refuses a bank of another fingerprint (BankMismatch, in words)
        return HeldBank(bank.part, bank.version, scorer, lock, int(bank.stats.get("n_kept", len(bank.teach_hashes))))

    def _install(self, held: HeldBank) -> None:
        with self._held_lock:
            self._held[held.part] = held
        if held.scorer is None:
            BANK_VERSION.labels(held.part).set(0)
            BANK_INFO.labels(held.part).info({"bank_id": "", "refused": "true"})
            return
        bank = held.bank
        BANK_VERSION.labels(held.part).set(bank.version)
        BANK_INFO.labels(held.part).info(
            {"bank_id": bank.bank_id, "extractor": bank.extractor["name"], "fingerprint": bank.fingerprint}
        )
        log.info("anomaly bank %s loaded (%s, %d patches, threshold %.4g)", bank.bank_id, bank.extractor["name"],
                 bank.features.shape[0], bank.threshold)  # fmt: skip

    def _forget(self, part: str) -> None:
        with self._held_lock:
            self._held.pop(part, None)
        BANK_VERSION.remove(part)
        BANK_INFO.remove(part)
        log.info("part %r has no anomaly bank on disk any more", part)

    def _watch(self) -> None:
        while not self._stop.wait(self.settings.reload_interval_s):
            try:
                self.refresh()
            except (EdgeInspectError, OSError) as exc:  # a folder mid-copy: the next poll sees it whole
                log.warning("anomaly bank reload check failed: %s", exc)

    def held_for(self, part: str) -> HeldBank:
        """The part's current bank, ready to score against (NotFound, or the reason this node refused it)."""
        with self._held_lock:
            held = self._held.get(part)
        if held is None:
            raise NotFound(f"this vision node holds no anomaly bank for part {part!r}: teach one first")
        if held.scorer is None:
            raise FailedPrecondition(held.refused)
        return held

    # ---- teach ---------------------------------------------------------------------------------------------

    def teach(self, call: TeachCall) -> TeachOutcome:
        """Teaches and publishes the part's next version (blocking); a refusal leaves CURRENT as it was."""
        start = time.perf_counter()
        try:
            with self._teach_lock:
                bank, outliers, kept = self._teach(call)
        except EdgeInspectError:
            TEACHES.labels("refused").inc()
            raise
        TEACHES.labels("staged" if call.stage else "published").inc()
        return TeachOutcome(bank, outliers, kept, 1e3 * (time.perf_counter() - start), call.stage)

    def promote(self, part: str, version: int, force: bool) -> Bank:
        """Makes the part's staged `version` current when its go-live figures pass, or by force (blocking)."""
        with self._teach_lock:  # a teach building on the staged version finishes first
            candidate = self.store.load(part, version)  # NotFound before anything changes
            held = self._hold(candidate)  # a bank this node cannot score is refused before CURRENT moves
            bank = golive.promote(self.store, part, version, force)
            self._install(held)
            with self._held_lock:
                self._staged.pop(part, None)
        log.info("promoted %s to current%s", bank.bank_id, " (forced)" if force else "")
        return bank

    # ---- move a bank between nodes ------------------------------------------------------------------------

    def export_bank(self, part: str, version: int) -> BankArchive:
        """A published version as an archive for another node (blocking: reads the version's files)."""
        return self.store.export_archive(part, version)

    def import_bank(self, archive: BankArchive) -> tuple[Bank, bool]:
        """Installs another node's version (models/anomaly/bank.py import_archive) and holds it at once where it
        became current; returns it and whether it is staged here (blocking)."""
        with self._teach_lock:  # a teach here numbers its version after the imported one
            bank, staged = self.store.import_archive(archive)
        self.refresh()
        log.info("imported anomaly bank %s%s", bank.bank_id, " (staged)" if staged else "")
        return bank, staged

    def _teach(self, call: TeachCall) -> tuple[Bank, list[Outlier], int]:
        limit = self.settings.max_teach_frames
        if len(call.frames) > limit:
            raise TeachError(f"{len(call.frames)} frames in one Teach, over this node's limit of {limit}")
        if call.add_to_current:
            if not call.frames:
                raise TeachError(f"adding to part {call.part!r}'s good set needs at least one frame, got 0")
            # A staged add builds on what is already staged: several frames collect in one version to promote.
            staged = self.store.staged(call.part) if call.stage else None
            current = staged or self.store.load(call.part)  # NotFound: nothing to add to
            name = current.extractor["name"]
            if call.extractor and call.extractor != name:
                raise InvalidInput(f"part {call.part!r}'s current bank uses {name} features; add_to_current cannot "
                                   f"switch to {call.extractor}: teach the part afresh for that")  # fmt: skip
            extractor, lock = self.extractors.get(name, current.extractor.get("options", {}))
            if extractor.fingerprint != current.fingerprint:
                Scorer(current, extractor)  # raises the mismatch, in words
            base = teach_frames.load(self.store.root, current)
            if base is None:
                raise FailedPrecondition(
                    f"part {call.part!r}'s bank v{current.version} was taught without keeping its frames (taught "
                    "elsewhere?): teach the part again from all its good frames"
                )
        else:
            name = call.extractor or self.settings.extractor.value
            options = self.settings.extractor_options if name == self.settings.extractor else {}
            extractor, lock = self.extractors.get(name, options)
            base = None
        extractor, new = self._decode_teach_frames(call.part, call.frames, extractor, base)
        frames = new if base is None else TeachFrames(base.names + new.names, base.frames + new.frames, base.frame_size)
        # Frames added to a part's good set were vouched for by a person: the outlier rule never drops them.
        vouched = new.names if call.add_to_current else ()
        with lock:
            bank, report = teach(list(zip(frames.names, frames.frames, strict=True)), extractor, call.part,
                                 vouched=vouched)  # fmt: skip
        written = teach_frames.save(self.store.root, bank, teach_frames.keep_named(frames, report.kept))
        try:
            published = self.store.publish(bank, stage=call.stage)
        except BaseException:
            teach_frames.remove(written)
            raise
        if call.stage:
            with self._held_lock:
                self._staged[published.part] = published
        else:
            self._install(self._hold(published))
        log.info("taught %s from %d frames (%d outliers left out) in %.1f s", published.bank_id, len(report.kept),
                 len(report.outliers), sum(report.timings.values()))  # fmt: skip
        return published, report.outliers, len(report.kept)

    def _decode_teach_frames(
        self, part: str, frames: list[bytes], extractor: FeatureExtractor, base: TeachFrames | None
    ) -> tuple[FeatureExtractor, TeachFrames]:
        """Encoded frames -> as the extractor sees them, one at a time (a Teach never holds them all full size);
        a fresh teach tiles the part's region, or frames past 1.5x the input side (tiles.tiled_for, decided on
        the first frame); refuses frames of another aspect than the set (or the current bank's frames)."""
        start = len(base.names) if base is not None else 0
        names, seen, sizes = [], [], []
        for i, data in enumerate(frames):
            try:
                frame = decode_rgb(data, self.cfg)
            except InvalidInput as exc:
                raise TeachError(f"frame {i}: {exc}") from exc
            if i == 0 and base is None:
                roi = self.settings.regions.get(part)
                try:
                    extractor = tiled_for(extractor, frame.shape[:2], roi=roi, max_tiles=self.settings.max_tiles)
                except InvalidInput as exc:
                    raise TeachError(f"part {part!r}'s region (this node's anomaly.regions setting): {exc}") from exc
            names.append(f"frame-{start + i:04d}")
            sizes.append(frame.shape[:2])
            try:
                seen.append(teach_frames.as_seen(extractor, frame))
            except InvalidInput as exc:
                raise TeachError(f"frame {i}: {exc}") from exc
        _check_aspects(sizes, base.frame_size if base is not None else None)
        size = extractor.input_size
        frame_size = base.frame_size if base is not None else (tuple(sizes[0]) if sizes else (size, size))
        return extractor, TeachFrames(names, seen, frame_size)


def _check_aspects(sizes: list[tuple[int, int]], reference: tuple[int, int] | None) -> None:
    """Frames are squashed to the extractor's square input: one aspect ratio per bank (teach.py's rule)."""
    if not sizes:
        return
    aspects = [w / h for h, w in sizes]
    usual = reference[1] / reference[0] if reference is not None else float(np.median(aspects))
    for i, ((h, w), aspect) in enumerate(zip(sizes, aspects, strict=True)):
        if max(aspect, 1 / aspect) > MAX_ASPECT:
            raise TeachError(f"frame {i}: {w}x{h} is too narrow a picture (past {MAX_ASPECT:g}:1) to learn from")
        if abs(aspect / usual - 1) > ASPECT_TOLERANCE:
            raise TeachError(f"frame {i}: {w}x{h} has another shape than the part's teach frames (width/height "
                             f"{usual:.3f}): teach from one camera view with one crop")  # fmt: skip
