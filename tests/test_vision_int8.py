"""The int8 vision tower (torch backend, weights int8): every linear an Int8Linear, attention in the native kernel
with the causal mask off; its visual tokens stay within the vision node's accuracy bound of the fp32 tower."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import cosine_similarity
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from edgeinspect.assets import sample_image
from edgeinspect.errors import CheckpointError
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.image_io import decode_image
from edgeinspect.models.kernels import bindings
from edgeinspect.models.quant import Int8Linear
from edgeinspect.models.vision import NATIVE_ATTENTION, ImagePreprocessor, native_attention
from edgeinspect.services.vision.autobackend import MIN_TOKEN_COSINE
from edgeinspect.services.vision.backends import TorchBackend

pytestmark = [
    pytest.mark.cpu_paths,
    pytest.mark.skipif(bindings.q8_library() is None, reason="no C compiler here to build the native kernels"),
]


def sample_pixels(ckpt) -> torch.Tensor:
    return ImagePreprocessor(ckpt)(decode_image(sample_image().read_bytes(), 1 << 26, 1 << 28))


def test_the_int8_tower_encodes_the_sample_part_within_the_bound_of_the_fp32_one(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    pixels = sample_pixels(ckpt)
    fp32, int8 = TorchBackend(ckpt, "fp32"), TorchBackend(ckpt, "int8")
    want, got = fp32(pixels), int8(pixels)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert float(cosine_similarity(got.double(), want.double(), dim=-1).min()) >= MIN_TOKEN_COSINE
    assert not torch.equal(got, want)  # it really ran int8
    linears = [m for m in int8.tower.modules() if isinstance(m, torch.nn.Linear | Int8Linear)]
    assert linears and all(isinstance(m, Int8Linear) for m in linears)
    mlps = [m for m in int8.tower.modules() if hasattr(m, "fc1")]
    assert mlps and all(m.fc1.gelu and isinstance(m.activation_fn, torch.nn.Identity) for m in mlps)  # fused in fc1
    assert int8.tower.vision_model.config._attn_implementation == NATIVE_ATTENTION
    assert fp32.tower.vision_model.config._attn_implementation == "sdpa"  # the reference stays SDPA
    assert ckpt.config.vision_config._attn_implementation != NATIVE_ATTENTION  # the checkpoint's config untouched


def test_native_attention_attends_as_sdpa_does_and_falls_back_to_it_with_a_mask():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 50, 32, generator=g) for _ in range(3))  # [B, H, N, hd], two images
    want, _ = sdpa_attention_forward(None, q, k, v, None, scaling=32**-0.5, is_causal=False)
    got, _ = native_attention(None, q, k, v, None, scaling=32**-0.5, is_causal=False)
    assert got.shape == want.shape == (2, 50, 4, 32)
    bound = 1e-2 if bindings.prompt_attention_bf16() else 1e-5  # bf16 dot products, else fp32 (or SDPA itself)
    assert float((got - want).norm() / want.norm()) < bound
    mask = torch.zeros(2, 1, 50, 50)
    mask[..., 40:] = -torch.inf  # a mask the kernel does not take: SDPA's own result, bit for bit
    want, _ = sdpa_attention_forward(None, q, k, v, mask, scaling=32**-0.5, is_causal=False)
    got, _ = native_attention(None, q, k, v, mask, scaling=32**-0.5, is_causal=False)
    assert torch.equal(got, want)


def test_the_torch_backend_refuses_a_weight_format_it_does_not_run(tiny_checkpoint):
    with pytest.raises(CheckpointError, match="fp32, bf16 or int8"):
        TorchBackend(open_checkpoint(tiny_checkpoint), "int4")


def test_the_encoders_residual_stream_runs_contiguous_and_encodes_the_same_tokens(tiny_checkpoint):
    # The patch embeddings come out of the convolution transposed; kept, every residual add and layer norm of the
    # encoder ran on that layout (~50 ms of a 0.8 s 1.3B encode). The tower copies them once: same tokens, bit for bit.
    ckpt = open_checkpoint(tiny_checkpoint)
    pixels = sample_pixels(ckpt)
    for weights in ("fp32", "int8"):
        tower = TorchBackend(ckpt, weights).tower
        seen: list[bool] = []
        for layer in tower.vision_model.encoder.layers:
            layer.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(args[0].is_contiguous()))
        with torch.inference_mode():
            got = tower(pixels)
            assert seen and all(seen), seen
            tower.vision_model.embeddings._forward_hooks.clear()  # the layout transformers hands over
            seen.clear()
            want = tower(pixels)
        assert not any(seen)  # without the copy the stream is transposed (what this test guards against)
        assert torch.equal(got, want)
