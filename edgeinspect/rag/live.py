"""The index a server is serving: one `Searcher` at a time, swapped atomically when a new version appears.

A search takes a local reference to the current searcher, so a reload never disturbs a request in flight: it
finishes on the old version, whose files stay readable even after the indexer prunes them (POSIX unlink).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.rag import store
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.search import Searcher, SearchResult

log = logging.getLogger(__name__)

CANARY_QUERY = "surface defect acceptance limit"


class LiveIndex:
    def __init__(self, kb: Path, embedder: Embedder, max_k: int):
        self.kb = kb
        self.embedder = embedder
        self.max_k = max_k
        self._searcher: Searcher | None = None
        self._failed_version: str | None = None
        self._reload_lock = threading.Lock()  # one reload at a time; searches never take it

    @property
    def searcher(self) -> Searcher | None:
        return self._searcher

    @property
    def version(self) -> str | None:
        s = self._searcher
        return s.version if s else None

    def refresh(self) -> bool:
        """Loads the version CURRENT names if it is not the one served; True if it swapped.

        The new version is served only after a canary search on it succeeded; a version that fails to load is
        not retried until CURRENT changes again, and the old one keeps serving.
        """
        with self._reload_lock:
            target = store.current_version(self.kb)
            if target is None or target == self.version or target == self._failed_version:
                return False
            try:
                fresh = Searcher(self.kb, self.embedder, target)
                fresh.search(CANARY_QUERY, 1)
            except Exception:  # a broken version must never take down the one being served
                log.exception("index version %s failed to load; still serving %s", target, self.version)
                self._failed_version = target
                return False
            old = self.version
            self._searcher = fresh  # a single reference assignment: atomic for concurrent readers
            self._failed_version = None
            log.info("serving index version %s (was %s, %d chunks)", target, old, fresh.chunk_count)
            return True

    def search(self, query: str, k: int, filters: Mapping[str, str] | None = None) -> SearchResult:
        if not query.strip():
            raise InvalidInput("query is empty")
        if not 1 <= k <= self.max_k:
            raise InvalidInput(f"k must be between 1 and {self.max_k}, got {k}")
        searcher = self._searcher
        if searcher is None:
            raise Unavailable(f"no index loaded yet from {self.kb}")
        return searcher.search(query, k, filters)
