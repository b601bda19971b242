from edgeinspect.v1 import tensor_pb2 as _tensor_pb2
from edgeinspect.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadLayersRequest(_message.Message):
    __slots__ = ("layer_start", "layer_end")
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    layer_start: int
    layer_end: int
    def __init__(self, layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("client", "expect_layer_start", "expect_layer_end", "codec")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    EXPECT_LAYER_START_FIELD_NUMBER: _ClassVar[int]
    EXPECT_LAYER_END_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    client: _common_pb2.PeerIdentity
    expect_layer_start: int
    expect_layer_end: int
    codec: _tensor_pb2.Codec
    def __init__(self, client: _Optional[_Union[_common_pb2.PeerIdentity, _Mapping]] = ..., expect_layer_start: _Optional[int] = ..., expect_layer_end: _Optional[int] = ..., codec: _Optional[_Union[_tensor_pb2.Codec, str]] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("server", "codecs")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    CODECS_FIELD_NUMBER: _ClassVar[int]
    server: _common_pb2.PeerIdentity
    codecs: _containers.RepeatedScalarFieldContainer[_tensor_pb2.Codec]
    def __init__(self, server: _Optional[_Union[_common_pb2.PeerIdentity, _Mapping]] = ..., codecs: _Optional[_Iterable[_Union[_tensor_pb2.Codec, str]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "seed", "grammar_id", "grammar_json", "max_forced_tokens")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_ID_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    seed: int
    grammar_id: str
    grammar_json: str
    max_forced_tokens: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., grammar_id: _Optional[str] = ..., grammar_json: _Optional[str] = ..., max_forced_tokens: _Optional[int] = ...) -> None: ...

class SessionStep(_message.Message):
    __slots__ = ("session_id", "position", "input_ids", "hidden", "visual_tokens", "sampling", "return_logits", "prefill_chunk", "prefix", "micro_batch", "max_positions", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    VISUAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGITS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    position: int
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    hidden: _tensor_pb2.TensorFrame
    visual_tokens: _tensor_pb2.TensorFrame
    sampling: SamplingParams
    return_logits: bool
    prefill_chunk: bool
    prefix: PrefixRef
    micro_batch: int
    max_positions: int
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., position: _Optional[int] = ..., input_ids: _Optional[_Iterable[int]] = ..., hidden: _Optional[_Union[_tensor_pb2.TensorFrame, _Mapping]] = ..., visual_tokens: _Optional[_Union[_tensor_pb2.TensorFrame, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., return_logits: _Optional[bool] = ..., prefill_chunk: _Optional[bool] = ..., prefix: _Optional[_Union[PrefixRef, _Mapping]] = ..., micro_batch: _Optional[int] = ..., max_positions: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PrefixRef(_message.Message):
    __slots__ = ("key", "length")
    KEY_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    key: str
    length: int
    def __init__(self, key: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("steps", "output_codec", "output_zstd")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CODEC_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ZSTD_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[SessionStep]
    output_codec: _tensor_pb2.Codec
    output_zstd: bool
    def __init__(self, steps: _Optional[_Iterable[_Union[SessionStep, _Mapping]]] = ..., output_codec: _Optional[_Union[_tensor_pb2.Codec, str]] = ..., output_zstd: _Optional[bool] = ...) -> None: ...

class SessionResult(_message.Message):
    __slots__ = ("session_id", "cached_length", "hidden", "token_id", "logits", "forced_token_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    FORCED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    cached_length: int
    hidden: _tensor_pb2.TensorFrame
    token_id: int
    logits: _tensor_pb2.TensorFrame
    forced_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., cached_length: _Optional[int] = ..., hidden: _Optional[_Union[_tensor_pb2.TensorFrame, _Mapping]] = ..., token_id: _Optional[int] = ..., logits: _Optional[_Union[_tensor_pb2.TensorFrame, _Mapping]] = ..., forced_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("stage", "compute_ms", "wire_ms")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    WIRE_MS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    compute_ms: float
    wire_ms: float
    def __init__(self, stage: _Optional[str] = ..., compute_ms: _Optional[float] = ..., wire_ms: _Optional[float] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("results", "timings")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SessionResult]
    timings: _containers.RepeatedCompositeFieldContainer[StageTiming]
    def __init__(self, results: _Optional[_Iterable[_Union[SessionResult, _Mapping]]] = ..., timings: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_ids",)
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StageStats(_message.Message):
    __slots__ = ("identity", "sessions", "kv_bytes", "kv_budget_bytes", "evicted_ttl", "evicted_budget", "released", "session_ids", "prefix_hits", "prefix_misses", "prefix_entries", "prefix_bytes", "passes", "session_steps", "kv_reserved_bytes", "refused_sessions", "max_batch_sessions", "home_layer_start", "home_layer_end", "memory_available_bytes", "weight_bytes")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_TTL_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BUDGET_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_MISSES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    SESSION_STEPS_FIELD_NUMBER: _ClassVar[int]
    KV_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    HOME_LAYER_START_FIELD_NUMBER: _ClassVar[int]
    HOME_LAYER_END_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    identity: _common_pb2.PeerIdentity
    sessions: int
    kv_bytes: int
    kv_budget_bytes: int
    evicted_ttl: int
    evicted_budget: int
    released: int
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    prefix_hits: int
    prefix_misses: int
    prefix_entries: int
    prefix_bytes: int
    passes: int
    session_steps: int
    kv_reserved_bytes: int
    refused_sessions: int
    max_batch_sessions: int
    home_layer_start: int
    home_layer_end: int
    memory_available_bytes: int
    weight_bytes: int
    def __init__(self, identity: _Optional[_Union[_common_pb2.PeerIdentity, _Mapping]] = ..., sessions: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., kv_budget_bytes: _Optional[int] = ..., evicted_ttl: _Optional[int] = ..., evicted_budget: _Optional[int] = ..., released: _Optional[int] = ..., session_ids: _Optional[_Iterable[str]] = ..., prefix_hits: _Optional[int] = ..., prefix_misses: _Optional[int] = ..., prefix_entries: _Optional[int] = ..., prefix_bytes: _Optional[int] = ..., passes: _Optional[int] = ..., session_steps: _Optional[int] = ..., kv_reserved_bytes: _Optional[int] = ..., refused_sessions: _Optional[int] = ..., max_batch_sessions: _Optional[int] = ..., home_layer_start: _Optional[int] = ..., home_layer_end: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., weight_bytes: _Optional[int] = ...) -> None: ...
