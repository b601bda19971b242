"""The vision node's anomaly gate as a separate OS process: Teach, Score, Info.banks, refusals and reloads."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import NamedTuple

import cv2
import grpc
import numpy as np
import pytest
from PIL import Image
from vision_images import png_bomb

from edgeinspect.config import ServerConfig, write_yaml
from edgeinspect.models.anomaly.bank import BankStore
from edgeinspect.models.anomaly.features import open_extractor
from edgeinspect.models.anomaly.teach import teach
from edgeinspect.services.common.channel import wait_for_serving
from edgeinspect.services.vision.settings import AnomalyExtractor, AnomalySettings, VisionBackend, VisionSettings
from edgeinspect.v1 import vision_pb2, vision_pb2_grpc

START_TIMEOUT_S = 180.0
RELOAD_S = 0.5
PART = "tile"
SIZE = 160
DEFECT_BOX = (96, 40, 124, 68)  # x0, y0, x1, y1 px of the drawn stain
# A part seen by a station camera at its own resolution: the node's settings name where it sits in the frame.
CAMERA_PART, CAMERA_SIZE, CAMERA_ROI = "housing", (720, 960), (160, 120, 560, 420)  # (h, w); x, y, w, h


def weave(height: int, width: int, rng: np.random.Generator, cast=(0, 0, 0)) -> np.ndarray:
    """The woven texture (a grating and a checker) over height x width, shifted a few px, with sensor noise."""
    y, x = np.mgrid[0 : height + 16, 0 : width + 16].astype(np.float32)
    base = 128 + 40 * np.sin(2 * np.pi * x / 12) * np.cos(2 * np.pi * y / 16)
    base += 20 * (((x // 22) + (y // 22)) % 2 * 2 - 1)
    rgb = np.stack([base, base * 0.9 + 10, base * 0.8 + 20], -1) + np.array(cast, np.float32)
    dx, dy = rng.integers(0, 2, 2)
    frame = rgb[dy : dy + height, dx : dx + width] + rng.normal(0, 3, (height, width, 3))
    return np.clip(frame, 0, 255).astype(np.uint8)


def good_frame(rng: np.random.Generator, cast: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """A woven texture (a grating and a checker), shifted a few px, with sensor noise; `cast` tints it."""
    return weave(SIZE, SIZE, rng, cast)


def defect_frame(rng: np.random.Generator) -> np.ndarray:
    frame = good_frame(rng).copy()
    x0, y0, x1, y1 = DEFECT_BOX
    cv2.ellipse(frame, ((x0 + x1) // 2, (y0 + y1) // 2), ((x1 - x0) // 2, (y1 - y0) // 2), 0, 0, 360, (40, 30, 20), -1)
    return frame


def png(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame, "RGB").save(buf, "PNG")
    return buf.getvalue()


class Node(NamedTuple):
    stub: vision_pb2_grpc.VisionServiceStub
    store: BankStore
    metrics_port: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def node(tiny_checkpoint, tmp_path_factory):
    """A vision node (torch tiny tower) whose gate teaches raw-pixel banks in its own banks folder."""
    folder = tmp_path_factory.mktemp("vision-anomaly")
    banks = folder / "banks"
    cfg = VisionSettings(
        checkpoint=tiny_checkpoint,
        backend=VisionBackend.torch,
        threads=1,
        anomaly=AnomalySettings(
            banks_dir=banks,
            extractor=AnomalyExtractor.raw_pixel,
            reload_interval_s=RELOAD_S,
            max_teach_frames=40,
            regions={CAMERA_PART: CAMERA_ROI},
        ),
        server=ServerConfig(host="127.0.0.1", port=0, metrics_port=free_port(), port_file=folder / "port"),
    )
    write_yaml(cfg, folder / "vision.yaml")
    with (folder / "vision.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "edgeinspect.services.vision", "--config", str(folder / "vision.yaml")],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (folder / "port").is_file():
            assert process.poll() is None, (folder / "vision.log").read_text()
            assert time.monotonic() < deadline, "vision node wrote no port file"
            time.sleep(0.1)
        address = f"127.0.0.1:{(folder / 'port').read_text().strip()}"
        asyncio.run(wait_for_serving(address, START_TIMEOUT_S))
        with grpc.insecure_channel(address) as channel:
            yield Node(vision_pb2_grpc.VisionServiceStub(channel), BankStore(banks), cfg.server.metrics_port)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def one_thread():
    """Teaching in this process (as `edgeinspect anomaly teach` would) on one thread: FAISS's and torch's spinning
    pools made it ~10x slower on a loaded 2-core box."""
    import faiss
    import torch

    threads = faiss.omp_get_max_threads(), torch.get_num_threads()
    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads[0])
    torch.set_num_threads(threads[1])


@pytest.fixture(scope="module")
def taught(node):
    """PART taught over the Teach RPC from 10 drawn good frames."""
    stub = node.stub
    rng = np.random.default_rng(0)
    reply = stub.Teach(vision_pb2.TeachRequest(part=PART, frames=[png(good_frame(rng)) for _ in range(10)]), timeout=60)
    return reply


def metric(node: Node, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10).read().decode()
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def score(stub, frame: np.ndarray, part: str = PART, **kw) -> vision_pb2.AnomalyScore:
    return stub.Score(vision_pb2.ScoreRequest(image=png(frame), part=part, **kw), timeout=30)


def refused(call, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kw)
    return info.value


def banks(stub) -> dict[str, vision_pb2.AnomalyBank]:
    return {b.part: b for b in stub.Info(vision_pb2.InfoRequest(), timeout=10).banks}


def wait_for(predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def current_file(store: BankStore, part: str) -> str:
    return (store.root / part / "CURRENT").read_text()


def test_teach_publishes_version_1_and_info_lists_it(node, taught):
    stub, store = node.stub, node.store
    assert taught.bank.part == PART and taught.bank.version == 1 and taught.bank.frames == 10
    assert not taught.outliers
    assert taught.bank.extractor == "raw-pixel" and taught.bank.bank_id.startswith(f"{PART}@v1:")
    listed = banks(stub)[PART]
    assert listed == taught.bank
    assert store.current(PART).bank_id == taught.bank.bank_id


def test_a_good_frame_scores_normal_below_the_threshold(node, taught):
    stub = node.stub
    reply = score(stub, good_frame(np.random.default_rng(100)))
    assert reply.verdict == vision_pb2.ANOMALY_VERDICT_OK
    assert reply.score < reply.threshold and reply.band_low <= reply.threshold <= reply.band_high
    assert reply.bank_id == taught.bank.bank_id and reply.extractor_fingerprint == taught.bank.extractor_fingerprint
    assert not reply.regions and reply.heatmap_png == b""  # no heatmap unless asked


def test_a_drawn_defect_is_anomalous_with_a_region_over_it_and_a_heatmap(node, taught):
    stub = node.stub
    reply = score(stub, defect_frame(np.random.default_rng(101)), heatmap=True)
    assert reply.verdict == vision_pb2.ANOMALY_VERDICT_DEFECT and reply.score > reply.threshold
    x0, y0, x1, y1 = (v / SIZE for v in DEFECT_BOX)
    top = reply.regions[0]
    assert top.x < x1 and top.x + top.width > x0 and top.y < y1 and top.y + top.height > y0, top
    heatmap = Image.open(io.BytesIO(reply.heatmap_png))
    assert heatmap.format == "PNG" and heatmap.size == (SIZE, SIZE)


def test_expect_bank_id_of_another_version_is_failed_precondition(node, taught):
    stub = node.stub
    frame = good_frame(np.random.default_rng(102))
    assert score(stub, frame, expect_bank_id=taught.bank.bank_id).bank_id == taught.bank.bank_id
    error = refused(score, stub, frame, PART, expect_bank_id=f"{PART}@v7:00000000")
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"{PART}@v7:00000000" in error.details() and taught.bank.bank_id in error.details()


def test_an_unknown_part_is_not_found_naming_it(node, taught):
    stub = node.stub
    error = refused(score, stub, good_frame(np.random.default_rng(103)), "gasket")
    assert error.code() is grpc.StatusCode.NOT_FOUND and "'gasket'" in error.details()


@pytest.mark.parametrize(
    ("frames", "message", "modes"),
    [
        ([], "got 0", (False, True)),
        ([png(good_frame(np.random.default_rng(104)))], "at least 5 good frames, got 1", (False,)),
        (
            [png(good_frame(np.random.default_rng(105)))] * 5 + [png(good_frame(np.random.default_rng(5)))[:300]],
            "frame 5: truncated or corrupt image",
            (False, True),
        ),  # fmt: skip
        (
            [png(good_frame(np.random.default_rng(106)))] * 5 + [png_bomb(12000, 12000)],
            "frame 5: image is 12000x12000 = 144000000 pixels, over this node's limit",
            (False, True),
        ),  # fmt: skip
    ],
    ids=["no-frames", "one-frame", "corrupt", "12000x12000"],
)
def test_a_refused_teach_is_invalid_argument_and_current_stays(node, taught, frames, message, modes):
    """Refused as a fresh teach and (where adding them would be wrong too) as an addition to the current bank."""
    stub, store = node.stub, node.store
    before = current_file(store, PART)
    for add in modes:
        error = refused(stub.Teach, vision_pb2.TeachRequest(part=PART, frames=frames, add_to_current=add))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert message in error.details(), error.details()
    assert current_file(store, PART) == before
    assert banks(stub)[PART].bank_id == taught.bank.bank_id


def test_a_bank_taught_with_another_extractors_fingerprint_is_refused_with_the_reason(node, taught, one_thread):
    stub, store = node.stub, node.store
    rng = np.random.default_rng(7)
    bank, _ = teach([(f"g{i}", good_frame(rng)) for i in range(6)], open_extractor("raw-pixel"), "alien")
    store.publish(dataclasses.replace(bank, fingerprint="0123456789abcdef"))

    def refusal() -> grpc.RpcError | None:
        error = refused(score, stub, good_frame(rng), "alien")
        return None if error.code() is grpc.StatusCode.NOT_FOUND else error

    error = wait_for(refusal, 10 * RELOAD_S + 5)
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "fingerprint 0123456789abcdef" in error.details() and "re-teach" in error.details(), error.details()
    assert "alien" not in banks(stub)


def test_add_to_current_makes_the_next_version_and_the_added_frames_then_score_normal(node, taught):
    stub, store = node.stub, node.store
    rng = np.random.default_rng(8)
    # A tinted batch of good parts (a new coil of material): the bank has never seen the tint.
    tinted = [good_frame(rng, cast=(30, 0, -30)) for _ in range(5)]
    version = banks(stub)[PART].version
    assert score(stub, tinted[0]).verdict != vision_pb2.ANOMALY_VERDICT_OK
    reply = stub.Teach(vision_pb2.TeachRequest(part=PART, frames=[png(f) for f in tinted], add_to_current=True))
    assert reply.bank.version == version + 1 and reply.bank.frames == 15 and not reply.outliers
    assert banks(stub)[PART] == reply.bank and store.current(PART).bank_id == reply.bank.bank_id
    assert metric(node, "edgeinspect_anomaly_bank_version", f'part="{PART}"') == version + 1
    flagged = metric(node, "edgeinspect_anomaly_scores_total", f'part="{PART}",verdict="DEFECT"')
    for frame in tinted:
        assert score(stub, frame, expect_bank_id=reply.bank.bank_id).verdict == vision_pb2.ANOMALY_VERDICT_OK
    assert score(stub, good_frame(rng)).verdict == vision_pb2.ANOMALY_VERDICT_OK  # still knows the plain part
    assert score(stub, defect_frame(rng)).verdict == vision_pb2.ANOMALY_VERDICT_DEFECT
    assert metric(node, "edgeinspect_anomaly_scores_total", f'part="{PART}",verdict="DEFECT"') == flagged + 1
    assert metric(node, "edgeinspect_anomaly_teaches_total", 'result="published"') >= 2


def test_a_version_published_on_disk_by_another_process_is_picked_up(node, taught, one_thread):
    stub, store = node.stub, node.store
    rng = np.random.default_rng(9)
    extractor = open_extractor("raw-pixel")
    for expected in (1, 2):
        bank, _ = teach([(f"g{i}", good_frame(rng)) for i in range(6)], extractor, "washer")
        published = store.publish(bank)
        assert published.version == expected
        start = time.monotonic()
        bank_id = published.bank_id
        wait_for(lambda: banks(stub).get("washer", vision_pb2.AnomalyBank()).bank_id == bank_id, 10)  # noqa: B023
        assert time.monotonic() - start < RELOAD_S + 2.0
    assert score(stub, good_frame(rng), "washer").bank_id == published.bank_id


def test_a_part_with_a_region_is_tiled_at_camera_resolution_and_scored_there_only(node):
    """The node's settings give CAMERA_PART a region: Teach tiles it from camera frames, Score finds a 12 px stain
    inside it in camera coordinates, looks nowhere else, and "add to good set" re-teaches from the kept frames."""
    stub, rng = node.stub, np.random.default_rng(7)
    height, width = CAMERA_SIZE
    reply = stub.Teach(vision_pb2.TeachRequest(part=CAMERA_PART, frames=[png(weave(height, width, rng))
                                                                          for _ in range(8)]), timeout=120)  # fmt: skip
    bank = node.store.current(CAMERA_PART)
    tiles = bank.extractor["options"]["tiles"]
    assert tiles["roi"] == list(CAMERA_ROI) and tiles["camera"] == [height, width] and bank.stats["tiles"] > 1
    assert reply.bank.bank_id == bank.bank_id

    def stained(cx: int, cy: int) -> np.ndarray:
        frame = weave(height, width, rng)
        cv2.circle(frame, (cx, cy), 6, (40, 30, 20), -1)
        return frame

    inside = score(stub, stained(420, 300), part=CAMERA_PART, heatmap=True)
    assert inside.verdict == vision_pb2.ANOMALY_VERDICT_DEFECT
    top = inside.regions[0]  # fractions of the camera frame
    assert top.x <= 420 / width <= top.x + top.width and top.y <= 300 / height <= top.y + top.height, top
    assert top.width * width < 80 and top.height * height < 80  # a box around a 12 px stain
    assert Image.open(io.BytesIO(inside.heatmap_png)).size == (width, height)
    outside = score(stub, stained(60, 60), part=CAMERA_PART)  # on the conveyor, outside the region
    assert outside.verdict == vision_pb2.ANOMALY_VERDICT_OK

    added = stub.Teach(vision_pb2.TeachRequest(part=CAMERA_PART, frames=[png(weave(height, width, rng))],
                                               add_to_current=True), timeout=120)  # fmt: skip
    assert added.bank.version == bank.version + 1 and added.bank.frames == 9
    assert node.store.current(CAMERA_PART).extractor["options"]["tiles"] == tiles
    error = refused(score, stub, weave(480, 640, rng), part=CAMERA_PART)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "960x720 camera frame" in error.details()
