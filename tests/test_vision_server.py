"""The vision node as a separate OS process on 127.0.0.1: Encode, bad input, the cache, reflection and health."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from PIL import Image
from vision_images import jpeg, png_bomb, varied_png

from edgeinspect.codec import decode_frame
from edgeinspect.config import ServerConfig, write_yaml
from edgeinspect.errors import CheckpointError
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.common.channel import wait_for_serving
from edgeinspect.services.vision.backends import load_backend
from edgeinspect.services.vision.settings import VisionBackend, VisionSettings
from edgeinspect.testing import grpcurl
from edgeinspect.v1 import tensor_pb2, vision_pb2, vision_pb2_grpc

MAX_BYTES = 256 * 1024
START_TIMEOUT_S = 180.0


@dataclass
class Node:
    address: str
    metrics_port: int
    process: subprocess.Popen
    log: Path


def free_port() -> int:
    # The metrics endpoint has no port file; a port the kernel just handed out is free enough for a test.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(cfg: VisionSettings, folder: Path) -> subprocess.Popen:
    config = folder / "vision.yaml"
    write_yaml(cfg, config)
    log = (folder / "vision.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "edgeinspect.services.vision", "--config", str(config)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture(scope="module")
def node(tiny_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision")
    metrics_port = free_port()
    cfg = VisionSettings(
        checkpoint=tiny_checkpoint,
        backend=VisionBackend.torch,
        max_image_bytes=MAX_BYTES,
        cache_entries=8,
        server=ServerConfig(host="127.0.0.1", port=0, metrics_port=metrics_port, port_file=folder / "port"),
    )
    process = start_node(cfg, folder)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (folder / "port").is_file():
            assert process.poll() is None, (folder / "vision.log").read_text()
            assert time.monotonic() < deadline, "vision node wrote no port file"
            time.sleep(0.1)
        address = f"127.0.0.1:{(folder / 'port').read_text().strip()}"
        asyncio.run(wait_for_serving(address, START_TIMEOUT_S))
        yield Node(address, metrics_port, process, folder / "vision.log")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def stub(node):
    with grpc.insecure_channel(node.address) as channel:
        yield vision_pb2_grpc.VisionServiceStub(channel)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """The torch tower in this process: what the node's tokens must equal."""
    ckpt = open_checkpoint(tiny_checkpoint)
    tower, pre = load_vision_tower(ckpt), ImagePreprocessor(ckpt)

    def tokens(data: bytes) -> torch.Tensor:
        with torch.inference_mode():
            return tower(pre(Image.open(io.BytesIO(data)).convert("RGB")))[0]  # [N, D]

    return tokens


def encode(stub, data: bytes, codec=tensor_pb2.CODEC_RAW_FP32, zstd: bool = False) -> vision_pb2.EncodeResponse:
    return stub.Encode(vision_pb2.EncodeRequest(image=data, codec=codec, zstd=zstd), timeout=60)


def metric(node: Node, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10).read().decode()
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def assert_refused_then_good(stub, data: bytes, message: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        encode(stub, data)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, info.value.details()), info.value.details()
    good = encode(stub, jpeg(96, 64))
    assert list(good.visual_tokens.shape) == list(stub.Info(vision_pb2.InfoRequest(), timeout=10).output_shape)


def test_encode_returns_the_torch_towers_tokens(stub, reference, tiny_checkpoint):
    data = varied_png(200, 120, seed=1)
    reply = encode(stub, data)
    ckpt = open_checkpoint(tiny_checkpoint)
    vision = ckpt.config.vision_config
    shape = [(vision.image_size // vision.patch_size) ** 2, vision.hidden_size]
    tokens = decode_frame(reply.visual_tokens, expect_shape=shape, expect_dtype="float32")
    assert (tokens - reference(data)).abs().max() <= 1e-5
    assert reply.image_sha256 == hashlib.sha256(data).hexdigest()


def test_int8_zstd_codec_carries_the_same_tokens_within_the_block_error(stub, reference):
    data = varied_png(90, 160, seed=2)
    reply = encode(stub, data, codec=tensor_pb2.CODEC_BLOCK_INT8, zstd=True)
    tokens = decode_frame(reply.visual_tokens)
    expected = reference(data)
    assert reply.visual_tokens.codec == tensor_pb2.CODEC_BLOCK_INT8
    # block-int8 error <= scale / 2 = absmax(block) / 254 per value.
    assert (tokens - expected).abs().max() <= expected.abs().max() / 254 + 1e-6


def test_info_names_checkpoint_backend_and_shape(stub, tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    info = stub.Info(vision_pb2.InfoRequest(), timeout=10)
    assert info.identity.role == "vision"
    assert info.identity.checkpoint_fingerprint == ckpt.fingerprint
    assert info.identity.tokenizer_fingerprint == ckpt.tokenizer_fingerprint
    assert info.backend == "torch"


def test_empty_image_is_invalid_argument(stub):
    assert_refused_then_good(stub, b"", "empty image")


def test_truncated_jpeg_is_invalid_argument(stub):
    data = jpeg(300, 200)
    assert_refused_then_good(stub, data[: len(data) * 2 // 3], "truncated or corrupt image")


def test_non_image_bytes_are_invalid_argument(stub):
    assert_refused_then_good(stub, b"GIF? no: just some text bytes\n" * 20, "not an image")


def test_a_20000x20000_png_is_invalid_argument(stub):
    assert_refused_then_good(stub, png_bomb(20000, 20000), r"400000000 pixels, over this node's limit of 40000000")


def test_an_image_over_the_byte_limit_is_invalid_argument(stub):
    data = varied_png(400, 400, seed=3)  # noise does not compress: ~480 kB
    assert len(data) > MAX_BYTES
    assert_refused_then_good(stub, data, rf"{len(data)} bytes, over this node's limit of {MAX_BYTES} bytes")


def test_the_same_image_twice_is_a_cache_hit(stub, node, reference):
    data = varied_png(64, 64, seed=4)
    hits = metric(node, "edgeinspect_vision_cache_total", 'result="hit"')
    first, second = encode(stub, data), encode(stub, data)
    assert not first.cache_hit and second.cache_hit
    assert metric(node, "edgeinspect_vision_cache_total", 'result="hit"') == hits + 1
    assert second.visual_tokens.payload == first.visual_tokens.payload


def test_wire_bytes_are_counted_per_codec(stub, node):
    before = metric(node, "edgeinspect_wire_bytes_total", 'codec="fp16",direction="out",role="vision"')
    reply = encode(stub, jpeg(50, 50), codec=tensor_pb2.CODEC_FP16)
    after = metric(node, "edgeinspect_wire_bytes_total", 'codec="fp16",direction="out",role="vision"')
    assert after - before == len(reply.visual_tokens.payload)


def test_grpcurl_lists_vision_service_and_sees_serving(node):
    listed = grpcurl("-plaintext", node.address, "list")
    assert listed.returncode == 0, listed.stderr
    assert "edgeinspect.v1.VisionService" in listed.stdout.split()
    health = grpcurl("-plaintext", "-d", '{"service": ""}', node.address, "grpc.health.v1.Health/Check")
    assert health.returncode == 0, health.stderr
    assert '"SERVING"' in health.stdout


def test_hailo_without_hailo_platform_is_a_clear_error(tiny_checkpoint, tmp_path):
    try:
        import hailo_platform  # noqa: F401

        pytest.skip("hailo_platform is installed here")
    except ImportError:
        pass
    cfg = VisionSettings(
        checkpoint=tiny_checkpoint,
        backend=VisionBackend.hailo,
        hef_path=tmp_path / "vision.hef",
        server=ServerConfig(port=0, port_file=tmp_path / "port"),
        log_json=False,
    )
    with pytest.raises(CheckpointError, match="hailo_platform is not installed: install the wheel"):
        load_backend(open_checkpoint(tiny_checkpoint), cfg)
    # The process an operator starts says the same and exits non-zero.
    process = start_node(cfg, tmp_path)
    assert process.wait(START_TIMEOUT_S) == 1
    assert "HailoRT Python package hailo_platform is not installed" in (tmp_path / "vision.log").read_text()
