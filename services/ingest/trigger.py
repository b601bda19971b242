"""The external trigger endpoint: POST /trigger/<camera_id>, as a PLC sends when a part is in position."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

logger = logging.getLogger(__name__)


class TriggerServer:
    """A stdlib HTTP server in a thread; `on_trigger(camera_id)` returns False for an unknown camera."""

    def __init__(self, host: str, port: int, on_trigger: Callable[[str], bool]) -> None:
        handler = _make_handler(on_trigger)
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


def _make_handler(on_trigger: Callable[[str], bool]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
            parts = self.path.strip("/").split("/")
            if len(parts) != 2 or parts[0] != "trigger":
                self._reply(404, {"error": "use POST /trigger/<camera_id>"})
                return
            # A body is allowed (some PLCs send one) but ignored; read it so the connection stays usable.
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(min(length, 65536))
            if on_trigger(parts[1]):
                self._reply(202, {"camera": parts[1], "triggered": True})
            else:
                self._reply(404, {"error": f"unknown camera {parts[1]!r}"})

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
            logger.debug("trigger http: " + format, *args)

    return Handler
