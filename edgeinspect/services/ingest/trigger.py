"""The external trigger endpoint: POST /trigger/<camera_id>, as a PLC sends when a part is in position.

Every trigger carries `Authorization: Bearer <token>` (trigger.token in cameras.yaml; 401 without it). Plain
POST answers 202 and inspects the next sampled frame; `?wait=1` captures the current frame, inspects it and
answers with the verdict JSON (within the station's takt budget when the camera has a `line:` block).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger(__name__)

# camera id -> (HTTP status, verdict JSON); raises KeyError for an unknown camera
Waiter = Callable[[str], tuple[int, dict]]


def token_matches(configured: str, presented: str) -> bool:
    """`configured` is the token itself or 'sha256:<hex>' of it (so cameras.yaml need not hold the secret)."""
    if not configured or not presented:
        return False
    if configured.startswith("sha256:"):
        digest = "sha256:" + hashlib.sha256(presented.encode()).hexdigest()
        return hmac.compare_digest(configured.lower(), digest)
    return hmac.compare_digest(configured.encode(), presented.encode())


class TriggerServer:
    """A stdlib HTTP server in a thread; `on_trigger(camera_id)` returns False for an unknown camera."""

    def __init__(
        self,
        host: str,
        port: int,
        on_trigger: Callable[[str], bool],
        token: str = "",
        on_wait: Waiter | None = None,
    ) -> None:
        if not token:
            logger.warning("trigger endpoint has no trigger.token configured: every trigger is refused (401)")
        handler = _make_handler(on_trigger, token, on_wait)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="ingest-trigger", daemon=True)

    def start(self) -> TriggerServer:
        self._thread.start()
        logger.info("trigger endpoint on http://%s:%d/trigger/<camera_id>", *self._server.server_address[:2])
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _make_handler(on_trigger: Callable[[str], bool], token: str, on_wait: Waiter | None) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            # A body is allowed (some PLCs send one) but ignored; read it so the connection stays usable.
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(min(length, 65536))
            if len(parts) != 2 or parts[0] != "trigger":
                self._reply(404, {"error": "use POST /trigger/<camera_id>"})
                return
            presented = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not token_matches(token, presented):
                why = "a valid bearer token" if token else "trigger.token to be configured in cameras.yaml"
                self._reply(401, {"error": f"this trigger endpoint needs {why}"}, {"WWW-Authenticate": "Bearer"})
                return
            camera = parts[1]
            if parse_qs(url.query).get("wait", ["0"])[0] not in ("", "0", "false") and on_wait is not None:
                try:
                    status, body = on_wait(camera)
                except KeyError:
                    self._reply(404, {"error": f"unknown camera {camera!r}"})
                    return
                except Exception as exc:  # the role stopping under a waiting trigger: the line must hear NG
                    logger.warning("trigger %s: %s", camera, exc)
                    self._reply(503, {"camera": camera, "line": "NG", "error": "unavailable"})
                    return
                self._reply(status, body)
            elif on_trigger(camera):
                self._reply(202, {"camera": camera, "triggered": True})
            else:
                self._reply(404, {"error": f"unknown camera {camera!r}"})

        def _reply(self, status: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
            logger.debug("trigger http: " + format, *args)

    return Handler
