from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PeerIdentity(_message.Message):
    __slots__ = ("protocol_version", "checkpoint_fingerprint", "tokenizer_fingerprint", "role", "layer_start", "layer_end", "num_layers", "weights_dtype", "device")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    checkpoint_fingerprint: str
    tokenizer_fingerprint: str
    role: str
    layer_start: int
    layer_end: int
    num_layers: int
    weights_dtype: str
    device: str
    def __init__(self, protocol_version: _Optional[str] = ..., checkpoint_fingerprint: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., role: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., num_layers: _Optional[int] = ..., weights_dtype: _Optional[str] = ..., device: _Optional[str] = ...) -> None: ...
