import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from edgeinspect.v1 import inspection_pb2 as _inspection_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_STATE_UNSPECIFIED: _ClassVar[RolloutState]
    ROLLOUT_STATE_IDLE: _ClassVar[RolloutState]
    ROLLOUT_STATE_SHADOW: _ClassVar[RolloutState]
    ROLLOUT_STATE_CANARY: _ClassVar[RolloutState]
    ROLLOUT_STATE_PROMOTED: _ClassVar[RolloutState]
    ROLLOUT_STATE_ROLLED_BACK: _ClassVar[RolloutState]
ROLLOUT_STATE_UNSPECIFIED: RolloutState
ROLLOUT_STATE_IDLE: RolloutState
ROLLOUT_STATE_SHADOW: RolloutState
ROLLOUT_STATE_CANARY: RolloutState
ROLLOUT_STATE_PROMOTED: RolloutState
ROLLOUT_STATE_ROLLED_BACK: RolloutState

class ModelVersion(_message.Message):
    __slots__ = ("name", "checkpoint", "vision", "stages", "retrieval", "prompt", "checkpoint_fingerprint")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    VISION_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    name: str
    checkpoint: str
    vision: str
    stages: _containers.RepeatedScalarFieldContainer[str]
    retrieval: str
    prompt: str
    checkpoint_fingerprint: str
    def __init__(self, name: _Optional[str] = ..., checkpoint: _Optional[str] = ..., vision: _Optional[str] = ..., stages: _Optional[_Iterable[str]] = ..., retrieval: _Optional[str] = ..., prompt: _Optional[str] = ..., checkpoint_fingerprint: _Optional[str] = ...) -> None: ...

class StartRolloutRequest(_message.Message):
    __slots__ = ("candidate", "shadow_in_flight", "shadow_queue")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SHADOW_QUEUE_FIELD_NUMBER: _ClassVar[int]
    candidate: ModelVersion
    shadow_in_flight: int
    shadow_queue: int
    def __init__(self, candidate: _Optional[_Union[ModelVersion, _Mapping]] = ..., shadow_in_flight: _Optional[int] = ..., shadow_queue: _Optional[int] = ...) -> None: ...

class RolloutStatusRequest(_message.Message):
    __slots__ = ("max_disagreements",)
    MAX_DISAGREEMENTS_FIELD_NUMBER: _ClassVar[int]
    max_disagreements: int
    def __init__(self, max_disagreements: _Optional[int] = ...) -> None: ...

class PromoteRolloutRequest(_message.Message):
    __slots__ = ("stations",)
    STATIONS_FIELD_NUMBER: _ClassVar[int]
    stations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stations: _Optional[_Iterable[str]] = ...) -> None: ...

class RollbackRolloutRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Disagreement(_message.Message):
    __slots__ = ("live_report_id", "shadow_report_id", "station", "image_sha256", "live_verdict", "shadow_verdict", "live_classes", "shadow_classes")
    LIVE_REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    STATION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    LIVE_VERDICT_FIELD_NUMBER: _ClassVar[int]
    SHADOW_VERDICT_FIELD_NUMBER: _ClassVar[int]
    LIVE_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SHADOW_CLASSES_FIELD_NUMBER: _ClassVar[int]
    live_report_id: str
    shadow_report_id: str
    station: str
    image_sha256: str
    live_verdict: _inspection_pb2.Verdict
    shadow_verdict: _inspection_pb2.Verdict
    live_classes: _containers.RepeatedScalarFieldContainer[str]
    shadow_classes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, live_report_id: _Optional[str] = ..., shadow_report_id: _Optional[str] = ..., station: _Optional[str] = ..., image_sha256: _Optional[str] = ..., live_verdict: _Optional[_Union[_inspection_pb2.Verdict, str]] = ..., shadow_verdict: _Optional[_Union[_inspection_pb2.Verdict, str]] = ..., live_classes: _Optional[_Iterable[str]] = ..., shadow_classes: _Optional[_Iterable[str]] = ...) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("state", "live", "candidate", "previous", "canary_stations", "started", "shadowed", "agreed", "agreement", "skipped", "shadow_failed", "disagreements", "pending")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    CANARY_STATIONS_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    SHADOWED_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FAILED_FIELD_NUMBER: _ClassVar[int]
    DISAGREEMENTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    state: RolloutState
    live: ModelVersion
    candidate: ModelVersion
    previous: ModelVersion
    canary_stations: _containers.RepeatedScalarFieldContainer[str]
    started: _timestamp_pb2.Timestamp
    shadowed: int
    agreed: int
    agreement: float
    skipped: int
    shadow_failed: int
    disagreements: _containers.RepeatedCompositeFieldContainer[Disagreement]
    pending: int
    def __init__(self, state: _Optional[_Union[RolloutState, str]] = ..., live: _Optional[_Union[ModelVersion, _Mapping]] = ..., candidate: _Optional[_Union[ModelVersion, _Mapping]] = ..., previous: _Optional[_Union[ModelVersion, _Mapping]] = ..., canary_stations: _Optional[_Iterable[str]] = ..., started: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., shadowed: _Optional[int] = ..., agreed: _Optional[int] = ..., agreement: _Optional[float] = ..., skipped: _Optional[int] = ..., shadow_failed: _Optional[int] = ..., disagreements: _Optional[_Iterable[_Union[Disagreement, _Mapping]]] = ..., pending: _Optional[int] = ...) -> None: ...
