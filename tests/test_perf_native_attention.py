"""The compiled decode-attention kernel and the 16-bit KV cache of packed-weight stages."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.nn.functional import cosine_similarity, scaled_dot_product_attention

from edgeinspect.models import kernels
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the native kernels")


def sdpa_one_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """q [H, hd] over [H_kv, L, hd] -> [H, hd], as the executor calls SDPA (fp32)."""
    out = scaled_dot_product_attention(
        q[None, :, None], keys.float()[None], values.float()[None], scale=scale, enable_gqa=True
    )
    return out[0, :, 0]


@needs_kernels
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "length"), [(4, 4, 32, 1), (8, 2, 24, 37), (16, 16, 128, 300)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_equals_sdpa_over_a_kv_buffer_view(heads, kv_heads, head_dim, length, dtype):
    g = torch.Generator().manual_seed(length)
    kv = KVBuffer(n_layers=2, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, capacity=length + 5)
    kv.write(
        1, torch.randn(kv_heads, length, head_dim, generator=g), torch.randn(kv_heads, length, head_dim, generator=g), 0
    )
    keys, values = kv.view(1, length)  # strided: heads are `capacity` rows apart
    q = torch.randn(heads, head_dim, generator=g)
    got = kernels.decode_attention(q, keys, values, head_dim**-0.5)
    want = sdpa_one_row(q, keys, values, head_dim**-0.5)  # over the same (16-bit) values, in fp32
    assert got.shape == (heads, head_dim)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@needs_kernels
def test_kernel_refuses_layouts_it_cannot_read():
    q = torch.randn(4, 8)
    with pytest.raises(ValueError, match="fp32 or fp16"):
        kernels.decode_attention(q, torch.randn(4, 3, 8).bfloat16(), torch.randn(4, 3, 8).bfloat16(), 1.0)
    with pytest.raises(ValueError, match="contiguous rows"):
        kernels.decode_attention(q, torch.randn(4, 8, 3).transpose(1, 2), torch.randn(4, 8, 3).transpose(1, 2), 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        kernels.decode_attention(torch.randn(5, 8), torch.randn(2, 3, 8), torch.randn(2, 3, 8), 1.0)


@needs_kernels
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_packed_stages_decode_over_a_half_size_cache_as_sdpa_does(tiny_checkpoint, weights):
    ckpt = open_checkpoint(tiny_checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    native = StageExecutor(load_stage(ckpt, whole, weights))
    plain = StageExecutor(load_stage(ckpt, whole, weights), native=False)
    assert native.native and native.kv_dtype == torch.float16 and plain.kv_dtype == torch.float32
    assert 2 * native.kv_bytes_per_position() == plain.kv_bytes_per_position()
    ids = torch.randint(10, 500, (40,), generator=torch.Generator().manual_seed(3))
    tokens = {}
    for name, ex in (("native", native), ("plain", plain)):
        out = ex.step([("a", StepInput(0, input_ids=ids))])[0]
        # a second session in the same passes: the kernel runs per session in a batched step
        other = ex.step([("b", StepInput(0, input_ids=ids[:17]))])[0]
        seq, logits = [int(out.logits.argmax())], []
        for i in range(6):
            outs = ex.step(
                [
                    ("a", StepInput(40 + i, input_ids=torch.tensor([seq[-1]]))),
                    ("b", StepInput(17 + i, input_ids=torch.tensor([7]))),
                ]
            )
            logits.append(outs[0].logits)
            seq.append(int(outs[0].logits.argmax()))
        assert other.length == 17
        tokens[name] = (seq, torch.stack(logits))
    assert tokens["native"][0] == tokens["plain"][0]
    # fp16 rounding of keys/values only; the tiny model (init std 0.3) is chaotic and int8 requantizes activations,
    # so the bar is 0.998 here (1.3B figures: bench/perf_accuracy.py)
    assert cosine_similarity(tokens["native"][1], tokens["plain"][1], dim=-1).min() > 0.998


def test_fp32_stages_keep_sdpa_and_a_32_bit_cache(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers)))
    assert not ex.native and ex.kv_dtype == torch.float32  # bit-exact with generate() needs SDPA's order


def test_a_failing_compiler_leaves_torch_kernels_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("EDGEINSPECT_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # found on PATH, exits 1: a broken toolchain
    kernels.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="edgeinspect.models.kernels"):
            assert kernels.library() is None
        assert "could not be built" in caplog.text
        assert not list(tmp_path.glob("*.so"))
    finally:
        monkeypatch.undo()
        kernels.library.cache_clear()


@needs_kernels
def test_kernels_build_into_the_configured_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINSPECT_KERNEL_DIR", str(tmp_path))
    kernels.library.cache_clear()
    try:
        assert kernels.library() is not None
        (built,) = tmp_path.glob("decode_attention-*.so")
        assert built.stat().st_size > 0
        kernels.library.cache_clear()
        assert kernels.library() is not None and list(tmp_path.glob("*.so")) == [built]  # reused, not rebuilt
    finally:
        monkeypatch.undo()
        kernels.library.cache_clear()


def test_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("EDGEINSPECT_NATIVE_KERNELS", "0")
    kernels.library.cache_clear()
    try:
        assert kernels.library() is None
    finally:
        monkeypatch.undo()
        kernels.library.cache_clear()
