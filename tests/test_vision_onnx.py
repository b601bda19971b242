"""ONNX export of the vision tower: parity with torch, the checkpoint stamp, and the onnxruntime node."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner
from vision_images import varied_png

from edgeinspect.cli import app
from edgeinspect.codec import decode_frame
from edgeinspect.config import ServerConfig
from edgeinspect.errors import CheckpointError
from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.image_io import decode_image
from edgeinspect.models.onnx_export import (
    META_FINGERPRINT,
    META_QUANT,
    onnx_metadata,
)
from edgeinspect.models.vision import ImagePreprocessor
from edgeinspect.models.vision_int8 import INT8_MIN_COSINE, build_int8_copy, sample_frames
from edgeinspect.services.vision.backends import OnnxBackend, TorchBackend, default_onnx_path
from edgeinspect.services.vision.encoder import VisionEncoder
from edgeinspect.services.vision.settings import VisionBackend, VisionSettings

# (width, height): square, landscape, portrait, tiny, odd and extreme aspects.
SIZES = [(64, 64), (320, 240), (240, 320), (17, 9), (1000, 37), (37, 1000), (101, 99), (640, 480), (3, 3), (500, 1)]


IMAGES = [varied_png(w, h, seed) for seed, (w, h) in enumerate(SIZES)]


def cosine_per_token(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)  # [..., N]


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint):
    return open_checkpoint(tiny_checkpoint)


@pytest.fixture(scope="module")
def onnx_path(tiny_checkpoint, tmp_path_factory):
    """Exported with the real CLI command."""
    out = tmp_path_factory.mktemp("onnx") / "vision.onnx"
    result = CliRunner().invoke(app, ["model", "export-vision", str(tiny_checkpoint), str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def pixels(ckpt) -> torch.Tensor:
    pre = ImagePreprocessor(ckpt)
    return torch.cat([pre(decode_image(data, 1 << 24, 1 << 24)) for data in IMAGES])  # [10, 3, S, S]


def test_preprocessing_equals_the_checkpoints_own_processor(ckpt, pixels):
    processor = load_processor(ckpt)  # AutoProcessor: DeepseekVLProcessor with its image processor
    for i, data in enumerate(IMAGES):
        reference = processor(
            text=processor.image_token, images=Image.open(io.BytesIO(data)).convert("RGB"), return_tensors="pt"
        )["pixel_values"]
        assert reference.shape == pixels[i : i + 1].shape
        assert torch.allclose(pixels[i : i + 1], reference, atol=1e-5, rtol=0), SIZES[i]


def test_onnx_matches_torch_on_ten_images(ckpt, onnx_path, pixels):
    torch_tokens = TorchBackend(ckpt, "fp32")(pixels)  # [10, N, D]
    onnx = OnnxBackend(onnx_path, ckpt.fingerprint)
    one_by_one = torch.cat([onnx(pixels[i : i + 1]) for i in range(len(IMAGES))])
    assert one_by_one.shape == torch_tokens.shape
    assert cosine_per_token(one_by_one, torch_tokens).min() >= 0.9999
    # The batch axis is dynamic: ten at once give the same tokens as one at a time.
    assert torch.allclose(onnx(pixels), one_by_one, atol=1e-5)


def test_the_export_is_stamped_with_the_checkpoint_fingerprint(ckpt, onnx_path):
    meta = onnx_metadata(onnx_path)
    assert meta[META_FINGERPRINT] == ckpt.fingerprint
    assert meta[META_QUANT] == "none"


def test_an_export_from_another_checkpoint_is_refused(onnx_path, tiny_mha_checkpoint):
    other = VisionSettings(checkpoint=tiny_mha_checkpoint, backend=VisionBackend.onnxruntime, onnx_path=onnx_path)
    with pytest.raises(CheckpointError) as info:
        VisionEncoder.load(other)
    assert "was exported from checkpoint" in str(info.value)
    assert open_checkpoint(tiny_mha_checkpoint).fingerprint in str(info.value)


def test_an_onnx_file_without_our_stamp_is_refused(tmp_path, ckpt):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["pixel_values"], ["visual_tokens"])],
        "bare",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("visual_tokens", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "bare.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with pytest.raises(CheckpointError, match="carries no edgeinspect.checkpoint_fingerprint"):
        OnnxBackend(path, ckpt.fingerprint)


def test_int8_quantisation_keeps_the_stamp_and_stays_close(ckpt, onnx_path, pixels, tmp_path):
    int8_path = build_int8_copy(onnx_path, tmp_path / "vision-int8.onnx", sample_frames(ckpt.path, False), False)
    meta = onnx_metadata(int8_path)
    assert meta[META_FINGERPRINT] == ckpt.fingerprint and meta[META_QUANT] == "int8-dynamic"
    assert int8_path.stat().st_size < onnx_path.stat().st_size
    tokens = OnnxBackend(int8_path, ckpt.fingerprint)(pixels)
    assert cosine_per_token(tokens, TorchBackend(ckpt, "fp32")(pixels)).min() >= INT8_MIN_COSINE


def test_a_missing_export_goes_beside_a_writable_checkpoint(ckpt):
    path = default_onnx_path(ckpt)
    assert path.parent.parent == ckpt.path and ckpt.fingerprint in path.name


async def test_onnxruntime_node_exports_on_first_start_and_encodes_like_torch(ckpt, tmp_path):
    from edgeinspect.services.common.channel import make_channel
    from edgeinspect.services.vision.server import start_vision
    from edgeinspect.v1 import tensor_pb2, vision_pb2, vision_pb2_grpc

    target = tmp_path / "cache" / "vision.onnx"
    cfg = VisionSettings(
        checkpoint=ckpt.path, backend=VisionBackend.onnxruntime, onnx_path=target, server=ServerConfig(port=0)
    )
    running, servicer = await start_vision(cfg)
    try:
        assert target.is_file() and onnx_metadata(target)[META_FINGERPRINT] == ckpt.fingerprint
        async with make_channel(f"127.0.0.1:{running.port}") as channel:
            stub = vision_pb2_grpc.VisionServiceStub(channel)
            info = await stub.Info(vision_pb2.InfoRequest())
            reply = await stub.Encode(vision_pb2.EncodeRequest(image=IMAGES[1], codec=tensor_pb2.CODEC_RAW_FP32))
        assert info.backend == "onnxruntime"
        tokens = decode_frame(reply.visual_tokens, expect_shape=list(info.output_shape))
        pixel_values = ImagePreprocessor(ckpt)(decode_image(IMAGES[1], 1 << 24, 1 << 24))
        expected = TorchBackend(ckpt, "fp32")(pixel_values)[0]
        assert cosine_per_token(tokens, expected).min() >= 0.9999
    finally:
        await running.stop(0)
        servicer.encoder.close()
