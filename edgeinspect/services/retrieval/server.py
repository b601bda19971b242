"""Runs the retrieval node: bind (NOT_SERVING), load the model and index off the event loop, canary, SERVING;
then poll the KB folder and swap in new index versions while serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Gauge

from edgeinspect.errors import EdgeInspectError
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.live import LiveIndex
from edgeinspect.services.common.entry import run_role
from edgeinspect.services.common.server import RunningServer, serve_until_signal, start_server
from edgeinspect.services.retrieval.servicer import RetrievalServicer
from edgeinspect.services.retrieval.settings import RetrievalSettings
from edgeinspect.v1 import retrieval_pb2, retrieval_pb2_grpc

log = logging.getLogger(__name__)

ROLE = "retrieval"
SERVICE_NAME = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name
KB_CHUNKS = Gauge("edgeinspect_kb_chunks", "chunks in the index version being served")
KB_RELOADS = Counter("edgeinspect_kb_reloads", "index versions swapped in while serving")


@dataclass
class RetrievalNode:
    """A started retrieval node; `stop` ends the reload loop and the server."""

    running: RunningServer
    live: LiveIndex
    reloader: asyncio.Task

    @property
    def port(self) -> int:
        return self.running.port

    async def stop(self, grace: float | None = None) -> None:
        self.reloader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reloader
        await self.running.stop(grace)


async def _refresh(live: LiveIndex, running: RunningServer) -> None:
    swapped = await asyncio.to_thread(live.refresh)
    if swapped:
        KB_RELOADS.inc()
        if live.searcher is not None:  # always, after a swap
            KB_CHUNKS.set(live.searcher.chunk_count)
    if live.searcher is not None and not running.health.serving:
        await running.health.set_serving(True)


async def _reload_loop(live: LiveIndex, running: RunningServer, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await _refresh(live, running)
        except EdgeInspectError as exc:
            log.warning("index reload check failed: %s", exc)


async def build(cfg: RetrievalSettings, embedder: Embedder | None = None) -> RetrievalNode:
    """Starts the node in this event loop; SERVING once an index is loaded and a canary search succeeded.

    With no index in cfg.kb_dir yet, it stays NOT_SERVING and picks up the first version the indexer writes.
    """
    live = LiveIndex(cfg.kb_dir, embedder or Embedder(), cfg.max_k)
    running = await start_server(
        [lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(RetrievalServicer(live), s)],
        [SERVICE_NAME],
        cfg.server,
        role=ROLE,
    )
    try:
        # In threads: health checks and reflection keep answering during a model load that takes seconds.
        await asyncio.to_thread(live.embedder.encode_query, "warm up")
        await _refresh(live, running)
    except BaseException:
        await running.stop(0)
        raise
    if live.searcher is None:
        log.warning("no index in %s yet: NOT_SERVING until `edgeinspect kb index` writes one", cfg.kb_dir)
    reloader = asyncio.create_task(_reload_loop(live, running, cfg.reload_interval_s))
    return RetrievalNode(running, live, reloader)


async def serve(cfg: RetrievalSettings) -> None:
    """Serves RetrievalService until SIGINT/SIGTERM."""
    node = await build(cfg)
    try:
        await serve_until_signal(node.running, cfg.server.grace_s)
    finally:
        node.reloader.cancel()


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve; exit 1 on a startup error."""
    run_role(RetrievalSettings, serve, ROLE, config_path)
