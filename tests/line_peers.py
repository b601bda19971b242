"""Test-side peers of the line outputs: an MQTT subscriber (paho-mqtt) that keeps every message it gets."""

from __future__ import annotations

import json
import threading
import time

import paho.mqtt.client as mqtt


class Subscriber:
    """A persistent-session subscriber (clean_session=False, QoS 1): messages published while it is cut off
    from a restarted broker are queued for it there, as for a line controller's client."""

    def __init__(self, port: int, topic: str, client_id: str) -> None:
        self.messages: list[tuple[str, dict, bool]] = []  # (topic, payload, retained)
        self._lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        self.client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(topic, qos=1)
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.1, 0.5)
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()

    def _on_message(self, _c, _u, msg) -> None:
        try:
            body = json.loads(msg.payload)
        except ValueError:
            body = {"raw": msg.payload.decode(errors="replace")}
        with self._lock:
            self.messages.append((msg.topic, body, bool(msg.retain)))

    def bodies(self) -> list[dict]:
        with self._lock:
            return [b for _, b, _ in self.messages]

    def unique_ids(self) -> list[str]:
        """Report ids in arrival order, redeliveries (at least once) removed."""
        return list(dict.fromkeys(b.get("report_id") for b in self.bodies()))

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; got {self.messages}")

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
