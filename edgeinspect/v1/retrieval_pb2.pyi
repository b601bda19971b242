from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchRequest(_message.Message):
    __slots__ = ("query", "k", "filters")
    class FiltersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUERY_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    query: str
    k: int
    filters: _containers.ScalarMap[str, str]
    def __init__(self, query: _Optional[str] = ..., k: _Optional[int] = ..., filters: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SpecChunk(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "path", "title", "section", "page", "text", "score", "product", "defect_classes", "severities")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    DEFECT_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SEVERITIES_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    path: str
    title: str
    section: str
    page: int
    text: str
    score: float
    product: str
    defect_classes: _containers.RepeatedScalarFieldContainer[str]
    severities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., path: _Optional[str] = ..., title: _Optional[str] = ..., section: _Optional[str] = ..., page: _Optional[int] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., product: _Optional[str] = ..., defect_classes: _Optional[_Iterable[str]] = ..., severities: _Optional[_Iterable[str]] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("chunks", "index_version", "search_ms", "index_fingerprint")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEARCH_MS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[SpecChunk]
    index_version: str
    search_ms: float
    index_fingerprint: str
    def __init__(self, chunks: _Optional[_Iterable[_Union[SpecChunk, _Mapping]]] = ..., index_version: _Optional[str] = ..., search_ms: _Optional[float] = ..., index_fingerprint: _Optional[str] = ...) -> None: ...

class IndexStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IndexStats(_message.Message):
    __slots__ = ("index_version", "documents", "chunks", "embedding_model", "dimension", "index_type", "fingerprint", "created_at")
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_TYPE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    index_version: str
    documents: int
    chunks: int
    embedding_model: str
    dimension: int
    index_type: str
    fingerprint: str
    created_at: str
    def __init__(self, index_version: _Optional[str] = ..., documents: _Optional[int] = ..., chunks: _Optional[int] = ..., embedding_model: _Optional[str] = ..., dimension: _Optional[int] = ..., index_type: _Optional[str] = ..., fingerprint: _Optional[str] = ..., created_at: _Optional[str] = ...) -> None: ...
