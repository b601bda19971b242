"""RetrievalService: protobuf <-> domain only; the work happens in edgeinspect.rag."""

from __future__ import annotations

import asyncio
import logging

import grpc

from edgeinspect.errors import Unavailable
from edgeinspect.rag.live import LiveIndex
from edgeinspect.rag.search import Hit
from edgeinspect.v1 import retrieval_pb2, retrieval_pb2_grpc

log = logging.getLogger(__name__)


def _chunk_pb(hit: Hit) -> retrieval_pb2.SpecChunk:
    c = hit.chunk
    return retrieval_pb2.SpecChunk(
        chunk_id=c.chunk_id,
        doc_id=c.doc_id,
        path=c.path,
        title=c.title,
        section=c.section,
        page=c.page,
        text=c.text,
        score=hit.score,
        product=", ".join(c.product),
        defect_classes=c.defect_classes,
        severities=c.severities,
    )


class RetrievalServicer(retrieval_pb2_grpc.RetrievalServiceServicer):
    def __init__(self, live: LiveIndex):
        self.live = live

    async def Search(
        self, request: retrieval_pb2.SearchRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.SearchResponse:
        """Top-k spec chunks for a query, with the index version that produced them."""
        # Embedding is CPU work (~10 ms): keep it off the event loop so health checks stay responsive.
        result = await asyncio.to_thread(self.live.search, request.query, request.k, dict(request.filters))
        log.info(  # one line per search, with the inspection's request id (and trace id when traced)
            "search: %d chunks in %.1f ms",
            len(result.hits),
            result.search_ms,
            extra={
                "k": request.k,
                "chunks": len(result.hits),
                "search_ms": round(result.search_ms, 3),
                "filters": dict(request.filters),
                "index_version": result.index_version,
            },
        )
        return retrieval_pb2.SearchResponse(
            chunks=[_chunk_pb(h) for h in result.hits],
            index_version=result.index_version,
            search_ms=result.search_ms,
            index_fingerprint=result.index_fingerprint,
        )

    async def Stats(
        self, request: retrieval_pb2.IndexStatsRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.IndexStats:
        """The version being served, what it holds (fingerprint), its size and embedding model."""
        searcher = self.live.searcher
        if searcher is None:
            raise Unavailable(f"no index loaded yet from {self.live.kb}")
        m = searcher.manifest
        return retrieval_pb2.IndexStats(
            index_version=m["index_version"],
            documents=m["document_count"],
            chunks=m["chunk_count"],
            embedding_model=m["embedding_model"],
            dimension=m["dimension"],
            index_type=m["index_type"],
            fingerprint=searcher.fingerprint,
            created_at=m.get("created_at", ""),
        )
