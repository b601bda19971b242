"""Model versions and the rollout record: what a version is, the state the gateway persists beside its report
database (rollout.json), and the shadow comparison. Pure functions and plain data: no processes, no gRPC."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from edgeinspect.services.gateway.settings import GatewaySettings, endpoints
from edgeinspect.v1 import inspection_pb2, rollout_pb2

STATE_FILE = "rollout.json"
SHADOW_KEY = "shadow:"  # idempotency key of a shadow run: "shadow:<live report id>"
IDLE, SHADOW, CANARY, PROMOTED, ROLLED_BACK = "idle", "shadow", "canary", "promoted", "rolled_back"
_STATE_PROTO = {
    IDLE: rollout_pb2.ROLLOUT_STATE_IDLE,
    SHADOW: rollout_pb2.ROLLOUT_STATE_SHADOW,
    CANARY: rollout_pb2.ROLLOUT_STATE_CANARY,
    PROMOTED: rollout_pb2.ROLLOUT_STATE_PROMOTED,
    ROLLED_BACK: rollout_pb2.ROLLOUT_STATE_ROLLED_BACK,
}


@dataclass(frozen=True)
class Version:
    """One model version: its checkpoint (weights), the processes serving it, its KB (retrieval) and prompt."""

    name: str
    checkpoint: str
    vision: str  # endpoints, comma-separated (replicas)
    stages: tuple[str, ...]
    retrieval: str = ""
    prompt: str = ""
    fingerprint: str = ""  # checkpoint fingerprint, once connected

    def to_proto(self) -> rollout_pb2.ModelVersion:
        return rollout_pb2.ModelVersion(
            name=self.name,
            checkpoint=self.checkpoint,
            vision=self.vision,
            stages=list(self.stages),
            retrieval=self.retrieval,
            prompt=self.prompt,
            checkpoint_fingerprint=self.fingerprint,
        )

    @classmethod
    def from_proto(cls, msg: rollout_pb2.ModelVersion) -> Version:
        return cls(
            name=msg.name or Path(msg.checkpoint).name,
            checkpoint=msg.checkpoint,
            vision=msg.vision,
            stages=tuple(msg.stages),
            retrieval=msg.retrieval,
            prompt=msg.prompt,
        )

    @classmethod
    def from_dict(cls, d: dict) -> Version:
        return cls(**{**d, "stages": tuple(d["stages"])})


def version_of(cfg: GatewaySettings) -> Version:
    """The version a gateway's own settings describe (the one it serves when no rollout record says otherwise)."""
    return Version(
        name=Path(cfg.checkpoint).name,
        checkpoint=str(cfg.checkpoint),
        vision=",".join(cfg.vision),
        stages=tuple(cfg.stages),
        retrieval=",".join(cfg.retrieval),
    )


def settings_for(cfg: GatewaySettings, version: Version, **more) -> GatewaySettings:
    """The gateway's settings with `version`'s checkpoint, upstreams and KB: configuration follows the version."""
    update = {
        "checkpoint": Path(version.checkpoint),
        "vision": endpoints(version.vision),
        "stages": list(version.stages),
        "retrieval": endpoints(version.retrieval) or cfg.retrieval,
        **more,
    }
    return cfg.model_copy(update=update)


@dataclass
class Record:
    """What survives a restart: which version is live, the candidate, the previous one, the canary stations."""

    state: str
    live: Version
    candidate: Version | None = None
    previous: Version | None = None
    canary: list[str] = field(default_factory=list)
    started: str = ""
    shadow: tuple[int, int] = (1, 64)  # (in flight, queue) of the shadow: kept so a restart resumes it alike

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        def v(x):
            return Version.from_dict(x) if x else None

        return cls(d["state"], v(d["live"]), v(d.get("candidate")), v(d.get("previous")), d.get("canary", []),
                   d.get("started", ""), tuple(d.get("shadow", (1, 64))))  # fmt: skip

    def to_proto(self) -> rollout_pb2.RolloutStatus:
        out = rollout_pb2.RolloutStatus(state=_STATE_PROTO[self.state], live=self.live.to_proto())
        if self.candidate:
            out.candidate.CopyFrom(self.candidate.to_proto())
        if self.previous:
            out.previous.CopyFrom(self.previous.to_proto())
        out.canary_stations.extend(self.canary)
        if self.started:
            out.started.FromDatetime(datetime.fromisoformat(self.started))
        return out


def state_path(cfg: GatewaySettings) -> Path:
    return Path(cfg.db_path).parent / STATE_FILE


def load_record(path: Path) -> Record | None:
    return Record.from_dict(json.loads(path.read_text())) if path.is_file() else None


def save_record(path: Path, record: Record) -> None:
    """Atomically (write, fsync, rename): a crash leaves the old record or the new one, never half of one."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def apply_record(cfg: GatewaySettings) -> GatewaySettings:
    """The settings to start with. While a promotion is in force (state promoted) the promoted version's, so it
    survives a restart; otherwise the configured ones, which always win over an older record (a re-rendered
    inventory is never silently overridden)."""
    record = load_record(state_path(cfg))
    if record is None or record.state != PROMOTED:
        return cfg
    return settings_for(cfg, record.live)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- the shadow comparison -------------------------------------------------------------------------------------------


def classes_of(report: inspection_pb2.DefectReport) -> list[str]:
    return sorted({" ".join(d.defect_class.lower().split()) for d in report.defects if d.defect_class})


def agrees(live: inspection_pb2.DefectReport, shadow: inspection_pb2.DefectReport) -> bool:
    """Same verdict and the same set of defect classes: what a line would do differently otherwise."""
    return live.verdict == shadow.verdict and classes_of(live) == classes_of(shadow)


def compare(
    pairs: Iterable[tuple[inspection_pb2.DefectReport, inspection_pb2.DefectReport]], max_listed: int
) -> tuple[int, int, list[rollout_pb2.Disagreement]]:
    """(shadowed, agreed, the first `max_listed` disagreements) over (live, shadow) pairs, newest first."""
    shadowed = agreed = 0
    listed = []
    for live, shadow in pairs:
        shadowed += 1
        if agrees(live, shadow):
            agreed += 1
        elif len(listed) < max_listed:
            listed.append(
                rollout_pb2.Disagreement(
                    live_report_id=live.report_id,
                    shadow_report_id=shadow.report_id,
                    station=live.station,
                    image_sha256=live.image_sha256,
                    live_verdict=live.verdict,
                    shadow_verdict=shadow.verdict,
                    live_classes=classes_of(live),
                    shadow_classes=classes_of(shadow),
                )
            )
    return shadowed, agreed, listed
