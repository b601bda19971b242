from edgeinspect.v1 import tensor_pb2 as _tensor_pb2
from edgeinspect.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodeRequest(_message.Message):
    __slots__ = ("image", "codec", "zstd")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    codec: _tensor_pb2.Codec
    zstd: bool
    def __init__(self, image: _Optional[bytes] = ..., codec: _Optional[_Union[_tensor_pb2.Codec, str]] = ..., zstd: _Optional[bool] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("visual_tokens", "image_sha256", "encode_ms", "cache_hit")
    VISUAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    ENCODE_MS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    visual_tokens: _tensor_pb2.TensorFrame
    image_sha256: str
    encode_ms: float
    cache_hit: bool
    def __init__(self, visual_tokens: _Optional[_Union[_tensor_pb2.TensorFrame, _Mapping]] = ..., image_sha256: _Optional[str] = ..., encode_ms: _Optional[float] = ..., cache_hit: _Optional[bool] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VisionInfo(_message.Message):
    __slots__ = ("identity", "backend", "output_shape")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    identity: _common_pb2.PeerIdentity
    backend: str
    output_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, identity: _Optional[_Union[_common_pb2.PeerIdentity, _Mapping]] = ..., backend: _Optional[str] = ..., output_shape: _Optional[_Iterable[int]] = ...) -> None: ...
