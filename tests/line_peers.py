"""Test-side peers of the line outputs: an MQTT subscriber (paho-mqtt) and a webhook receiver, both keeping what
they got."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import paho.mqtt.client as mqtt

from edgeinspect.services.outputs.webhook import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, verify

SECRET = "0123456789abcdef-secret"  # the webhook secret the tests' receivers share


class Subscriber:
    """A persistent-session subscriber (clean_session=False, QoS 1): messages published while it is cut off
    from a restarted broker are queued for it there, as for a line controller's client."""

    def __init__(self, port: int, topic: str, client_id: str) -> None:
        self.messages: list[tuple[str, dict, bool]] = []  # (topic, payload, retained)
        self._lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        self.subscribed = threading.Event()  # the broker acknowledged the subscription (SUBACK)
        self.client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
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

    def wait_subscribed(self, timeout_s: float = 10.0) -> None:
        """Until the broker holds the subscription: only then does it queue messages for this session."""
        if not self.subscribed.wait(timeout_s):
            raise AssertionError(f"the broker did not acknowledge the subscription within {timeout_s}s")

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


class Receiver:
    """A webhook receiver: verifies each signature, answers from `script` (then 200), records every request."""

    def __init__(self, script: list[int] | None = None, delay_s: float = 0.0) -> None:
        self.script = list(script or [])
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(receiver.delay_s)
                ok = verify(SECRET, self.headers[TIMESTAMP_HEADER], body, self.headers[SIGNATURE_HEADER])
                with receiver.lock:
                    status = receiver.script.pop(0) if receiver.script else 200
                    receiver.requests.append(
                        {"at": time.monotonic(), "id": self.headers[DELIVERY_HEADER], "ok": ok, "status": status,
                         "body": json.loads(body)}
                    )  # fmt: skip
                self.send_response(status if ok else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delivered(self) -> list[str]:
        with self.lock:
            return [r["id"] for r in self.requests if r["status"] == 200 and r["ok"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
