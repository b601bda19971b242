"""Settings of the result outputs: an `outputs:` block in the gateway's settings or in cameras.yaml."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field


class MqttConfig(BaseModel):
    """One broker connection; every result is published with QoS 1, the last one per station retained."""

    url: str = Field(..., description="mqtt://host:port or mqtts://host:port (TLS)")
    topic: str = Field(
        default="edgeinspect/{station}/{camera}/result", description="result topic ({station}, {camera}, {part})"
    )
    explained_topic: str = Field(
        default="edgeinspect/{station}/{camera}/explained",
        description="where the explanation of a report decided at takt is published (its result went to `topic`)",
    )
    last_topic: str = Field(
        default="edgeinspect/{station}/last", description="retained last verdict per station ({station}); empty: none"
    )
    drift_topic: str = Field(
        default="edgeinspect/{station}/drift",
        description="where a station's drift alert goes, not retained: once when its good parts' anomaly scores "
        "begin to drift toward the OK cut, once when they are back clear ({station}, {part}); empty: none",
    )
    status_topic: str = Field(
        default="edgeinspect/{node}/status",
        description="retained 'online' on connect; the Last Will sets it 'offline' when this node drops ({node})",
    )
    node: str = Field(
        default="edgeinspect", description="this publisher's name: the station it serves, or the gateway's"
    )
    qos: int = Field(default=1, ge=0, le=2, description="QoS of result messages")
    username: str = Field(default="", description="broker user (empty: anonymous)")
    password: str = Field(default="", description="broker password (env EDGEINSPECT_OUTPUTS__MQTT__PASSWORD)")
    ca_file: Path | None = Field(
        default=None, description="CA bundle to verify the broker (mqtts://; None: system CAs)"
    )
    cert_file: Path | None = Field(default=None, description="client certificate for brokers that require one")
    key_file: Path | None = Field(default=None, description="private key of cert_file")
    keepalive_s: int = Field(default=15, ge=5, description="MQTT keepalive; the broker sends the Last Will after ~1.5x")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="give up one connection attempt after this long")


class WebhookConfig(BaseModel):
    """HTTP POST of each result, signed: X-EdgeInspect-Signature: sha256=HMAC(secret, timestamp + '.' + body)."""

    url: str = Field(..., description="http(s):// endpoint")
    secret: str = Field(..., min_length=16, description="HMAC-SHA256 key shared with the receiver")
    name: str = Field(default="", description="name in metrics and outbox rows (default: webhook<index>)")
    timeout_s: float = Field(default=5.0, gt=0, description="one POST's deadline")


class OnFull(StrEnum):
    refuse = "refuse"  # the gateway refuses new inspections for that station until the queue drains
    drop_oldest = "drop_oldest"  # the station's oldest queued results are dropped (counted, logged)


class OutputsConfig(BaseModel):
    """Every configured output gets each stored result; each drains its own rows of the outbox table (in the report
    database: services/outputs/outbox.py) at its own pace."""

    mqtt: MqttConfig | None = Field(default=None, description="MQTT broker to publish results to")
    webhooks: list[WebhookConfig] = Field(default_factory=list, description="HTTP endpoints to POST results to")
    outbox_dir: Path | None = Field(
        default=None,
        description="gateway: where older releases kept an outbox file per output, imported once at start; ingest: "
        "its outbox database (None: 'outbox' beside the report database / the frames)",
    )
    max_queued: int = Field(
        default=10_000, ge=1, description="results queued per output and station while its peer is down; then on_full"
    )
    on_full: OnFull = Field(
        default=OnFull.refuse,
        description="refuse: new inspections for that station get RESOURCE_EXHAUSTED until the queue drains; "
        "drop_oldest: the station's oldest queued results are dropped",
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        description="a drainer holds the row it sends this long; a dead gateway's row is taken over after",
    )
    poll_s: float = Field(
        default=1.0, gt=0, description="an idle drainer looks for rows other gateways queued this often"
    )
    retry_base_s: float = Field(
        default=0.2, gt=0, description="first delay after a failed delivery; doubles per failure"
    )
    retry_max_s: float = Field(default=10.0, gt=0, description="delays between delivery tries never exceed this")

    @property
    def enabled(self) -> bool:
        return self.mqtt is not None or bool(self.webhooks)

    def names(self) -> tuple[str, ...]:
        """Each output's name, as its outbox rows and metrics carry it."""
        mqtt = ("mqtt",) if self.mqtt is not None else ()
        return mqtt + tuple(hook.name or f"webhook{i}" for i, hook in enumerate(self.webhooks))


def mqtt_outputs_env(url: str, node: str = "embedded") -> dict[str, str]:
    """The environment that makes a gateway publish every result to `url` (`edgeinspect up --mqtt URL`): role
    settings read EDGEINSPECT_* variables, so no role's written config changes."""
    import json

    from edgeinspect.services.outputs.mqtt import broker_address

    broker_address(url)  # a malformed URL fails here, before any process starts
    return {"EDGEINSPECT_OUTPUTS": json.dumps({"mqtt": {"url": url, "node": node}})}
