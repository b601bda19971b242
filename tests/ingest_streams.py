"""Local camera stand-ins for the ingest tests: an MJPEG-over-HTTP server that can stall, die and come back,
a loopback port that accepts and never answers, a RecordingSink, and ffmpeg / rtsp-server-perl launchers."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2

from edgeinspect.assets import asset_path
from edgeinspect.errors import Unavailable
from edgeinspect.services.ingest.delivery import InspectionJob, ReportSummary


def video_jpegs(limit: int = 200) -> list[bytes]:
    """The sample conveyor video's frames as JPEG bytes (what an MJPEG camera sends)."""
    cap = cv2.VideoCapture(str(asset_path("conveyor.mp4")))
    out = []
    while len(out) < limit:
        ok, image = cap.read()
        if not ok:
            break
        out.append(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])[1].tobytes())
    cap.release()
    return out


class MjpegServer:
    """multipart/x-mixed-replace JPEG stream on 127.0.0.1; `stall_after` frames per connection, then silence
    with the socket left open; `garbage` sends bytes that are no JPEG; stop()/start() kill and revive it."""

    def __init__(self, frames: list[bytes], fps: float = 20.0, port: int = 0) -> None:
        self.frames = frames
        self.fps = fps
        self.port = port
        self.stall_after: int | None = None
        self.garbage = False
        self.connections = 0
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/video.mjpg"

    def start(self) -> MjpegServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.connections += 1
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                sent = 0
                try:
                    while not owner._stopping.is_set():
                        if owner.stall_after is not None and sent >= owner.stall_after:
                            owner._stopping.wait(0.05)  # open socket, no frames
                            continue
                        jpeg = owner.frames[sent % len(owner.frames)]
                        if owner.garbage:
                            jpeg = bytes((i * 7919) % 251 for i in range(len(jpeg)))
                        head = b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpeg)
                        self.wfile.write(head + jpeg + b"\r\n")
                        self.wfile.flush()
                        sent += 1
                        time.sleep(1.0 / owner.fps)
                except (BrokenPipeError, ConnectionResetError):
                    return

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._stopping.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Kills the camera: stops accepting and ends every open stream."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class SilentPort:
    """A loopback port that accepts connections and never sends a byte."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        for conn in self._conns:
            conn.close()


class RecordingSink:
    """A ReportSink that behaves like an idempotent report store: one report per idempotency key; `down` makes
    every call fail with UNAVAILABLE; `delay_s` makes calls slow; tracks the highest concurrency seen."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.down = False
        self.calls: list[InspectionJob] = []
        self.reports: dict[str, ReportSummary] = {}
        self.running: dict[str, int] = {}
        self.max_running: dict[str, int] = {}
        self.max_total = 0

    async def inspect(self, job: InspectionJob) -> ReportSummary:
        self.calls.append(job)
        if self.down:
            raise Unavailable("gateway down (RecordingSink.down)")
        self.running[job.camera_id] = self.running.get(job.camera_id, 0) + 1
        self.max_running[job.camera_id] = max(self.max_running.get(job.camera_id, 0), self.running[job.camera_id])
        self.max_total = max(self.max_total, sum(self.running.values()))
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.running[job.camera_id] -= 1
        if job.idempotency_key not in self.reports:
            self.reports[job.idempotency_key] = ReportSummary(
                report_id=f"r{len(self.reports):05d}",
                verdict="OK",
                part=job.part,
                camera_id=job.camera_id,
                idempotency_key=job.idempotency_key,
            )
        return self.reports[job.idempotency_key]

    async def close(self) -> None:
        pass


def free_port() -> int:
    """A port free right now on 127.0.0.1, for servers (ffmpeg, rtsp-server-perl) that cannot bind port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float) -> None:
    """Until something accepts TCP connections on 127.0.0.1:port (a server process that binds after a while)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listened on port {port} within {timeout}s") from None
            time.sleep(0.1)


def have(binary: str) -> bool:
    return shutil.which(binary) is not None


def start_process(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
