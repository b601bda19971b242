"""Line settings in cameras.yaml: the OPC UA server (`opcua:`) and each station's takt budget (`line:`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field, model_validator


class Meaning(StrEnum):
    """What the line is told for a result that is not a clean OK or DEFECT."""

    ng = "ng"  # reject the part (fail safe)
    recheck = "recheck"  # ResultRecheck: divert the part to a manual check


class StationLineConfig(BaseModel):
    """A camera's station on the PLC handshake."""

    result_deadline_ms: int = Field(
        default=3000, gt=0, description="trigger -> ResultReady budget; later: NG (or recheck) with Error=timeout"
    )
    ack_timeout_ms: int = Field(
        default=5000, gt=0, description="ResultReady -> ResultAck budget; later: Error=ack_timeout"
    )
    on_timeout: Meaning = Field(
        default=Meaning.ng, description="what a missed deadline means on the line: ng | recheck"
    )
    on_uncertain: Meaning = Field(
        default=Meaning.ng, description="what an UNCERTAIN verdict means on the line: ng | recheck"
    )


class Security(StrEnum):
    none = "none"
    basic256sha256 = "basic256sha256"  # Basic256Sha256, Sign & Encrypt, certificates on both ends


class OpcUaConfig(BaseModel):
    """The OPC UA server the PLC connects to (one object per station with a `line:` block)."""

    host: str = Field(default="127.0.0.1", description="address to bind; 0.0.0.0 on the line network")
    port: int = Field(default=4840, ge=0, description="opc.tcp port (4840 is the OPC UA default; 0 picks a free one)")
    namespace: str = Field(default="urn:edgeinspect:line", description="namespace URI of the station objects")
    security: Security = Field(default=Security.none, description="none | basic256sha256")
    certificate: Path | None = Field(default=None, description="server certificate (DER or PEM) for basic256sha256")
    private_key: Path | None = Field(default=None, description="its private key (PEM)")
    trusted_clients: Path | None = Field(
        default=None, description="folder of client certificates accepted (None: any client certificate, encrypted)"
    )
    poll_ms: float = Field(default=2.0, gt=0, description="how often the inputs (Trigger, ResultAck) are sampled")
    heartbeat_s: float = Field(default=1.0, gt=0, description="Heartbeat counter period")
    journal: Path = Field(
        default=Path("var/line.sqlite"), description="every cycle: what the line was told, the report"
    )

    @model_validator(mode="after")
    def _certificates(self) -> OpcUaConfig:
        if self.security is Security.basic256sha256 and (self.certificate is None or self.private_key is None):
            raise ValueError("opcua.security basic256sha256 needs opcua.certificate and opcua.private_key")
        return self
