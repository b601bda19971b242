"""The HTTP trigger: a bearer token, and `?wait=1` answering with the verdict of the frame captured now, within
the station's takt budget (a miss: 504 with the fail-safe NG; the report still arrives later)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import urllib.error
import urllib.request

from ingest_streams import RecordingSink
from line_peers import SECRET, Receiver
from prometheus_client import CollectorRegistry

from edgeinspect.assets import sample_image
from edgeinspect.services.ingest.config import CameraConfig, IngestSettings
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.ingest.service import Ingestor
from edgeinspect.services.line.journal import CycleJournal

TOKEN = "plc-secret-0123"


def part_folder(tmp_path):
    folder = tmp_path / "cam"
    folder.mkdir()
    shutil.copy(sample_image(), folder / "part.jpg")
    return str(folder)


def settings(tmp_path, token: str = TOKEN, outputs: dict | None = None, **line) -> IngestSettings:
    cam = CameraConfig(
        id="plc-cam",
        station="station-3",
        part="HSG-210",
        source=part_folder(tmp_path),
        loop=True,
        folder_fps=20,
        sampling={"trigger_only": True},
        line=line or None,
    )
    return IngestSettings(
        cameras=[cam], frames_dir=tmp_path / "frames", trigger={"port": 0, "token": token}, outputs=outputs or {}
    )


def post(port: int, path: str, token: str | None = TOKEN) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def running(cfg: IngestSettings, sink: RecordingSink):
    ingestor = Ingestor(cfg, sink, IngestMetrics(CollectorRegistry()))
    task = asyncio.create_task(ingestor.run())
    for _ in range(100):
        if ingestor.trigger_port:
            break
        await asyncio.sleep(0.05)
    return ingestor, task


async def test_trigger_without_the_token_is_refused_and_wait_returns_the_verdict(tmp_path):
    sink = RecordingSink()
    ingestor, task = await running(settings(tmp_path), sink)
    port = ingestor.trigger_port
    try:
        assert (await asyncio.to_thread(post, port, "/trigger/plc-cam", None))[0] == 401
        assert (await asyncio.to_thread(post, port, "/trigger/plc-cam", "wrong"))[0] == 401
        status, body = await asyncio.to_thread(post, port, "/trigger/plc-cam?wait=1")
        assert status == 200, body
        assert body["verdict"] == "OK" and body["line"] == "OK" and body["error"] == "none"
        assert body["report_id"] == sink.reports[body["cycle_id"]].report_id  # the cycle id is the idempotency key
        assert len(sink.calls) == 1 and sink.calls[0].station == "station-3"
        assert (await asyncio.to_thread(post, port, "/trigger/nope?wait=1"))[0] == 404
        # Journaled like an OPC UA cycle (the journal beside the outbox when no OPC UA server is configured).
        row = CycleJournal(tmp_path / "line.sqlite").get(body["cycle_id"])
        assert row is not None and (row["station"], row["line"], row["error"], row["late"]) == ("station-3", "OK", 0, 0)
        assert row["report_id"] == body["report_id"] and row["verdict"] == "OK" and row["written_ms"] > 0
    finally:
        ingestor.stop()
        await asyncio.wait_for(task, 30)


async def test_a_hashed_token_in_cameras_yaml_accepts_the_token(tmp_path):
    hashed = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()
    ingestor, task = await running(settings(tmp_path, token=hashed), RecordingSink())
    try:
        assert (await asyncio.to_thread(post, ingestor.trigger_port, "/trigger/plc-cam"))[0] == 202
    finally:
        ingestor.stop()
        await asyncio.wait_for(task, 30)


async def test_a_missed_takt_budget_answers_ng_timeout_and_the_report_still_arrives(tmp_path):
    sink = RecordingSink(delay_s=1.5)  # slower than the 500 ms budget
    ingestor, task = await running(settings(tmp_path, result_deadline_ms=500), sink)
    try:
        t0 = asyncio.get_running_loop().time()
        status, body = await asyncio.to_thread(post, ingestor.trigger_port, "/trigger/plc-cam?wait=1")
        waited = asyncio.get_running_loop().time() - t0
        assert status == 504 and body["line"] == "NG" and body["error"] == "timeout"
        assert 0.4 < waited < 1.4  # at the deadline, not when the report came
        for _ in range(60):
            if body["cycle_id"] in sink.reports:
                break
            await asyncio.sleep(0.05)
        assert body["cycle_id"] in sink.reports  # the late report was made, under the cycle's key
        journal = CycleJournal(tmp_path / "line.sqlite")
        for _ in range(60):
            if (row := journal.get(body["cycle_id"]))["report_id"]:
                break
            await asyncio.sleep(0.05)
        assert (row["line"], row["error"], row["late"]) == ("NG", 1, 1)  # told NG timeout, then linked late
        assert row["report_id"] == sink.reports[body["cycle_id"]].report_id
    finally:
        ingestor.stop()
        await asyncio.wait_for(task, 30)


async def test_ingest_hosted_outputs_send_each_report_with_what_the_line_was_told(tmp_path):
    receiver = Receiver()
    outputs = {"webhooks": [{"url": receiver.url, "secret": SECRET}], "retry_base_s": 0.1}
    ingestor, task = await running(settings(tmp_path, outputs=outputs, on_uncertain="recheck"), RecordingSink())
    try:
        status, body = await asyncio.to_thread(post, ingestor.trigger_port, "/trigger/plc-cam?wait=1")
        assert status == 200
        for _ in range(100):
            if receiver.delivered():
                break
            await asyncio.sleep(0.05)
    finally:
        ingestor.stop()
        await asyncio.wait_for(task, 30)
        receiver.close()
    assert receiver.delivered() == [body["report_id"]]
    sent = receiver.requests[0]["body"]
    assert sent["station"] == "station-3" and sent["camera"] == "plc-cam" and sent["verdict"] == "OK"
    assert sent["line"] == {"cycle_id": body["cycle_id"], "line": "OK"} and sent["latency_ms"] >= 0
