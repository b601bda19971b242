"""Tensor frames: the one place where tensors become bytes and bytes become tensors.

Codecs (payload layout, little-endian):
  fp32  4 bytes per value.
  fp16  2 bytes per value; values beyond +-65504 saturate (never inf); NaN stays NaN.
  int8  block-int8: the row-major flattening is cut into blocks of 32 values (the last one zero-padded);
        each block is one fp16 scale (absmax / 127, rounded up so no value clips) then 32 int8: 34 bytes.
        Per-element error <= scale / 2. Inputs must be finite; |x| > 127 * 65504 saturates.
Each codec may be followed by zstd. `dtype` is the logical dtype the receiver rebuilds: a bfloat16 tensor
sent as fp16 comes back as bfloat16.

Decoding checks every header field against the payload and the caller's expectations before allocating, and
raises CodecError with a readable message on any mismatch.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
import zstandard

from edgeinspect.errors import CodecError
from edgeinspect.v1 import tensor_pb2

BLOCK = 32
_BLOCK_BYTES = 34
_FP16_MAX = 65504.0
MAX_NDIM = 8
DEFAULT_MAX_NUMEL = 1 << 28
_ZSTD_LEVEL = 3


class Codec(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"  # block-int8


@dataclass(frozen=True)
class EncodedTensor:
    dtype: str  # logical dtype the receiver reconstructs
    shape: tuple[int, ...]
    codec: Codec
    zstd: bool
    payload: bytes  # as sent (after zstd when zstd is True)
    crc32: int  # zlib.crc32(payload)
    raw_nbytes: int  # codec bytes before zstd


_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}

_TO_PROTO = {
    Codec.fp32: tensor_pb2.CODEC_RAW_FP32,
    Codec.fp16: tensor_pb2.CODEC_FP16,
    Codec.int8: tensor_pb2.CODEC_BLOCK_INT8,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}

# one block on the wire: fp16 scale then 32 int8, no padding between blocks
_BLOCK_DTYPE = np.dtype([("s", "<f2"), ("q", "i1", (BLOCK,))])


def codec_to_proto(c: Codec) -> tensor_pb2.Codec:
    return _TO_PROTO[Codec(c)]


def codec_from_proto(c: tensor_pb2.Codec) -> Codec:
    try:
        return _FROM_PROTO[c]
    except KeyError:
        raise CodecError(f"unknown tensor codec {int(c)} (known: fp32=1, fp16=2, block-int8=3)") from None


def codec_nbytes(codec: Codec, numel: int) -> int:
    """Bytes the codec produces for `numel` values, before zstd."""
    if codec is Codec.fp32:
        return 4 * numel
    if codec is Codec.fp16:
        return 2 * numel
    return _BLOCK_BYTES * -(-numel // BLOCK)


# ---------------------------------------------------------------- encode


def _encode_fp32(t: torch.Tensor) -> bytes:
    return t.to(torch.float32).contiguous().numpy().tobytes()


def _encode_fp16(t: torch.Tensor) -> bytes:
    if t.dtype != torch.float16:
        # saturate instead of overflowing to inf; clamp keeps NaN
        t = t.to(torch.float32).clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16)
    return t.contiguous().numpy().tobytes()


def _encode_int8(t: torch.Tensor) -> bytes:
    x = t.to(torch.float32).contiguous().view(-1).numpy()  # [N]
    n = x.size
    nb = -(-n // BLOCK)
    if n % BLOCK:
        padded = np.zeros(nb * BLOCK, dtype=np.float32)
        padded[:n] = x
        x = padded
    blocks = x.reshape(nb, BLOCK)  # [nb, 32]
    absmax = np.abs(blocks).max(axis=1) if nb else np.zeros(0, np.float32)  # [nb]
    if not np.isfinite(absmax).all():
        raise CodecError("block-int8 cannot encode NaN or inf values; use the fp16 or fp32 codec")
    # |x| > 127 * 65504 saturates: the scale stays a finite fp16
    want = np.minimum(absmax / np.float32(127.0), np.float32(_FP16_MAX))
    scale = want.astype(np.float16)
    # round the fp16 scale up so |x / scale| <= 127: nothing clips and the error stays <= scale / 2
    low = scale.astype(np.float32) < want
    if low.any():
        scale[low] = np.nextafter(scale[low], np.float16(np.inf))
    s = scale.astype(np.float32)[:, None]  # [nb, 1]
    q = np.divide(blocks, s, out=np.zeros_like(blocks), where=s > 0)
    np.rint(q, out=q)
    np.clip(q, -127, 127, out=q)
    out = np.empty(nb, dtype=_BLOCK_DTYPE)
    out["s"] = scale
    out["q"] = q.astype(np.int8)
    return out.tobytes()


_ENCODERS = {Codec.fp32: _encode_fp32, Codec.fp16: _encode_fp16, Codec.int8: _encode_int8}


def encode(t: torch.Tensor, codec: Codec, zstd: bool = False) -> EncodedTensor:
    """Encode a float32 / bfloat16 / float16 tensor (any layout, any device) into a frame."""
    dtype = _DTYPE_NAMES.get(t.dtype)
    if dtype is None:
        raise CodecError(f"cannot encode a {t.dtype} tensor: supported dtypes are {', '.join(_DTYPES)}")
    if t.dim() > MAX_NDIM:
        raise CodecError(f"cannot encode a {t.dim()}-D tensor: at most {MAX_NDIM} dimensions")
    codec = Codec(codec)
    if t.device.type != "cpu":
        t = t.cpu()
    raw = _ENCODERS[codec](t.detach())
    payload = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(raw) if zstd else raw
    return EncodedTensor(
        dtype=dtype,
        shape=tuple(t.shape),
        codec=codec,
        zstd=zstd,
        payload=payload,
        crc32=zlib.crc32(payload),
        raw_nbytes=len(raw),
    )


# ---------------------------------------------------------------- decode


def _fmt_shape(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"


def _check_header(
    e: EncodedTensor,
    name: str,
    expect_shape: Sequence[int | None] | None,
    expect_dtype: str | None,
    max_numel: int,
) -> tuple[Codec, torch.dtype, int]:
    if not isinstance(e.codec, Codec):
        try:
            codec = Codec(e.codec)
        except ValueError:
            raise CodecError(f"{name}: unknown codec {e.codec!r}") from None
    else:
        codec = e.codec
    dtype = _DTYPES.get(e.dtype)
    if dtype is None:
        raise CodecError(f"{name}: unknown dtype {e.dtype!r} (known: {', '.join(_DTYPES)})")
    shape = e.shape
    if len(shape) > MAX_NDIM:
        raise CodecError(f"{name}: {len(shape)}-D shape, at most {MAX_NDIM} dimensions")
    if any(d < 0 for d in shape):
        raise CodecError(f"{name}: negative dimension in shape {_fmt_shape(shape)}")
    numel = math.prod(shape)
    if numel > max_numel:
        raise CodecError(f"{name}: shape {_fmt_shape(shape)} has {numel} values, over the limit {max_numel}")
    if expect_shape is not None and (
        len(expect_shape) != len(shape)
        or any(w is not None and w != d for w, d in zip(expect_shape, shape, strict=True))
    ):
        raise CodecError(f"{name}: expected shape {_fmt_shape(expect_shape)}, got {_fmt_shape(shape)}")
    if expect_dtype is not None and e.dtype != expect_dtype:
        raise CodecError(f"{name}: expected dtype {expect_dtype}, got {e.dtype}")
    want = codec_nbytes(codec, numel)
    if e.raw_nbytes != want:
        raise CodecError(
            f"{name}: header says {e.raw_nbytes} codec bytes, but {codec} for shape {_fmt_shape(shape)} is {want} bytes"
        )
    return codec, dtype, numel


def _unzstd(payload: bytes, raw_nbytes: int, name: str) -> bytes:
    # The frame must declare its size and it must equal raw_nbytes (already bounded by max_numel): libzstd
    # then refuses to write past it, so a bomb fails before it allocates.
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as err:
        raise CodecError(f"{name}: payload is not a zstd frame ({err})") from None
    if declared != raw_nbytes:
        what = "no size" if declared < 0 else f"{declared} bytes"
        raise CodecError(f"{name}: zstd frame declares {what}, header says {raw_nbytes} bytes")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    try:
        raw = dobj.decompress(payload)
    except zstandard.ZstdError as err:
        raise CodecError(f"{name}: corrupt zstd payload ({err})") from None
    if not dobj.eof or dobj.unused_data or len(raw) != raw_nbytes:
        raise CodecError(
            f"{name}: zstd payload decompressed to {len(raw)} bytes"
            f"{' with trailing data' if dobj.unused_data else ''}, expected exactly {raw_nbytes}"
        )
    return raw


def _decode_raw(raw: bytes, codec: Codec, numel: int, dtype: torch.dtype, name: str) -> torch.Tensor:
    if codec is Codec.fp32:
        return torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy()).to(dtype)
    if codec is Codec.fp16:
        # torch widens fp16 ~5x faster than numpy's astype
        return torch.from_numpy(np.frombuffer(raw, dtype="<f2").copy()).to(dtype)
    blocks = np.frombuffer(raw, dtype=_BLOCK_DTYPE)  # [nb]
    scale = blocks["s"].astype(np.float32)  # [nb]
    if not (np.isfinite(scale).all() and (scale >= 0).all()):
        raise CodecError(f"{name}: block-int8 payload holds a negative or non-finite scale")
    x = blocks["q"].astype(np.float32)  # [nb, 32]
    x *= scale[:, None]
    return torch.from_numpy(x.reshape(-1)[:numel]).to(dtype)


def _checked_raw(
    e: EncodedTensor,
    name: str,
    expect_shape: Sequence[int | None] | None,
    expect_dtype: str | None,
    max_numel: int,
) -> tuple[Codec, torch.dtype, int, bytes]:
    """The frame's codec bytes (zstd undone) after every header and checksum check."""
    codec, dtype, numel = _check_header(e, name, expect_shape, expect_dtype, max_numel)
    payload = e.payload
    if not e.zstd and len(payload) != e.raw_nbytes:
        raise CodecError(
            f"{name}: payload is {len(payload)} bytes, {codec} for shape {_fmt_shape(e.shape)} needs {e.raw_nbytes}"
        )
    if zlib.crc32(payload) != e.crc32:
        raise CodecError(f"{name}: checksum mismatch (payload damaged or altered in transit)")
    raw = _unzstd(payload, e.raw_nbytes, name) if e.zstd else payload
    return codec, dtype, numel, raw


def decode(
    e: EncodedTensor,
    *,
    expect_shape: Sequence[int | None] | None = None,
    expect_dtype: str | None = None,
    max_numel: int = DEFAULT_MAX_NUMEL,
    name: str = "tensor frame",
) -> torch.Tensor:
    """Validate and decode a frame; None in expect_shape = any size on that axis; `name` prefixes errors."""
    codec, dtype, numel, raw = _checked_raw(e, name, expect_shape, expect_dtype, max_numel)
    return _decode_raw(raw, codec, numel, dtype, name).view(e.shape)


def row_nbytes(codec: Codec, cols: int) -> int | None:
    """Codec bytes of one row of `cols` values when rows are whole codec units (fp32, fp16; block-int8 when a row is
    whole blocks, as a 1024-wide visual token is 32), else None."""
    if codec is Codec.int8 and cols % BLOCK:
        return None
    return codec_nbytes(codec, cols)


def split_rows(
    frame: tensor_pb2.TensorFrame, counts: Sequence[int], *, name: str = "tensor frame"
) -> list[tensor_pb2.TensorFrame]:
    """Consecutive row ranges of a 2-D frame (`counts` rows each, from row 0) as frames of its own codec, cut from
    the payload bytes where rows are whole codec units: the pieces hold exactly the values the whole frame holds and
    no float is made. Block-int8 rows that split a block (no real vision width) are decoded and re-encoded, within
    the codec's error. The frame is checked once, as decode checks it."""
    e = from_proto(frame)
    codec, dtype, numel, raw = _checked_raw(e, name, [None, None], None, DEFAULT_MAX_NUMEL)
    rows, cols = e.shape
    if any(n < 0 for n in counts) or sum(counts) > rows:
        raise CodecError(f"{name}: cannot cut {sum(counts)} rows from shape {_fmt_shape(e.shape)}")
    per_row = row_nbytes(codec, cols)
    whole = None if per_row else _decode_raw(raw, codec, numel, dtype, name).view(e.shape)
    out, start = [], 0
    for n in counts:
        if whole is not None:
            out.append(encode_frame(whole[start : start + n].contiguous(), codec, e.zstd))
        else:
            piece = raw[start * per_row : (start + n) * per_row]
            payload = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(piece) if e.zstd else piece
            out.append(
                to_proto(EncodedTensor(e.dtype, (n, cols), codec, e.zstd, payload, zlib.crc32(payload), len(piece)))
            )
        start += n
    return out


def join_rows(frames: Sequence[tensor_pb2.TensorFrame], *, name: str = "tensor frame") -> tensor_pb2.TensorFrame:
    """split_rows' inverse: 2-D frames of one codec, dtype and width as one frame, their rows in order. Where rows are
    whole codec units the payload bytes are joined (no float is made, block-int8 too); else decoded and re-encoded.
    Each frame is checked as decode checks it."""
    encoded = [from_proto(f) for f in frames]
    checked = [(e, *_checked_raw(e, name, [None, None], None, DEFAULT_MAX_NUMEL)) for e in encoded]
    first = encoded[0]
    cols = first.shape[1]
    for e in encoded:
        if (e.codec, e.dtype, e.shape[1]) != (first.codec, first.dtype, cols):
            raise CodecError(f"{name}: cannot join {e.codec.value} {e.dtype} {_fmt_shape(e.shape)} to "
                             f"{first.codec.value} {first.dtype} {_fmt_shape(first.shape)}")  # fmt: skip
    rows = sum(e.shape[0] for e in encoded)
    if not row_nbytes(first.codec, cols):
        whole = torch.cat([_decode_raw(raw, c, n, d, name).view(e.shape) for e, c, d, n, raw in checked])
        return encode_frame(whole, first.codec, first.zstd)
    raw = b"".join(raw for *_, raw in checked)
    payload = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(raw) if first.zstd else raw
    return to_proto(EncodedTensor(first.dtype, (rows, cols), first.codec, first.zstd, payload, zlib.crc32(payload),
                                  len(raw)))  # fmt: skip


# ---------------------------------------------------------------- protobuf


def to_proto(e: EncodedTensor) -> tensor_pb2.TensorFrame:
    return tensor_pb2.TensorFrame(
        dtype=e.dtype,
        shape=e.shape,
        codec=_TO_PROTO[e.codec],
        zstd=e.zstd,
        payload=e.payload,
        crc32=e.crc32,
        raw_nbytes=e.raw_nbytes,
    )


def from_proto(frame: tensor_pb2.TensorFrame) -> EncodedTensor:
    return EncodedTensor(
        dtype=frame.dtype,
        shape=tuple(frame.shape),
        codec=codec_from_proto(frame.codec),
        zstd=frame.zstd,
        payload=frame.payload,
        crc32=frame.crc32,
        raw_nbytes=frame.raw_nbytes,
    )


def encode_frame(t: torch.Tensor, codec: Codec, zstd: bool = False) -> tensor_pb2.TensorFrame:
    return to_proto(encode(t, codec, zstd))


def decode_frame(
    frame: tensor_pb2.TensorFrame,
    *,
    expect_shape: Sequence[int | None] | None = None,
    expect_dtype: str | None = None,
    max_numel: int = DEFAULT_MAX_NUMEL,
    name: str = "tensor frame",
) -> torch.Tensor:
    """Validate and decode a TensorFrame received from a peer."""
    return decode(
        from_proto(frame),
        expect_shape=expect_shape,
        expect_dtype=expect_dtype,
        max_numel=max_numel,
        name=name,
    )


def wire_nbytes(frame: tensor_pb2.TensorFrame | EncodedTensor) -> int:
    """Payload bytes as sent (after zstd), for metrics."""
    return len(frame.payload)
