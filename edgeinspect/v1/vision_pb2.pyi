from edgeinspect.v1 import tensor_pb2 as _tensor_pb2
from edgeinspect.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AnomalyVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ANOMALY_VERDICT_UNSPECIFIED: _ClassVar[AnomalyVerdict]
    ANOMALY_VERDICT_OK: _ClassVar[AnomalyVerdict]
    ANOMALY_VERDICT_DEFECT: _ClassVar[AnomalyVerdict]
    ANOMALY_VERDICT_UNCERTAIN: _ClassVar[AnomalyVerdict]
ANOMALY_VERDICT_UNSPECIFIED: AnomalyVerdict
ANOMALY_VERDICT_OK: AnomalyVerdict
ANOMALY_VERDICT_DEFECT: AnomalyVerdict
ANOMALY_VERDICT_UNCERTAIN: AnomalyVerdict

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
    __slots__ = ("identity", "backend", "output_shape", "banks", "staged_banks")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    BANKS_FIELD_NUMBER: _ClassVar[int]
    STAGED_BANKS_FIELD_NUMBER: _ClassVar[int]
    identity: _common_pb2.PeerIdentity
    backend: str
    output_shape: _containers.RepeatedScalarFieldContainer[int]
    banks: _containers.RepeatedCompositeFieldContainer[AnomalyBank]
    staged_banks: _containers.RepeatedCompositeFieldContainer[AnomalyBank]
    def __init__(self, identity: _Optional[_Union[_common_pb2.PeerIdentity, _Mapping]] = ..., backend: _Optional[str] = ..., output_shape: _Optional[_Iterable[int]] = ..., banks: _Optional[_Iterable[_Union[AnomalyBank, _Mapping]]] = ..., staged_banks: _Optional[_Iterable[_Union[AnomalyBank, _Mapping]]] = ...) -> None: ...

class AnomalyBank(_message.Message):
    __slots__ = ("part", "bank_id", "version", "extractor", "extractor_fingerprint", "threshold", "frames", "staged")
    PART_FIELD_NUMBER: _ClassVar[int]
    BANK_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    part: str
    bank_id: str
    version: int
    extractor: str
    extractor_fingerprint: str
    threshold: float
    frames: int
    staged: bool
    def __init__(self, part: _Optional[str] = ..., bank_id: _Optional[str] = ..., version: _Optional[int] = ..., extractor: _Optional[str] = ..., extractor_fingerprint: _Optional[str] = ..., threshold: _Optional[float] = ..., frames: _Optional[int] = ..., staged: _Optional[bool] = ...) -> None: ...

class AnomalyRegion(_message.Message):
    __slots__ = ("x", "y", "width", "height", "peak")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    PEAK_FIELD_NUMBER: _ClassVar[int]
    x: float
    y: float
    width: float
    height: float
    peak: float
    def __init__(self, x: _Optional[float] = ..., y: _Optional[float] = ..., width: _Optional[float] = ..., height: _Optional[float] = ..., peak: _Optional[float] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("image", "part", "expect_bank_id", "heatmap")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    EXPECT_BANK_ID_FIELD_NUMBER: _ClassVar[int]
    HEATMAP_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    part: str
    expect_bank_id: str
    heatmap: bool
    def __init__(self, image: _Optional[bytes] = ..., part: _Optional[str] = ..., expect_bank_id: _Optional[str] = ..., heatmap: _Optional[bool] = ...) -> None: ...

class AnomalyScore(_message.Message):
    __slots__ = ("score", "threshold", "band_low", "band_high", "verdict", "regions", "heatmap_png", "bank_id", "extractor_fingerprint", "score_ms", "image_sha256")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BAND_LOW_FIELD_NUMBER: _ClassVar[int]
    BAND_HIGH_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    HEATMAP_PNG_FIELD_NUMBER: _ClassVar[int]
    BANK_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SCORE_MS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    score: float
    threshold: float
    band_low: float
    band_high: float
    verdict: AnomalyVerdict
    regions: _containers.RepeatedCompositeFieldContainer[AnomalyRegion]
    heatmap_png: bytes
    bank_id: str
    extractor_fingerprint: str
    score_ms: float
    image_sha256: str
    def __init__(self, score: _Optional[float] = ..., threshold: _Optional[float] = ..., band_low: _Optional[float] = ..., band_high: _Optional[float] = ..., verdict: _Optional[_Union[AnomalyVerdict, str]] = ..., regions: _Optional[_Iterable[_Union[AnomalyRegion, _Mapping]]] = ..., heatmap_png: _Optional[bytes] = ..., bank_id: _Optional[str] = ..., extractor_fingerprint: _Optional[str] = ..., score_ms: _Optional[float] = ..., image_sha256: _Optional[str] = ...) -> None: ...

class TeachRequest(_message.Message):
    __slots__ = ("part", "frames", "add_to_current", "extractor", "stage")
    PART_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    ADD_TO_CURRENT_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    part: str
    frames: _containers.RepeatedScalarFieldContainer[bytes]
    add_to_current: bool
    extractor: str
    stage: bool
    def __init__(self, part: _Optional[str] = ..., frames: _Optional[_Iterable[bytes]] = ..., add_to_current: _Optional[bool] = ..., extractor: _Optional[str] = ..., stage: _Optional[bool] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("part", "version", "force")
    PART_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    part: str
    version: int
    force: bool
    def __init__(self, part: _Optional[str] = ..., version: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class TeachResponse(_message.Message):
    __slots__ = ("bank", "outliers", "teach_ms")
    BANK_FIELD_NUMBER: _ClassVar[int]
    OUTLIERS_FIELD_NUMBER: _ClassVar[int]
    TEACH_MS_FIELD_NUMBER: _ClassVar[int]
    bank: AnomalyBank
    outliers: _containers.RepeatedScalarFieldContainer[str]
    teach_ms: float
    def __init__(self, bank: _Optional[_Union[AnomalyBank, _Mapping]] = ..., outliers: _Optional[_Iterable[str]] = ..., teach_ms: _Optional[float] = ...) -> None: ...

class ExportBankRequest(_message.Message):
    __slots__ = ("part", "version")
    PART_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    part: str
    version: int
    def __init__(self, part: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class BankArchive(_message.Message):
    __slots__ = ("part", "version", "bank_id", "sha256", "archive", "staged")
    PART_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BANK_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    part: str
    version: int
    bank_id: str
    sha256: str
    archive: bytes
    staged: bool
    def __init__(self, part: _Optional[str] = ..., version: _Optional[int] = ..., bank_id: _Optional[str] = ..., sha256: _Optional[str] = ..., archive: _Optional[bytes] = ..., staged: _Optional[bool] = ...) -> None: ...
