"""A frame that does not match what the receiver expects raises CodecError with a readable message, before any
allocation: never a crash, never silent garbage."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import torch
import zstandard

from edgeinspect.codec import Codec, EncodedTensor, decode, decode_frame, encode, encode_frame, from_proto
from edgeinspect.errors import CodecError, InvalidInput
from edgeinspect.v1 import tensor_pb2


def _frame(codec: Codec = Codec.fp16, zstd: bool = False, shape: tuple[int, ...] = (3, 1024)) -> EncodedTensor:
    g = torch.Generator().manual_seed(1)
    return encode(torch.randn(shape, generator=g), codec, zstd)


def _with(e: EncodedTensor, **changes: object) -> EncodedTensor:
    """A copy with fields replaced; the crc is recomputed when the payload changes, so only the check under test
    can catch it."""
    if "payload" in changes and "crc32" not in changes:
        changes["crc32"] = zlib.crc32(changes["payload"])
    return dataclasses.replace(e, **changes)


def test_codec_error_maps_to_invalid_argument() -> None:
    assert issubclass(CodecError, InvalidInput)
    assert CodecError.status == "INVALID_ARGUMENT"


def test_wrong_shape_names_expected_and_actual() -> None:
    with pytest.raises(CodecError, match=r"hidden state frame: expected shape \[\*, 2048\], got \[3, 1024\]"):
        decode(_frame(), expect_shape=(None, 2048), name="hidden state frame")


def test_wrong_rank_is_refused() -> None:
    with pytest.raises(CodecError, match="expected shape"):
        decode(_frame(), expect_shape=(3, 1024, 1))


def test_wrong_dtype_is_refused() -> None:
    with pytest.raises(CodecError, match="expected dtype bfloat16, got float32"):
        decode(_frame(), expect_dtype="bfloat16")


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("zstd", [False, True])
def test_truncated_payload_is_refused(codec: Codec, zstd: bool) -> None:
    e = _frame(codec, zstd)
    with pytest.raises(CodecError):
        decode(_with(e, payload=e.payload[:-1]))
    with pytest.raises(CodecError):
        decode(dataclasses.replace(e, payload=e.payload[: len(e.payload) // 2]))


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("zstd", [False, True])
def test_tampered_byte_fails_the_checksum(codec: Codec, zstd: bool) -> None:
    e = _frame(codec, zstd)
    bad = bytearray(e.payload)
    bad[len(bad) // 2] ^= 0x40
    with pytest.raises(CodecError, match="checksum mismatch"):
        decode(dataclasses.replace(e, payload=bytes(bad)))


@pytest.mark.parametrize("codec", list(Codec))
def test_raw_nbytes_that_disagrees_with_the_shape_is_refused(codec: Codec) -> None:
    e = _frame(codec)
    with pytest.raises(CodecError, match="codec bytes"):
        decode(_with(e, raw_nbytes=e.raw_nbytes * 2))
    with pytest.raises(CodecError, match="codec bytes"):
        decode(_with(e, shape=(3, 1025)))


def test_zstd_frame_that_decompresses_larger_than_claimed_is_refused() -> None:
    e = _frame(Codec.fp32, zstd=True, shape=(1, 250))  # 1000 raw bytes
    bigger = zstandard.ZstdCompressor().compress(bytes(4000))
    with pytest.raises(CodecError, match="declares 4000 bytes"):
        decode(_with(e, payload=bigger))


def test_zstd_frame_with_a_lying_size_header_is_refused() -> None:
    # a frame whose header claims 1000 bytes but whose blocks hold 4000: libzstd must stop at the claimed size
    e = _frame(Codec.fp32, zstd=True, shape=(1, 250))
    bomb = bytearray(zstandard.ZstdCompressor().compress(np.arange(1000, dtype=np.float32).tobytes()))
    assert bomb[4] & 0xC0 == 0x40  # 2-byte frame-content-size field, stored as size - 256
    bomb[5:7] = (1000 - 256).to_bytes(2, "little")
    assert zstandard.frame_content_size(bytes(bomb)) == 1000
    with pytest.raises(CodecError, match="corrupt zstd payload"):
        decode(_with(e, payload=bytes(bomb)))


def test_zstd_frame_without_a_size_is_refused() -> None:
    e = _frame(Codec.fp32, zstd=True, shape=(1, 250))
    sizeless = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(1000))
    with pytest.raises(CodecError, match="declares no size"):
        decode(_with(e, payload=sizeless))


def test_trailing_bytes_after_the_zstd_frame_are_refused() -> None:
    e = _frame(Codec.fp32, zstd=True, shape=(1, 250))
    with pytest.raises(CodecError, match="trailing data"):
        decode(_with(e, payload=e.payload + e.payload))


def test_zstd_flag_on_a_plain_payload_is_refused() -> None:
    e = _frame(Codec.fp32)
    with pytest.raises(CodecError, match="not a zstd frame"):
        decode(dataclasses.replace(e, zstd=True))


def test_huge_claimed_shape_is_refused_before_allocating() -> None:
    e = _frame(Codec.int8, zstd=True)
    with pytest.raises(CodecError, match="over the limit"):
        decode(dataclasses.replace(e, shape=(1 << 20, 1 << 20)))
    with pytest.raises(CodecError, match="over the limit"):
        decode(e, max_numel=1000)


def test_negative_dimension_is_refused() -> None:
    with pytest.raises(CodecError, match="negative dimension"):
        decode(dataclasses.replace(_frame(), shape=(-3, -1024)))


@pytest.mark.parametrize("value", [0, 7])
def test_unknown_codec_in_a_proto_is_refused(value: int) -> None:
    frame = encode_frame(torch.ones(4), Codec.fp32)
    frame.codec = value
    with pytest.raises(CodecError, match="unknown tensor codec"):
        decode_frame(frame)


def test_unknown_codec_in_an_encoded_tensor_is_refused() -> None:
    with pytest.raises(CodecError, match="unknown codec"):
        decode(dataclasses.replace(_frame(), codec="int4"))  # type: ignore[arg-type]


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(CodecError, match="unknown dtype 'int64'"):
        decode(dataclasses.replace(_frame(), dtype="int64"))


def test_block_int8_payload_with_a_non_finite_scale_is_refused() -> None:
    e = _frame(Codec.int8, shape=(1, 64))
    bad = bytearray(e.payload)
    bad[0:2] = np.float16(np.inf).tobytes()
    with pytest.raises(CodecError, match="non-finite scale"):
        decode(_with(e, payload=bytes(bad)))


def test_block_int8_refuses_to_encode_nan() -> None:
    with pytest.raises(CodecError, match="NaN or inf"):
        encode(torch.tensor([1.0, float("nan")]), Codec.int8)


def test_unsupported_input_dtype_is_refused_at_encode() -> None:
    with pytest.raises(CodecError, match="torch.int64"):
        encode(torch.arange(4), Codec.fp32)


def test_empty_proto_is_refused() -> None:
    with pytest.raises(CodecError):
        decode_frame(tensor_pb2.TensorFrame())


def test_from_proto_keeps_every_field() -> None:
    e = _frame(Codec.int8, zstd=True)
    frame = encode_frame(torch.randn(3, 1024), Codec.int8, zstd=True)
    back = from_proto(frame)
    assert back.codec is Codec.int8 and back.zstd and back.shape == (3, 1024) and back.dtype == "float32"
    assert back.crc32 == zlib.crc32(back.payload) and back.raw_nbytes == e.raw_nbytes
