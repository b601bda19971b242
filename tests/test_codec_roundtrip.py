"""Round trips through every codec, with and without zstd, over shapes up to 4-D: each codec stays within its
documented error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from edgeinspect import codec
from edgeinspect.codec import (
    BLOCK,
    Codec,
    codec_nbytes,
    decode,
    decode_frame,
    encode,
    encode_frame,
    wire_nbytes,
)
from edgeinspect.errors import CodecError
from edgeinspect.v1 import tensor_pb2

# up to 4-D, zero-size dims included, sizes that 32 does not divide
shapes = st.lists(st.integers(min_value=0, max_value=9), min_size=0, max_size=4).map(tuple)


def _values(limit: float) -> st.SearchStrategy[float]:
    return st.floats(min_value=-limit, max_value=limit, allow_nan=False, width=32)


def _arrays(limit: float) -> st.SearchStrategy[np.ndarray]:
    # a per-example magnitude so tiny (subnormal-scale) and large blocks both occur
    return shapes.flatmap(lambda s: arrays(np.float32, s, elements=_values(limit)))


def _wire_round_trip(t: torch.Tensor, codec: Codec, zstd: bool) -> torch.Tensor:
    frame = encode_frame(t, codec, zstd)
    received = tensor_pb2.TensorFrame.FromString(frame.SerializeToString())
    out = decode_frame(received, expect_shape=tuple(t.shape), expect_dtype=str(t.dtype).removeprefix("torch."))
    assert out.shape == t.shape
    assert out.dtype == t.dtype
    return out


@settings(max_examples=150, deadline=None)
@given(x=_arrays(float(np.finfo(np.float32).max)), zstd=st.booleans())
def test_fp32_round_trip_is_exact(x: np.ndarray, zstd: bool) -> None:
    t = torch.from_numpy(x)
    out = _wire_round_trip(t, Codec.fp32, zstd)
    assert torch.equal(out, t)


@settings(max_examples=150, deadline=None)
@given(x=_arrays(1.0e5), zstd=st.booleans())
def test_fp16_round_trip_is_fp16_rounding_with_saturation(x: np.ndarray, zstd: bool) -> None:
    t = torch.from_numpy(x)
    out = _wire_round_trip(t, Codec.fp16, zstd)
    expected = torch.from_numpy(np.asarray(np.clip(x, -65504, 65504).astype(np.float16).astype(np.float32)))
    assert torch.equal(out, expected)
    # half an fp16 ulp relative, or half the smallest subnormal near zero
    err = (out - t.clamp(-65504, 65504)).abs()
    assert bool((err <= t.abs() * 2.0**-11 + 2.0**-25).all())


@settings(max_examples=150, deadline=None)
@given(x=_arrays(1.0e3), scale=st.sampled_from([1e-7, 1e-3, 1.0, 1e3]), zstd=st.booleans())
def test_block_int8_error_is_within_half_a_scale(x: np.ndarray, scale: float, zstd: bool) -> None:
    t = torch.from_numpy(x) * scale
    out = _wire_round_trip(t, Codec.int8, zstd)
    flat = t.reshape(-1).double()
    n = flat.numel()
    padded = torch.zeros(-(-n // BLOCK) * BLOCK, dtype=torch.float64)
    padded[:n] = flat
    absmax = padded.reshape(-1, BLOCK).abs().amax(dim=1)
    # the fp16 scale is absmax/127 rounded up: at most one fp16 ulp (2^-10 relative) or one subnormal step above
    scale_hi = absmax / 127 * (1 + 2.0**-10) + 2.0**-24
    bound = (scale_hi / 2).repeat_interleave(BLOCK)[:n] * (1 + 1e-6)
    err = (out.reshape(-1).double() - flat).abs()
    assert bool((err <= bound).all()), float((err - bound).max())


def test_block_int8_saturates_beyond_the_largest_fp16_scale() -> None:
    t = torch.tensor([1e9, -1e9, 1.0])
    out = decode(encode(t, Codec.int8))
    assert out.tolist() == [127 * 65504.0, -127 * 65504.0, 0.0]


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_come_back_in_their_own_dtype(codec: Codec, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(3, 70, generator=g) * 4).to(dtype)
    out = _wire_round_trip(t, codec, zstd=False)
    if codec is Codec.int8:
        assert float((out.float() - t.float()).abs().max()) < 0.05 * float(t.float().abs().max())
    else:
        # bf16 values in fp16's normal range fit fp16's 11-bit mantissa exactly
        assert torch.equal(out, t)


@pytest.mark.parametrize("codec", list(Codec))
def test_non_contiguous_input_is_sent_in_row_major_order(codec: Codec) -> None:
    base = torch.arange(6 * 40, dtype=torch.float32).reshape(6, 40) / 7
    view = base.t()[::2]  # [20, 6], strided
    assert not view.is_contiguous()
    out = decode(encode(view, codec))
    ref = decode(encode(view.contiguous(), codec))
    assert torch.equal(out, ref)
    assert out.shape == view.shape


def test_tensor_that_requires_grad_is_encoded_without_error() -> None:
    t = torch.randn(2, 33, requires_grad=True)
    assert torch.equal(decode(encode(t, Codec.fp32)), t.detach())


@pytest.mark.parametrize("codec", list(Codec))
def test_payload_size_matches_the_codec(codec: Codec) -> None:
    t = torch.randn(5, 2048)
    e = encode(t, codec)
    assert e.raw_nbytes == codec_nbytes(codec, t.numel()) == wire_nbytes(e)
    assert wire_nbytes(e) == {Codec.fp32: 40960, Codec.fp16: 20480, Codec.int8: 320 * 34}[codec]


def test_zstd_shrinks_compressible_data() -> None:
    t = torch.zeros(64, 64)
    e = encode(t, Codec.fp32, zstd=True)
    assert wire_nbytes(e) < e.raw_nbytes // 10
    assert torch.equal(decode(e), t)


@pytest.mark.parametrize("zstd", [False, True])
@pytest.mark.parametrize("codec_name", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("cols", [64, 48])  # 48: block-int8 rows that split a block take the decode path
def test_split_rows_cuts_the_same_values_the_whole_frame_holds(codec_name, zstd, cols):
    # The gateway hands each prompt chunk its visual rows cut from the vision node's bytes: equal to slicing the
    # decoded frame, byte for byte where rows are whole codec units.
    c = codec.Codec(codec_name)
    t = torch.randn(10, cols, generator=torch.Generator().manual_seed(3))
    frame = codec.encode_frame(t, c, zstd)
    whole = codec.decode_frame(frame)
    pieces = codec.split_rows(frame, [3, 0, 4, 2])
    assert [tuple(p.shape) for p in pieces] == [(3, cols), (0, cols), (4, cols), (2, cols)]
    starts = [0, 3, 3, 7]
    exact = codec.row_nbytes(c, cols) is not None
    for p, start in zip(pieces, starts, strict=True):
        got, want = codec.decode_frame(p), whole[start : start + p.shape[0]]
        assert torch.equal(got, want) if exact else torch.allclose(got, want, atol=0.05)
        assert p.codec == frame.codec and p.zstd == zstd
    if exact and not zstd:
        assert b"".join(p.payload for p in pieces) == frame.payload[: codec.codec_nbytes(c, 9 * cols)]


def test_split_rows_refuses_more_rows_than_the_frame_has_and_a_damaged_frame():
    frame = codec.encode_frame(torch.ones(4, 32), codec.Codec.int8)
    with pytest.raises(CodecError, match="cannot cut 5 rows"):
        codec.split_rows(frame, [2, 3])
    frame.payload = frame.payload[:-1] + bytes([frame.payload[-1] ^ 1])
    with pytest.raises(CodecError, match="checksum mismatch"):
        codec.split_rows(frame, [1])
