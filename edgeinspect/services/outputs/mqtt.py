"""MQTT output (aiomqtt): each result on its topic with QoS 1, the station's last verdict retained, a station's
drift alerts on their own topic, and a retained online/offline status that the broker flips to offline (the Last
Will) when this node drops."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from urllib.parse import urlsplit

import aiomqtt

from edgeinspect.errors import InvalidInput
from edgeinspect.services.outputs.config import MqttConfig
from edgeinspect.services.outputs.result import DRIFT, EXPLAINED

logger = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 2.0  # closing a broken connection (best effort)
PUBLISH_TIMEOUT_S = 5.0  # no PUBACK by then: the connection is treated as broken and the result sent again
_TOPIC_UNSAFE = str.maketrans({"/": "_", "+": "_", "#": "_"})


def broker_address(url: str) -> tuple[str, int, bool]:
    """mqtt://host[:port] or mqtts://host[:port] -> (host, port, tls)."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise InvalidInput(f"MQTT url must look like mqtt://host:port or mqtts://host:port, got {url!r}")
    tls = parts.scheme == "mqtts"
    return parts.hostname, parts.port or (8883 if tls else 1883), tls


def topic_level(value: str) -> str:
    """One topic level from a station/camera/part name: never empty, never a wildcard or a separator."""
    return (value.translate(_TOPIC_UNSAFE) or "none")[:64]


def result_topics(cfg: MqttConfig, result: dict) -> tuple[str, str | None]:
    """(topic, retained last-verdict topic or None) for one result; an explanation or a drift alert goes to its own
    topic and leaves the station's last verdict as its decision set it."""
    levels = {k: topic_level(str(result.get(k) or "")) for k in ("station", "camera", "part")}
    if result.get("event") == EXPLAINED:
        return cfg.explained_topic.format(**levels), None
    if result.get("event") == DRIFT:
        return cfg.drift_topic.format(**levels), None
    last = cfg.last_topic.format(**levels) if cfg.last_topic else None
    return cfg.topic.format(**levels), last


class MqttOutput:
    def __init__(self, cfg: MqttConfig, name: str = "mqtt") -> None:
        self.cfg = cfg
        self.name = name
        self.host, self.port, self._tls = broker_address(cfg.url)
        self.peer = f"MQTT broker {self.host}:{self.port}"
        self.status_topic = cfg.status_topic.format(node=topic_level(cfg.node))
        self._client: aiomqtt.Client | None = None

    def _make_client(self) -> aiomqtt.Client:
        cfg = self.cfg
        tls_context = None
        if self._tls:
            tls_context = ssl.create_default_context(cafile=str(cfg.ca_file) if cfg.ca_file else None)
            if cfg.cert_file is not None:
                tls_context.load_cert_chain(str(cfg.cert_file), str(cfg.key_file) if cfg.key_file else None)
        return aiomqtt.Client(
            self.host,
            self.port,
            username=cfg.username or None,
            password=cfg.password or None,
            identifier=f"edgeinspect-{topic_level(cfg.node)}-{self.name}",
            will=aiomqtt.Will(self.status_topic, b"offline", qos=1, retain=True),
            keepalive=cfg.keepalive_s,
            timeout=cfg.connect_timeout_s,
            tls_context=tls_context,
        )

    async def _connected(self) -> aiomqtt.Client:
        if self._client is None:
            client = self._make_client()
            await client.__aenter__()
            self._client = client
            await client.publish(self.status_topic, b"online", qos=1, retain=True, timeout=PUBLISH_TIMEOUT_S)
            logger.info("mqtt output connected to %s:%d", self.host, self.port)
        return self._client

    async def send(self, key: str, payload: bytes) -> None:
        try:
            client = await self._connected()
            topic, last = result_topics(self.cfg, json.loads(payload))
            await client.publish(topic, payload, qos=self.cfg.qos, timeout=PUBLISH_TIMEOUT_S)
            if last is not None:
                await client.publish(last, payload, qos=1, retain=True, timeout=PUBLISH_TIMEOUT_S)
        except (aiomqtt.MqttError, OSError, TimeoutError) as exc:
            await self._drop_connection()
            raise ConnectionError(f"MQTT broker {self.host}:{self.port}: {exc}") from exc

    async def _drop_connection(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:  # bounded: closing a connection the broker dropped must never stall the delivery loop
                await asyncio.wait_for(client.__aexit__(None, None, None), CLOSE_TIMEOUT_S)
            except Exception as exc:  # the connection is already broken; closing it is best effort
                logger.debug("mqtt output: closing a broken connection: %s", exc)

    async def close(self) -> None:
        """A clean shutdown: the status says offline (a clean disconnect does not fire the Last Will)."""
        if self._client is not None:
            with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                await self._client.publish(self.status_topic, b"offline", qos=1, retain=True, timeout=2.0)
        await self._drop_connection()
