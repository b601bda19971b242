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

class Explanation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPLANATION_UNSPECIFIED: _ClassVar[Explanation]
    EXPLANATION_PENDING: _ClassVar[Explanation]
    EXPLANATION_DONE: _ClassVar[Explanation]
    EXPLANATION_FAILED: _ClassVar[Explanation]

class DecidedBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECIDED_BY_UNSPECIFIED: _ClassVar[DecidedBy]
    DECIDED_BY_GATE: _ClassVar[DecidedBy]
    DECIDED_BY_GATE_AND_VLM: _ClassVar[DecidedBy]
    DECIDED_BY_VLM: _ClassVar[DecidedBy]

class ImageState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_STATE_UNSPECIFIED: _ClassVar[ImageState]
    IMAGE_STATE_STORED: _ClassVar[ImageState]
    IMAGE_STATE_EXPIRED: _ClassVar[ImageState]
    IMAGE_STATE_NOT_STORED: _ClassVar[ImageState]

class ReviewFilter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVIEW_FILTER_ANY: _ClassVar[ReviewFilter]
    REVIEW_FILTER_REVIEWED: _ClassVar[ReviewFilter]
    REVIEW_FILTER_UNREVIEWED: _ClassVar[ReviewFilter]
    REVIEW_FILTER_DISAGREED: _ClassVar[ReviewFilter]
VERDICT_UNSPECIFIED: Verdict
VERDICT_OK: Verdict
VERDICT_DEFECT: Verdict
VERDICT_UNCERTAIN: Verdict
EXPLANATION_UNSPECIFIED: Explanation
EXPLANATION_PENDING: Explanation
EXPLANATION_DONE: Explanation
EXPLANATION_FAILED: Explanation
DECIDED_BY_UNSPECIFIED: DecidedBy
DECIDED_BY_GATE: DecidedBy
DECIDED_BY_GATE_AND_VLM: DecidedBy
DECIDED_BY_VLM: DecidedBy
IMAGE_STATE_UNSPECIFIED: ImageState
IMAGE_STATE_STORED: ImageState
IMAGE_STATE_EXPIRED: ImageState
IMAGE_STATE_NOT_STORED: ImageState
REVIEW_FILTER_ANY: ReviewFilter
REVIEW_FILTER_REVIEWED: ReviewFilter
REVIEW_FILTER_UNREVIEWED: ReviewFilter
REVIEW_FILTER_DISAGREED: ReviewFilter

class InspectRequest(_message.Message):
    __slots__ = ("image", "station", "part", "prompt", "idempotency_key", "capture_time", "max_new_tokens", "camera_id", "verification", "evaluation")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    station: str
    part: str
    prompt: str
    idempotency_key: str
    capture_time: _timestamp_pb2.Timestamp
    max_new_tokens: int
    camera_id: str
    verification: bool
    evaluation: bool
    def __init__(self, image: _Optional[bytes] = ..., station: _Optional[str] = ..., part: _Optional[str] = ..., prompt: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., capture_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., camera_id: _Optional[str] = ..., verification: _Optional[bool] = ..., evaluation: _Optional[bool] = ...) -> None: ...

class Defect(_message.Message):
    __slots__ = ("defect_class", "severity", "location", "evidence", "box")
    DEFECT_CLASS_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    defect_class: str
    severity: str
    location: str
    evidence: str
    box: BoundingBox
    def __init__(self, defect_class: _Optional[str] = ..., severity: _Optional[str] = ..., location: _Optional[str] = ..., evidence: _Optional[str] = ..., box: _Optional[_Union[BoundingBox, _Mapping]] = ...) -> None: ...

class BoundingBox(_message.Message):
    __slots__ = ("x", "y", "width", "height")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    x: float
    y: float
    width: float
    height: float
    def __init__(self, x: _Optional[float] = ..., y: _Optional[float] = ..., width: _Optional[float] = ..., height: _Optional[float] = ...) -> None: ...

class Reference(_message.Message):
    __slots__ = ("doc_id", "section", "score", "index_version", "path", "page", "text")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    section: str
    score: float
    index_version: str
    path: str
    page: int
    text: str
    def __init__(self, doc_id: _Optional[str] = ..., section: _Optional[str] = ..., score: _Optional[float] = ..., index_version: _Optional[str] = ..., path: _Optional[str] = ..., page: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("checkpoint", "checkpoint_fingerprint", "tokenizer_fingerprint", "partition", "codec", "plan", "shadow", "prompt_sha256", "served", "images")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    PROMPT_SHA256_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    checkpoint_fingerprint: str
    tokenizer_fingerprint: str
    partition: _containers.RepeatedScalarFieldContainer[str]
    codec: str
    plan: str
    shadow: bool
    prompt_sha256: str
    served: _containers.RepeatedCompositeFieldContainer[StageServed]
    images: _containers.RepeatedCompositeFieldContainer[PromptImage]
    def __init__(self, checkpoint: _Optional[str] = ..., checkpoint_fingerprint: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., partition: _Optional[_Iterable[str]] = ..., codec: _Optional[str] = ..., plan: _Optional[str] = ..., shadow: _Optional[bool] = ..., prompt_sha256: _Optional[str] = ..., served: _Optional[_Iterable[_Union[StageServed, _Mapping]]] = ..., images: _Optional[_Iterable[_Union[PromptImage, _Mapping]]] = ...) -> None: ...

class PromptImage(_message.Message):
    __slots__ = ("role", "box", "report_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    box: BoundingBox
    report_id: str
    def __init__(self, role: _Optional[str] = ..., box: _Optional[_Union[BoundingBox, _Mapping]] = ..., report_id: _Optional[str] = ...) -> None: ...

class StageServed(_message.Message):
    __slots__ = ("layers", "address", "device", "weights")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    layers: str
    address: str
    device: str
    weights: str
    def __init__(self, layers: _Optional[str] = ..., address: _Optional[str] = ..., device: _Optional[str] = ..., weights: _Optional[str] = ...) -> None: ...

class Failover(_message.Message):
    __slots__ = ("stage", "endpoint", "position", "reason", "recovery_ms", "replayed_tokens", "route")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_MS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    stage: str
    endpoint: str
    position: int
    reason: str
    recovery_ms: float
    replayed_tokens: int
    route: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stage: _Optional[str] = ..., endpoint: _Optional[str] = ..., position: _Optional[int] = ..., reason: _Optional[str] = ..., recovery_ms: _Optional[float] = ..., replayed_tokens: _Optional[int] = ..., route: _Optional[_Iterable[str]] = ...) -> None: ...

class DefectReport(_message.Message):
    __slots__ = ("report_id", "request_id", "idempotency_key", "station", "part", "camera_id", "capture_time", "created_time", "verdict", "defects", "description", "references", "model", "timings", "raw_text", "generated_token_ids", "verdict_reason", "image_sha256", "prompt_tokens", "prompt_token_ids", "review", "previous_attempt_id", "failovers", "degraded", "decode_steps", "jump_forward_tokens", "anomaly", "explanation", "vlm_verdict", "explained_time", "explanation_error")
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
    REVIEW_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    JUMP_FORWARD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ANOMALY_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    VLM_VERDICT_FIELD_NUMBER: _ClassVar[int]
    EXPLAINED_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_ERROR_FIELD_NUMBER: _ClassVar[int]
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
    review: Review
    previous_attempt_id: str
    failovers: _containers.RepeatedCompositeFieldContainer[Failover]
    degraded: _containers.RepeatedScalarFieldContainer[str]
    decode_steps: int
    jump_forward_tokens: int
    anomaly: AnomalyFinding
    explanation: Explanation
    vlm_verdict: Verdict
    explained_time: _timestamp_pb2.Timestamp
    explanation_error: str
    def __init__(self, report_id: _Optional[str] = ..., request_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., station: _Optional[str] = ..., part: _Optional[str] = ..., camera_id: _Optional[str] = ..., capture_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., defects: _Optional[_Iterable[_Union[Defect, _Mapping]]] = ..., description: _Optional[str] = ..., references: _Optional[_Iterable[_Union[Reference, _Mapping]]] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., timings: _Optional[_Iterable[_Union[_stage_pb2.StageTiming, _Mapping]]] = ..., raw_text: _Optional[str] = ..., generated_token_ids: _Optional[_Iterable[int]] = ..., verdict_reason: _Optional[str] = ..., image_sha256: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., review: _Optional[_Union[Review, _Mapping]] = ..., previous_attempt_id: _Optional[str] = ..., failovers: _Optional[_Iterable[_Union[Failover, _Mapping]]] = ..., degraded: _Optional[_Iterable[str]] = ..., decode_steps: _Optional[int] = ..., jump_forward_tokens: _Optional[int] = ..., anomaly: _Optional[_Union[AnomalyFinding, _Mapping]] = ..., explanation: _Optional[_Union[Explanation, str]] = ..., vlm_verdict: _Optional[_Union[Verdict, str]] = ..., explained_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., explanation_error: _Optional[str] = ...) -> None: ...

class AnomalyFinding(_message.Message):
    __slots__ = ("score", "threshold", "bank_id", "extractor_fingerprint", "decided_by", "regions", "heatmap_stored", "policy", "note", "ok_cut", "defect_cut")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BANK_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    HEATMAP_STORED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    OK_CUT_FIELD_NUMBER: _ClassVar[int]
    DEFECT_CUT_FIELD_NUMBER: _ClassVar[int]
    score: float
    threshold: float
    bank_id: str
    extractor_fingerprint: str
    decided_by: DecidedBy
    regions: _containers.RepeatedCompositeFieldContainer[BoundingBox]
    heatmap_stored: bool
    policy: str
    note: str
    ok_cut: float
    defect_cut: float
    def __init__(self, score: _Optional[float] = ..., threshold: _Optional[float] = ..., bank_id: _Optional[str] = ..., extractor_fingerprint: _Optional[str] = ..., decided_by: _Optional[_Union[DecidedBy, str]] = ..., regions: _Optional[_Iterable[_Union[BoundingBox, _Mapping]]] = ..., heatmap_stored: _Optional[bool] = ..., policy: _Optional[str] = ..., note: _Optional[str] = ..., ok_cut: _Optional[float] = ..., defect_cut: _Optional[float] = ...) -> None: ...

class AddToGoodSetRequest(_message.Message):
    __slots__ = ("report_id", "stage")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    stage: bool
    def __init__(self, report_id: _Optional[str] = ..., stage: _Optional[bool] = ...) -> None: ...

class TeachFromReportsRequest(_message.Message):
    __slots__ = ("station", "part", "last_n", "stage")
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    LAST_N_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    station: str
    part: str
    last_n: int
    stage: bool
    def __init__(self, station: _Optional[str] = ..., part: _Optional[str] = ..., last_n: _Optional[int] = ..., stage: _Optional[bool] = ...) -> None: ...

class PromoteBankRequest(_message.Message):
    __slots__ = ("part", "version", "force")
    PART_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    part: str
    version: int
    force: bool
    def __init__(self, part: _Optional[str] = ..., version: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class AnomalyBankVersion(_message.Message):
    __slots__ = ("part", "bank_id", "version", "threshold", "frames", "outliers", "staged")
    PART_FIELD_NUMBER: _ClassVar[int]
    BANK_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    OUTLIERS_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    part: str
    bank_id: str
    version: int
    threshold: float
    frames: int
    outliers: _containers.RepeatedScalarFieldContainer[str]
    staged: bool
    def __init__(self, part: _Optional[str] = ..., bank_id: _Optional[str] = ..., version: _Optional[int] = ..., threshold: _Optional[float] = ..., frames: _Optional[int] = ..., outliers: _Optional[_Iterable[str]] = ..., staged: _Optional[bool] = ...) -> None: ...

class Review(_message.Message):
    __slots__ = ("review_id", "report_id", "verdict", "defect_classes", "comment", "reviewer", "reviewer_role", "created_time", "model_verdict", "model_defect_classes", "agrees")
    REVIEW_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DEFECT_CLASSES_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    REVIEWER_FIELD_NUMBER: _ClassVar[int]
    REVIEWER_ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERDICT_FIELD_NUMBER: _ClassVar[int]
    MODEL_DEFECT_CLASSES_FIELD_NUMBER: _ClassVar[int]
    AGREES_FIELD_NUMBER: _ClassVar[int]
    review_id: str
    report_id: str
    verdict: Verdict
    defect_classes: _containers.RepeatedScalarFieldContainer[str]
    comment: str
    reviewer: str
    reviewer_role: str
    created_time: _timestamp_pb2.Timestamp
    model_verdict: Verdict
    model_defect_classes: _containers.RepeatedScalarFieldContainer[str]
    agrees: bool
    def __init__(self, review_id: _Optional[str] = ..., report_id: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., defect_classes: _Optional[_Iterable[str]] = ..., comment: _Optional[str] = ..., reviewer: _Optional[str] = ..., reviewer_role: _Optional[str] = ..., created_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., model_verdict: _Optional[_Union[Verdict, str]] = ..., model_defect_classes: _Optional[_Iterable[str]] = ..., agrees: _Optional[bool] = ...) -> None: ...

class ReviewReportRequest(_message.Message):
    __slots__ = ("report_id", "verdict", "defect_classes", "comment")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    DEFECT_CLASSES_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    verdict: Verdict
    defect_classes: _containers.RepeatedScalarFieldContainer[str]
    comment: str
    def __init__(self, report_id: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., defect_classes: _Optional[_Iterable[str]] = ..., comment: _Optional[str] = ...) -> None: ...

class GetReportImageRequest(_message.Message):
    __slots__ = ("report_id", "thumbnail", "heatmap")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    THUMBNAIL_FIELD_NUMBER: _ClassVar[int]
    HEATMAP_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    thumbnail: bool
    heatmap: bool
    def __init__(self, report_id: _Optional[str] = ..., thumbnail: _Optional[bool] = ..., heatmap: _Optional[bool] = ...) -> None: ...

class ReportImage(_message.Message):
    __slots__ = ("report_id", "image_sha256", "state", "data", "media_type", "width", "height")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    image_sha256: str
    state: ImageState
    data: bytes
    media_type: str
    width: int
    height: int
    def __init__(self, report_id: _Optional[str] = ..., image_sha256: _Optional[str] = ..., state: _Optional[_Union[ImageState, str]] = ..., data: _Optional[bytes] = ..., media_type: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class AggregateReportsRequest(_message.Message):
    __slots__ = ("station", "part", "camera_id", "since", "until", "bucket_seconds")
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    BUCKET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    station: str
    part: str
    camera_id: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    bucket_seconds: int
    def __init__(self, station: _Optional[str] = ..., part: _Optional[str] = ..., camera_id: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., bucket_seconds: _Optional[int] = ...) -> None: ...

class ReportCounts(_message.Message):
    __slots__ = ("station", "bucket_start", "total", "by_verdict", "by_class", "reviewed", "disagreed")
    class ByVerdictEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ByClassEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_START_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BY_VERDICT_FIELD_NUMBER: _ClassVar[int]
    BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    REVIEWED_FIELD_NUMBER: _ClassVar[int]
    DISAGREED_FIELD_NUMBER: _ClassVar[int]
    station: str
    bucket_start: _timestamp_pb2.Timestamp
    total: int
    by_verdict: _containers.ScalarMap[str, int]
    by_class: _containers.ScalarMap[str, int]
    reviewed: int
    disagreed: int
    def __init__(self, station: _Optional[str] = ..., bucket_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., total: _Optional[int] = ..., by_verdict: _Optional[_Mapping[str, int]] = ..., by_class: _Optional[_Mapping[str, int]] = ..., reviewed: _Optional[int] = ..., disagreed: _Optional[int] = ...) -> None: ...

class AggregateReportsResponse(_message.Message):
    __slots__ = ("counts",)
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[ReportCounts]
    def __init__(self, counts: _Optional[_Iterable[_Union[ReportCounts, _Mapping]]] = ...) -> None: ...

class GetCallerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Caller(_message.Message):
    __slots__ = ("name", "role", "may_review")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MAY_REVIEW_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    may_review: bool
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., may_review: _Optional[bool] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class InspectEvent(_message.Message):
    __slots__ = ("delta", "report", "decision")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    delta: TokenDelta
    report: DefectReport
    decision: DefectReport
    def __init__(self, delta: _Optional[_Union[TokenDelta, _Mapping]] = ..., report: _Optional[_Union[DefectReport, _Mapping]] = ..., decision: _Optional[_Union[DefectReport, _Mapping]] = ...) -> None: ...

class GetReportRequest(_message.Message):
    __slots__ = ("report_id",)
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    def __init__(self, report_id: _Optional[str] = ...) -> None: ...

class ListReportsRequest(_message.Message):
    __slots__ = ("station", "part", "verdict", "since", "until", "page_size", "page_token", "camera_id", "defect_class", "review")
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    DEFECT_CLASS_FIELD_NUMBER: _ClassVar[int]
    REVIEW_FIELD_NUMBER: _ClassVar[int]
    station: str
    part: str
    verdict: Verdict
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    camera_id: str
    defect_class: str
    review: ReviewFilter
    def __init__(self, station: _Optional[str] = ..., part: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., camera_id: _Optional[str] = ..., defect_class: _Optional[str] = ..., review: _Optional[_Union[ReviewFilter, str]] = ...) -> None: ...

class ListReportsResponse(_message.Message):
    __slots__ = ("reports", "next_page_token")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[DefectReport]
    next_page_token: str
    def __init__(self, reports: _Optional[_Iterable[_Union[DefectReport, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StageEndpointStatus(_message.Message):
    __slots__ = ("address", "layer_start", "layer_end", "home_start", "home_end", "state", "reason", "sessions", "last_step_ms", "kv_bytes", "kv_budget_bytes", "live_sessions", "failures", "weights", "last")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    HOME_START_FIELD_NUMBER: _ClassVar[int]
    HOME_END_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    address: str
    layer_start: int
    layer_end: int
    home_start: int
    home_end: int
    state: str
    reason: str
    sessions: int
    last_step_ms: float
    kv_bytes: int
    kv_budget_bytes: int
    live_sessions: int
    failures: int
    weights: str
    last: bool
    def __init__(self, address: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., home_start: _Optional[int] = ..., home_end: _Optional[int] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., sessions: _Optional[int] = ..., last_step_ms: _Optional[float] = ..., kv_bytes: _Optional[int] = ..., kv_budget_bytes: _Optional[int] = ..., live_sessions: _Optional[int] = ..., failures: _Optional[int] = ..., weights: _Optional[str] = ..., last: _Optional[bool] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("address", "state", "reason", "inflight", "served", "failures", "last", "last_ms", "banks", "behind", "index_version", "index_fingerprint")
    class BanksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    LAST_MS_FIELD_NUMBER: _ClassVar[int]
    BANKS_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    address: str
    state: str
    reason: str
    inflight: int
    served: int
    failures: int
    last: bool
    last_ms: float
    banks: _containers.ScalarMap[str, str]
    behind: _containers.RepeatedScalarFieldContainer[str]
    index_version: str
    index_fingerprint: str
    def __init__(self, address: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., inflight: _Optional[int] = ..., served: _Optional[int] = ..., failures: _Optional[int] = ..., last: _Optional[bool] = ..., last_ms: _Optional[float] = ..., banks: _Optional[_Mapping[str, str]] = ..., behind: _Optional[_Iterable[str]] = ..., index_version: _Optional[str] = ..., index_fingerprint: _Optional[str] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("serving", "degraded", "plan", "normal_plan", "stages", "vision", "retrieval", "inflight", "queued", "max_inflight", "max_queued", "failovers", "notes", "vision_replicas", "retrieval_replicas", "retrieval_index", "stations", "explaining", "drift")
    SERVING_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    NORMAL_PLAN_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    VISION_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    VISION_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATIONS_FIELD_NUMBER: _ClassVar[int]
    EXPLAINING_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    serving: bool
    degraded: bool
    plan: str
    normal_plan: _containers.RepeatedScalarFieldContainer[str]
    stages: _containers.RepeatedCompositeFieldContainer[StageEndpointStatus]
    vision: str
    retrieval: str
    inflight: int
    queued: int
    max_inflight: int
    max_queued: int
    failovers: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    vision_replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    retrieval_replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    retrieval_index: str
    stations: _containers.RepeatedCompositeFieldContainer[StationGateStatus]
    explaining: int
    drift: _containers.RepeatedCompositeFieldContainer[DriftStatus]
    def __init__(self, serving: _Optional[bool] = ..., degraded: _Optional[bool] = ..., plan: _Optional[str] = ..., normal_plan: _Optional[_Iterable[str]] = ..., stages: _Optional[_Iterable[_Union[StageEndpointStatus, _Mapping]]] = ..., vision: _Optional[str] = ..., retrieval: _Optional[str] = ..., inflight: _Optional[int] = ..., queued: _Optional[int] = ..., max_inflight: _Optional[int] = ..., max_queued: _Optional[int] = ..., failovers: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., vision_replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., retrieval_replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., retrieval_index: _Optional[str] = ..., stations: _Optional[_Iterable[_Union[StationGateStatus, _Mapping]]] = ..., explaining: _Optional[int] = ..., drift: _Optional[_Iterable[_Union[DriftStatus, _Mapping]]] = ...) -> None: ...

class DriftStatus(_message.Message):
    __slots__ = ("station", "part", "bank_id", "frames", "p90_ratio", "drifting")
    STATION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    BANK_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    P90_RATIO_FIELD_NUMBER: _ClassVar[int]
    DRIFTING_FIELD_NUMBER: _ClassVar[int]
    station: str
    part: str
    bank_id: str
    frames: int
    p90_ratio: float
    drifting: bool
    def __init__(self, station: _Optional[str] = ..., part: _Optional[str] = ..., bank_id: _Optional[str] = ..., frames: _Optional[int] = ..., p90_ratio: _Optional[float] = ..., drifting: _Optional[bool] = ...) -> None: ...

class StationGateStatus(_message.Message):
    __slots__ = ("station", "policy", "flagged")
    STATION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    FLAGGED_FIELD_NUMBER: _ClassVar[int]
    station: str
    policy: str
    flagged: str
    def __init__(self, station: _Optional[str] = ..., policy: _Optional[str] = ..., flagged: _Optional[str] = ...) -> None: ...
