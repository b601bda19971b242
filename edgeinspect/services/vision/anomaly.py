"""The vision node's anomaly gate: one frame against its part's current bank -> verdict, regions, heatmap, metrics.

The banks themselves (loads, reloads, Teach, Promote, moves between nodes) are the keeper's (banks.py); the gate
scores against whatever version the keeper holds at the moment of the call. Scoring runs in worker threads, one
extraction at a time per extractor.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from edgeinspect.errors import FailedPrecondition
from edgeinspect.models.anomaly.scoring import AnomalyResult, heatmap_png
from edgeinspect.services.common.metrics import LATENCY_BUCKETS
from edgeinspect.services.vision.banks import BankKeeper, decode_rgb
from edgeinspect.services.vision.settings import VisionSettings

SCORES = Counter(
    "edgeinspect_anomaly_scores", "frames scored by the anomaly gate, by part and verdict", ["part", "verdict"]
)
SCORE_SECONDS = Histogram(
    "edgeinspect_anomaly_score_seconds",
    "one Score: decode + features + kNN + heatmap",
    ["extractor"],
    buckets=LATENCY_BUCKETS,
)


class BankVersionMismatch(FailedPrecondition):
    """The caller expects another bank version than this node holds (a replica not yet reloaded, or ahead)."""

    code = "anomaly_bank_version"


@dataclass(frozen=True)
class ScoreCall:
    """A Score request, checked at the edge (part name valid, image present)."""

    part: str
    image: bytes
    expect_bank_id: str  # "": whatever the node holds
    heatmap: bool


@dataclass(frozen=True)
class ScoreOutcome:
    result: AnomalyResult
    band: tuple[float, float]
    heatmap_png: bytes  # b"" unless asked
    image_sha256: str
    score_ms: float


class AnomalyGate:
    """Scores frames against the banks `keeper` holds (the keeper's lifetime is its opener's)."""

    def __init__(self, cfg: VisionSettings, keeper: BankKeeper) -> None:
        self.cfg, self.keeper = cfg, keeper

    def score(self, call: ScoreCall) -> ScoreOutcome:
        """One frame against its part's bank (blocking: run it in a worker thread)."""
        start = time.perf_counter()
        held = self.keeper.held_for(call.part)
        bank = held.bank
        if call.expect_bank_id and call.expect_bank_id != bank.bank_id:
            raise BankVersionMismatch(
                f"part {call.part!r}: expected anomaly bank {call.expect_bank_id}, this vision node holds "
                f"{bank.bank_id}"
            )
        scorer, lock = held.scorer, held.lock
        if scorer is None or lock is None:  # a refused version: held.bank above has already raised
            raise FailedPrecondition(held.refused)
        frame = decode_rgb(call.image, self.cfg)  # [H, W, 3] uint8
        with lock:
            result = scorer.score([frame])[0]
        png = heatmap_png(frame, result.heatmap, result.threshold) if call.heatmap else b""
        elapsed = time.perf_counter() - start
        SCORES.labels(call.part, result.verdict).inc()
        SCORE_SECONDS.labels(bank.extractor["name"]).observe(elapsed)
        digest = hashlib.sha256(call.image).hexdigest()
        return ScoreOutcome(result, (bank.band[0], bank.band[1]), png, digest, 1e3 * elapsed)
