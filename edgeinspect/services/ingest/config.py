"""Ingest configuration (cameras.yaml): the cameras, how each is sampled, where reports go, what is kept."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from edgeinspect.config import RoleSettings, TLSConfig
from edgeinspect.services.line.config import OpcUaConfig, StationLineConfig
from edgeinspect.services.outputs.config import OutputsConfig


class RtspTransport(StrEnum):
    tcp = "tcp"
    udp = "udp"


class GatingConfig(BaseModel):
    """Change gating on a downscaled grayscale copy of each frame (values 0..255)."""

    threshold: float = Field(
        default=8.0, description="mean abs diff vs the last inspected frame that counts as a change"
    )
    settle_threshold: float | None = Field(
        default=3.0,
        description="inspect only once the scene is still (diff vs the previous frame below this); None: off",
    )
    background: Path | None = Field(
        default=None, description="image of the empty station; frames that match it (below threshold) are not inspected"
    )
    size: tuple[int, int] = Field(default=(64, 36), description="thumbnail (width, height) the diffs are computed on")


class SamplingConfig(BaseModel):
    """Which frames are inspected. Rules apply in order: trigger, every_n, max_rate_hz, gating."""

    every_n: int = Field(default=1, ge=1, description="consider only every Nth frame read")
    max_rate_hz: float | None = Field(default=None, gt=0, description="at most this many inspections per second")
    gating: GatingConfig | None = Field(default=None, description="change gating; None inspects every considered frame")
    trigger_only: bool = Field(default=False, description="inspect only the next frame after each external trigger")


class CameraConfig(BaseModel):
    id: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="camera id: metrics label, key, trigger path")
    station: str = Field(..., description="station name written into each report")
    part: str = Field(..., description="part number, filters the specs retrieved for the prompt")
    source: str = Field(
        ...,
        description="video file, image folder, http(s)://, rtsp://, tcp://, udp:// URL, or a V4L2 index (usb:0)",
    )
    rtsp_transport: RtspTransport = Field(default=RtspTransport.tcp, description="RTSP transport for rtsp:// sources")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="which frames are inspected")
    jpeg_quality: int = Field(default=90, ge=10, le=100, description="JPEG quality of frames sent to the gateway")
    max_in_flight: int = Field(default=1, ge=1, description="inspections of this camera running at once")
    prompt: str = Field(default="", description="instruction sent with each frame (empty: the gateway's default)")
    max_new_tokens: int = Field(default=0, ge=0, description="generation budget per report (0: the gateway's default)")
    realtime: bool = Field(
        default=True, description="files and folders: pace frames at their frame rate, like a camera"
    )
    loop: bool = Field(default=False, description="files and folders: start again at the end")
    folder_fps: float = Field(default=2.0, gt=0, description="frame rate of an image-folder source")
    open_timeout_s: float = Field(default=5.0, gt=0, description="give up opening a stream after this long")
    stall_timeout_s: float = Field(
        default=5.0, gt=0, description="watchdog: reopen a stream that sends no frame this long"
    )
    reconnect_base_s: float = Field(default=0.5, gt=0, description="first reconnect delay; doubles per failure")
    reconnect_max_s: float = Field(default=10.0, gt=0, description="reconnect delays never exceed this")
    line: StationLineConfig | None = Field(
        default=None, description="this camera's station on the PLC handshake (OPC UA object, takt budget); None: not"
    )


class RetentionConfig(BaseModel):
    max_age_days: float | None = Field(default=7.0, gt=0, description="delete saved frames older than this")
    max_count: int | None = Field(default=10_000, ge=1, description="keep at most this many saved frames (newest)")


class TriggerConfig(BaseModel):
    host: str = Field(default="127.0.0.1", description="address of the trigger HTTP endpoint")
    port: int | None = Field(default=None, description="port of POST /trigger/<camera_id>; None disables, 0 picks one")
    token: str = Field(
        default="",
        description="bearer token every trigger must send (or its 'sha256:<hex>' hash); empty: every trigger is "
        "refused (env EDGEINSPECT_TRIGGER__TOKEN)",
    )


class IngestSettings(RoleSettings):
    """The ingest role: `edgeinspect ingest --config cameras.yaml`."""

    cameras: list[CameraConfig] = Field(..., min_length=1, description="the cameras to follow")
    gateway: str = Field(
        default="127.0.0.1:50051",
        description="host:port of the gateway's InspectionService; a gateway pair (or more) as 'a:50051,b:50051'",
    )
    api_token: str = Field(default="", description="bearer token for the gateway (env EDGEINSPECT_API_TOKEN)")
    gateway_tls: TLSConfig | None = Field(
        default=None, description="TLS to the gateway: `ca` verifies it (None: plaintext)"
    )
    frames_dir: Path | None = Field(
        default=Path("var/frames"), description="inspected frames are saved here; None: not"
    )
    retention: RetentionConfig = Field(default_factory=RetentionConfig, description="what saved frames are kept")
    max_in_flight: int = Field(default=4, ge=1, description="inspections running at once across all cameras")
    request_timeout_s: float = Field(default=120.0, gt=0, description="deadline of one Inspect call")
    retry_attempts: int = Field(default=4, ge=1, description="tries per frame on UNAVAILABLE / DEADLINE_EXCEEDED")
    retry_base_s: float = Field(default=0.5, gt=0, description="first delay between tries; doubles per try")
    retry_max_s: float = Field(default=4.0, gt=0, description="delays between tries never exceed this")
    trigger: TriggerConfig = Field(default_factory=TriggerConfig, description="external trigger endpoint")
    opcua: OpcUaConfig | None = Field(default=None, description="OPC UA server for the PLC handshake; None: off")
    outputs: OutputsConfig = Field(
        default_factory=OutputsConfig, description="where each report goes next (MQTT, webhooks), from this role"
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> Self:
        ids = [c.id for c in self.cameras]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"camera ids must be unique; repeated: {', '.join(dupes)}")
        stations = [c.station for c in self.cameras if c.line is not None]
        shared = sorted({st for st in stations if stations.count(st) > 1})
        if shared:
            raise ValueError(f"one camera per line station (OPC UA object); shared: {', '.join(shared)}")
        return self

    def line_camera(self, station: str) -> CameraConfig | None:
        """The camera serving a line station (a camera with a `line:` block)."""
        return next((c for c in self.cameras if c.line is not None and c.station == station), None)

    @classmethod
    def load(cls, path: Path | str | None = None, **overrides: Any) -> Self:
        """As RoleSettings.load, with relative sources and background images resolved against the file's folder."""
        settings = super().load(path, **overrides)
        if path is not None:
            base = Path(path).resolve().parent
            for cam in settings.cameras:
                cam.source = resolve_source(cam.source, base)
                gating = cam.sampling.gating
                if gating is not None and gating.background is not None and not gating.background.is_absolute():
                    gating.background = base / gating.background
        return settings


def resolve_source(source: str, base: Path) -> str:
    """A relative file or folder path becomes absolute under `base`; URLs, device indexes and `asset:` stay."""
    if "://" in source or source.startswith(("usb:", "asset:")) or source.isdigit() or Path(source).is_absolute():
        return source
    return str(base / source)
