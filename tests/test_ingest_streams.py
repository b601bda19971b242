"""Ingest against real streams served on loopback: a file, an image folder, HTTP MJPEG / MPEG-TS from ffmpeg,
RTSP from rtsp-server-perl, and a camera that dies, comes back, stalls or sends garbage."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from ingest_streams import (
    MjpegServer,
    RecordingSink,
    SilentPort,
    free_port,
    have,
    start_process,
    stop_process,
    video_jpegs,
    wait_listening,
)
from prometheus_client import CollectorRegistry

from edgeinspect.assets import asset_path
from edgeinspect.services.ingest.camera import CameraState
from edgeinspect.services.ingest.config import CameraConfig, IngestSettings, SamplingConfig
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.ingest.service import Ingestor

SAMPLE_CONFIG = asset_path("cameras.sample.yaml")


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    return video_jpegs(60)


def camera(id: str, source: str, **kw) -> CameraConfig:
    return CameraConfig(id=id, station="st", part="HSG-2040", source=source, **kw)


def settings_for(cameras: list[CameraConfig], tmp_path: Path, **kw) -> IngestSettings:
    return IngestSettings(cameras=cameras, frames_dir=tmp_path / "frames", **kw)


async def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def run_until(ingestor: Ingestor, pred: Callable[[], bool], timeout: float, what: str):
    """Runs the ingestor until pred() holds, then stops it; returns its result."""
    task = asyncio.create_task(ingestor.run())
    try:
        await wait_until(lambda: pred() or task.done(), timeout, what)
    finally:
        ingestor.stop()
    result = await asyncio.wait_for(task, 30)
    assert pred(), f"ingest ended before {what}"
    return result


def m(metrics: IngestMetrics, name: str, **labels: str) -> float:
    return metrics.value(f"edgeinspect_ingest_{name}", **labels)


async def test_sample_video_file_gives_one_report_per_part_and_saves_each_frame(tmp_path):
    settings = IngestSettings.load(SAMPLE_CONFIG, frames_dir=tmp_path / "frames")
    settings.cameras[0].realtime, settings.cameras[0].loop = False, False
    sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
    result = await asyncio.wait_for(Ingestor(settings, sink, metrics).run(), 60)
    assert result.states == {"conveyor-1": CameraState.finished}
    assert m(metrics, "frames_read_total", camera="conveyor-1") == 200
    assert len(result.reports) == 5  # five parts pass; the gaps (empty belt) and repeats are gated out
    assert len({r.idempotency_key for r in result.reports}) == 5
    assert all(r.idempotency_key.startswith("conveyor-1:") for r in result.reports)
    saved = sorted(p.stem for p in (tmp_path / "frames").glob("*/*.jpg"))
    assert saved == sorted(r.report_id for r in result.reports)


async def test_image_folder_is_read_in_name_order_and_unreadable_files_skipped(tmp_path, caplog):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, name in enumerate(["part_ok.jpg", "part_dent.jpg", "part_scratch.jpg"]):
        (folder / f"{i}.jpg").write_bytes(asset_path(name).read_bytes())
    (folder / "1b.jpg").write_bytes(b"not a jpeg at all")
    cam = camera("folder", str(folder), folder_fps=10)  # paced: an instant sink keeps up, nothing superseded
    sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
    with caplog.at_level(logging.WARNING):
        result = await asyncio.wait_for(Ingestor(settings_for([cam], tmp_path), sink, metrics).run(), 30)
    assert len(result.reports) == 3 and m(metrics, "frames_read_total", camera="folder") == 3
    assert "1b.jpg: not an image" in caplog.text


@pytest.mark.skipif(not have("ffmpeg"), reason="needs ffmpeg (apt-get install ffmpeg)")
@pytest.mark.parametrize("fmt", ["mpjpeg", "mpegts"])
async def test_http_stream_from_ffmpeg_is_sampled_every_nth_frame(tmp_path, fmt):
    port = free_port()
    url = f"http://127.0.0.1:{port}/cam"
    video = str(asset_path("conveyor.mp4"))
    codec = ["-c:v", "mjpeg", "-q:v", "5"] if fmt == "mpjpeg" else ["-c:v", "mpeg2video", "-q:v", "5"]
    ffmpeg = start_process(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-re", "-i", video, "-t", "6", *codec, "-f", fmt,
         "-listen", "1", url]
    )  # fmt: skip
    try:
        # `-listen 1` serves one client and exits when it leaves: a first open given up on (probing a stream takes
        # seconds of it, more on a loaded box) would leave nothing to reconnect to, so the open gets ffmpeg's whole run.
        cam = camera("http", url, sampling=SamplingConfig(every_n=5), open_timeout_s=40, reconnect_base_s=0.5)
        sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
        ingestor = Ingestor(settings_for([cam], tmp_path, max_in_flight=8), sink, metrics)
        ingestor.settings.cameras[0].max_in_flight = 8
        try:
            await run_until(ingestor, lambda: len(sink.reports) >= 4, 60, "4 reports over HTTP")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; ffmpeg {_ended(ffmpeg)}") from None
    finally:
        stop_process(ffmpeg)
    read = m(metrics, "frames_read_total", camera="http")
    assert m(metrics, "frames_sampled_total", camera="http") == math.ceil(read / 5)
    assert len(sink.reports) >= 4


def _ended(proc) -> str:
    """A stream server process when a test timed out waiting on it: still running, or its exit and stderr."""
    if proc.poll() is None:
        return "was still running"
    return f"exited {proc.returncode}: {proc.stderr.read().decode(errors='replace')[-800:]}"


@pytest.mark.skipif(not (have("ffmpeg") and have("rtsp-server-perl")), reason="needs ffmpeg and rtsp-server-perl")
async def test_rtsp_transport_is_chosen_per_camera(tmp_path):
    client_port, source_port, rtp_port = free_port(), free_port(), free_port()
    server = start_process(
        ["rtsp-server-perl", "-c", str(client_port), "-s", str(source_port), "--client_listen_address",
         "127.0.0.1", "--source_listen_address", "127.0.0.1", "--rtp_start_port", str(rtp_port), "-l", "1"]
    )  # fmt: skip
    push_args = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i",
                 str(asset_path("conveyor.mp4")), "-c:v", "mpeg4", "-f", "rtsp",
                 f"rtsp://127.0.0.1:{source_port}/line"]  # fmt: skip
    pushes: list = []
    try:
        # A loaded box can take seconds to start the perl server, and ffmpeg gives up for good when its first
        # publish fails (the stream then stays "404 Not Found"): wait for the ports, and restart a push that exited.
        wait_listening(source_port, 30)
        wait_listening(client_port, 30)
        pushes.append(start_process(push_args))

        def pushing() -> bool:
            if pushes[-1].poll() is not None:
                pushes.append(start_process(push_args))
            return True

        await asyncio.sleep(1.5)
        url = f"rtsp://127.0.0.1:{client_port}/line"
        cams = [
            camera("rtsp-udp", url, rtsp_transport="udp", open_timeout_s=5),
            # rtsp-server-perl only does RTP over UDP: a TCP camera must fail to open, and only that camera.
            camera("rtsp-tcp", url, rtsp_transport="tcp", open_timeout_s=2, reconnect_base_s=0.5),
        ]
        sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
        ingestor = Ingestor(settings_for(cams, tmp_path), sink, metrics)
        await run_until(
            ingestor,
            lambda: (
                pushing()
                and len(sink.reports) >= 1
                and m(metrics, "source_errors_total", camera="rtsp-tcp", kind="open_failed")
            ),
            90,  # the ffmpeg push may take a while to publish on a loaded box; the UDP camera keeps reconnecting
            "a report over RTSP/UDP and a failed RTSP/TCP open",
        )
    finally:
        for push in pushes:
            stop_process(push)
        stop_process(server)
    assert m(metrics, "frames_read_total", camera="rtsp-udp") > 0
    assert m(metrics, "frames_read_total", camera="rtsp-tcp") == 0


async def test_killed_camera_is_reconnected_within_the_backoff_bound(tmp_path, jpegs):
    server = MjpegServer(jpegs, fps=20).start()
    cam = camera("cam", server.url, open_timeout_s=1.0, stall_timeout_s=2.0, reconnect_base_s=0.2, reconnect_max_s=1.0)
    sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
    ingestor = Ingestor(settings_for([cam], tmp_path), sink, metrics)
    task = asyncio.create_task(ingestor.run())
    read = lambda: m(metrics, "frames_read_total", camera="cam")  # noqa: E731
    try:
        await wait_until(lambda: read() >= 10, 15, "first frames")
        server.stop()
        await wait_until(lambda: m(metrics, "reconnects_total", camera="cam") >= 2, 15, "failed reconnects")
        before = read()
        server.start()  # the same port: the camera rebooted
        back_at = time.monotonic()
        await wait_until(lambda: read() > before, 15, "frames after the restart")
        waited = time.monotonic() - back_at
    finally:
        ingestor.stop()
        await asyncio.wait_for(task, 30)
        server.stop()
    # Worst case: one full backoff delay (capped at reconnect_max_s) plus one open; 2 s slack for a busy box.
    assert waited <= cam.reconnect_max_s + cam.open_timeout_s + 2.0
    assert ingestor.readers["cam"].opens >= 2


async def test_stalled_stream_is_caught_by_the_watchdog_and_reopened(tmp_path, jpegs, caplog):
    server = MjpegServer(jpegs, fps=30).start()
    server.stall_after = 8  # each connection: 8 frames, then an open socket that sends nothing
    cam = camera("cam", server.url, stall_timeout_s=1.0, reconnect_base_s=0.1, reconnect_max_s=0.5)
    sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
    ingestor = Ingestor(settings_for([cam], tmp_path), sink, metrics)
    try:
        with caplog.at_level(logging.WARNING):
            await run_until(
                ingestor,
                lambda: m(metrics, "source_errors_total", camera="cam", kind="stalled") >= 2,
                20,
                "two watchdog reopens",
            )
    finally:
        server.stop()
    assert server.connections >= 2 and ingestor.readers["cam"].opens >= 2
    assert m(metrics, "frames_read_total", camera="cam") >= 16  # frames came again after each reopen
    assert "watchdog: no frame" in caplog.text


async def test_bad_sources_are_logged_and_counted_while_other_cameras_go_on(tmp_path, jpegs, caplog):
    silent = SilentPort()
    garbage = MjpegServer(jpegs, fps=20)
    garbage.garbage = True
    garbage.start()
    not_video = tmp_path / "notes.mp4"
    not_video.write_text("this is a text file, not a video\n" * 50)
    cams = [
        camera("silent", f"http://127.0.0.1:{silent.port}/video.mjpg", open_timeout_s=1.0, reconnect_base_s=0.2),
        camera("notvideo", str(not_video)),
        camera("garbage", garbage.url, open_timeout_s=1.0, stall_timeout_s=1.0, reconnect_base_s=0.2),
        camera("good", str(asset_path("conveyor.mp4")), realtime=False),
    ]
    sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
    ingestor = Ingestor(settings_for(cams, tmp_path), sink, metrics)
    try:
        with caplog.at_level(logging.WARNING):
            result = await run_until(
                ingestor,
                lambda: (
                    "good" in ingestor.readers
                    and ingestor.readers["good"].state is CameraState.finished
                    and m(metrics, "source_errors_total", camera="silent", kind="open_failed") >= 1
                    and m(metrics, "reconnects_total", camera="garbage") >= 1
                ),
                30,
                "the good camera to finish and the bad ones to fail",
            )
    finally:
        silent.close()
        garbage.stop()
    assert m(metrics, "frames_read_total", camera="good") == 200
    inspected = m(metrics, "frames_inspected_total", camera="good")
    assert inspected == len(result.reports) > 0
    # every frame is sampled here: each one is inspected, superseded, or (stopped right after the last was read)
    # still waiting or in flight when the role stopped
    dropped = sum(m(metrics, "frames_dropped_total", camera="good", reason=r) for r in ("superseded", "stopped"))
    assert inspected + dropped == 200
    assert result.states["notvideo"] is CameraState.failed
    assert m(metrics, "source_errors_total", camera="notvideo", kind="invalid") == 1
    assert m(metrics, "frames_read_total", camera="silent") == 0
    assert m(metrics, "frames_read_total", camera="garbage") == 0
    assert "is not a video OpenCV/FFmpeg can decode" in caplog.text
    assert f"could not open http://127.0.0.1:{silent.port}/video.mjpg" in caplog.text


async def test_trigger_endpoint_inspects_the_next_frame(tmp_path, jpegs):
    server = MjpegServer(jpegs, fps=20).start()
    cam = camera("plc-cam", server.url, sampling=SamplingConfig(trigger_only=True))
    sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
    ingestor = Ingestor(settings_for([cam], tmp_path, trigger={"port": 0, "token": "plc-secret"}), sink, metrics)
    task = asyncio.create_task(ingestor.run())

    def post(path: str) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{ingestor.trigger_port}{path}", data=b"", method="POST")
        req.add_header("Authorization", "Bearer plc-secret")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        await wait_until(lambda: m(metrics, "frames_read_total", camera="plc-cam") >= 20, 15, "frames")
        assert not sink.reports
        assert await asyncio.to_thread(post, "/trigger/plc-cam") == 202
        await wait_until(lambda: len(sink.reports) == 1, 10, "the triggered report")
        await asyncio.sleep(0.5)
        assert len(sink.reports) == 1  # one trigger, one inspection
        assert await asyncio.to_thread(post, "/trigger/nope") == 404
    finally:
        ingestor.stop()
        await asyncio.wait_for(task, 30)
        server.stop()


async def test_slow_gateway_bounds_in_flight_and_counts_superseded_frames(tmp_path):
    video = str(asset_path("conveyor.mp4"))
    cams = [camera(c, video, realtime=False, max_in_flight=2) for c in ("a", "b")]
    sink, metrics = RecordingSink(delay_s=0.2), IngestMetrics(CollectorRegistry())
    settings = settings_for(cams, tmp_path, max_in_flight=3)
    result = await asyncio.wait_for(Ingestor(settings, sink, metrics).run(), 60)
    assert max(sink.max_running.values()) <= 2 and sink.max_total <= 3
    for c in ("a", "b"):
        sampled = m(metrics, "frames_sampled_total", camera=c)
        inspected = m(metrics, "frames_inspected_total", camera=c)
        dropped = m(metrics, "frames_dropped_total", camera=c, reason="superseded")
        assert sampled == 200 and dropped > 0
        assert inspected + dropped == sampled  # every sampled frame is either inspected or counted as dropped
    assert len(result.reports) == len(sink.reports)


async def test_gateway_outage_drops_and_counts_then_resumes_without_duplicates(tmp_path, jpegs):
    server = MjpegServer(jpegs, fps=20).start()
    cam = camera("cam", server.url, sampling=SamplingConfig(max_rate_hz=5))
    sink, metrics = RecordingSink(), IngestMetrics(CollectorRegistry())
    settings = settings_for([cam], tmp_path, retry_attempts=3, retry_base_s=0.1, retry_max_s=0.2)
    ingestor = Ingestor(settings, sink, metrics)
    task = asyncio.create_task(ingestor.run())
    try:
        await wait_until(lambda: len(sink.reports) >= 2, 15, "reports before the outage")
        sink.down = True
        await wait_until(
            lambda: m(metrics, "frames_dropped_total", camera="cam", reason="delivery_failed") >= 2, 15, "drops"
        )
        during = len(sink.reports)
        sink.down = False
        await wait_until(lambda: len(sink.reports) >= during + 3, 15, "reports after the outage")
    finally:
        ingestor.stop()
        result = await asyncio.wait_for(task, 30)
        server.stop()
    assert m(metrics, "delivery_errors_total", camera="cam", code="UNAVAILABLE") >= 2
    keys = [job.idempotency_key for job in sink.calls]
    assert max(keys.count(k) for k in keys) >= 2  # retries happened, and they reused the frame's key
    assert len({r.report_id for r in result.reports}) == len(result.reports)  # no report twice
    assert m(metrics, "frames_inspected_total", camera="cam") == len(result.reports)
