import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from edgeinspect.v1 import stage_pb2 as _stage_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_OK: _ClassVar[Verdict]
    VERDICT_DEFECT: _ClassVar[Verdict]
    VERDICT_UNCERTAIN: _ClassVar[Verdict]
VERDICT_UNSPECIFIED: Verdict
VERDICT_OK: Verdict
VERDICT_DEFECT: Verdict
VERDICT_UNCERTAIN: Verdict

class InspectRequest(_message.Message):
    __slots__ = ("image", "station", "part", "prompt", "idempotency_key", "capture_time", "max_new_tokens", "camera_id", "verification")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    station: str
    part: str
    prompt: str
    idempotency_key: str
    capture_time: _timestamp_pb2.Timestamp
    max_new_tokens: int
    camera_id: str
    verification: bool
    def __init__(self, image: _Optional[bytes] = ..., station: _Optional[str] = ..., part: _Optional[str] = ..., prompt: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., capture_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., camera_id: _Optional[str] = ..., verification: _Optional[bool] = ...) -> None: ...

class Defect(_message.Message):
    __slots__ = ("defect_class", "severity", "location", "evidence")
    DEFECT_CLASS_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    defect_class: str
    severity: str
    location: str
    evidence: str
    def __init__(self, defect_class: _Optional[str] = ..., severity: _Optional[str] = ..., location: _Optional[str] = ..., evidence: _Optional[str] = ...) -> None: ...

class Reference(_message.Message):
    __slots__ = ("doc_id", "section", "score", "index_version", "path", "page")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    section: str
    score: float
    index_version: str
    path: str
    page: int
    def __init__(self, doc_id: _Optional[str] = ..., section: _Optional[str] = ..., score: _Optional[float] = ..., index_version: _Optional[str] = ..., path: _Optional[str] = ..., page: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("checkpoint", "checkpoint_fingerprint", "tokenizer_fingerprint", "partition", "codec")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    checkpoint_fingerprint: str
    tokenizer_fingerprint: str
    partition: _containers.RepeatedScalarFieldContainer[str]
    codec: str
    def __init__(self, checkpoint: _Optional[str] = ..., checkpoint_fingerprint: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., partition: _Optional[_Iterable[str]] = ..., codec: _Optional[str] = ...) -> None: ...

class DefectReport(_message.Message):
    __slots__ = ("report_id", "request_id", "idempotency_key", "station", "part", "camera_id", "capture_time", "created_time", "verdict", "defects", "description", "references", "model", "timings", "raw_text", "generated_token_ids", "verdict_reason", "image_sha256", "prompt_tokens", "prompt_token_ids")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DEFECTS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    RAW_TEXT_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_REASON_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    request_id: str
    idempotency_key: str
    station: str
    part: str
    camera_id: str
    capture_time: _timestamp_pb2.Timestamp
    created_time: _timestamp_pb2.Timestamp
    verdict: Verdict
    defects: _containers.RepeatedCompositeFieldContainer[Defect]
    description: str
    references: _containers.RepeatedCompositeFieldContainer[Reference]
    model: ModelInfo
    timings: _containers.RepeatedCompositeFieldContainer[_stage_pb2.StageTiming]
    raw_text: str
    generated_token_ids: _containers.RepeatedScalarFieldContainer[int]
    verdict_reason: str
    image_sha256: str
    prompt_tokens: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, report_id: _Optional[str] = ..., request_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., station: _Optional[str] = ..., part: _Optional[str] = ..., camera_id: _Optional[str] = ..., capture_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., defects: _Optional[_Iterable[_Union[Defect, _Mapping]]] = ..., description: _Optional[str] = ..., references: _Optional[_Iterable[_Union[Reference, _Mapping]]] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., timings: _Optional[_Iterable[_Union[_stage_pb2.StageTiming, _Mapping]]] = ..., raw_text: _Optional[str] = ..., generated_token_ids: _Optional[_Iterable[int]] = ..., verdict_reason: _Optional[str] = ..., image_sha256: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class InspectEvent(_message.Message):
    __slots__ = ("delta", "report")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    delta: TokenDelta
    report: DefectReport
    def __init__(self, delta: _Optional[_Union[TokenDelta, _Mapping]] = ..., report: _Optional[_Union[DefectReport, _Mapping]] = ...) -> None: ...

class GetReportRequest(_message.Message):
    __slots__ = ("report_id",)
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    def __init__(self, report_id: _Optional[str] = ...) -> None: ...

class ListReportsRequest(_message.Message):
    __slots__ = ("station", "part", "verdict", "since", "until", "page_size", "page_token")
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    station: str
    part: str
    verdict: Verdict
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, station: _Optional[str] = ..., part: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListReportsResponse(_message.Message):
    __slots__ = ("reports", "next_page_token")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[DefectReport]
    next_page_token: str
    def __init__(self, reports: _Optional[_Iterable[_Union[DefectReport, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
