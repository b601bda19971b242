"""The vision node's domain: image bytes -> visual tokens, with an LRU cache keyed by the image's sha256.

A frame re-inspected with another prompt arrives as the same bytes: the cache answers it without running the
tower (`stats.hits` and the edgeinspect_vision_cache{result="hit"} counter prove it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import io
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from prometheus_client import Counter, Histogram

from edgeinspect.errors import FailedPrecondition
from edgeinspect.models.checkpoint import Checkpoint, open_checkpoint
from edgeinspect.models.image_io import decode_image
from edgeinspect.models.vision import ImagePreprocessor
from edgeinspect.services.common.metrics import LATENCY_BUCKETS
from edgeinspect.services.vision.backends import Backend, load_backend
from edgeinspect.services.vision.settings import VisionSettings

log = logging.getLogger(__name__)

ENCODE_SECONDS = Histogram(
    "edgeinspect_vision_encode_seconds",
    "decode + preprocess + vision tower for one image (cache misses only)",
    ["backend"],
    buckets=LATENCY_BUCKETS,
)
CACHE_LOOKUPS = Counter("edgeinspect_vision_cache", "visual-token cache lookups by result", ["result"])

# Decoded images at least this large (width * height) hand their freed memory back to the OS after encoding.
TRIM_AFTER_PIXELS = 4_000_000


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None elsewhere (musl, macOS)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


def release_freed_memory() -> None:
    """Returns the heap pages a big image's buffers left behind to the OS.

    Measured: after one 36 Mpx JPEG the vision process kept ~370 MB more RSS for good, and malloc_trim(0) gives
    it all back. Why: Pillow allocates pixels in 16 MB blocks, and glibc raises its mmap threshold to the size
    of the first such block it frees, so every later block comes from the heap of the encoding thread's arena
    instead of its own mapping; freed, that heap memory stays with the process (glibc only trims the top of the
    main heap by itself). malloc_trim(0) releases the free pages of every arena. Costs about a millisecond,
    so it runs only after big images."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@dataclass(frozen=True)
class EncodeResult:
    tokens: torch.Tensor  # [N, D] float32, before the aligner
    image_sha256: str
    encode_ms: float
    cache_hit: bool


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class VisionEncoder:
    """Decode (with limits) -> DeepseekVL preprocessing -> backend; thread-safe, one tower call at a time."""

    def __init__(
        self,
        ckpt: Checkpoint,
        backend: Backend,
        *,
        max_image_bytes: int,
        max_image_pixels: int,
        cache_entries: int,
    ) -> None:
        self.ckpt = ckpt
        self.backend = backend
        self.preprocessor = ImagePreprocessor(ckpt)
        self.max_image_bytes, self.max_image_pixels = max_image_bytes, max_image_pixels
        self.cache_entries = cache_entries
        self.stats = CacheStats()
        vision = ckpt.vision_config
        self.image_size = vision.image_size
        self.output_shape = ((vision.image_size // vision.patch_size) ** 2, vision.hidden_size)  # (N, D)
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._cache_lock = threading.Lock()
        # Backends are not all re-entrant (a Hailo pipeline is one stream) and two towers at once on a small
        # box only thrash the caches: run one at a time.
        self._run_lock = threading.Lock()

    @classmethod
    def load(cls, cfg: VisionSettings) -> VisionEncoder:
        """Opens the checkpoint and loads cfg's backend (slow: call it off the event loop)."""
        ckpt = open_checkpoint(cfg.checkpoint)
        backend = load_backend(ckpt, cfg)
        return cls(
            ckpt,
            backend,
            max_image_bytes=cfg.max_image_bytes,
            max_image_pixels=cfg.max_image_pixels,
            cache_entries=cfg.cache_entries,
        )

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        return self.preprocessor(image)  # [1, 3, S, S]

    def run(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The backend alone: [B, 3, S, S] -> [B, N, D] float32."""
        with self._run_lock:
            return self.backend(pixel_values)

    def encode(self, data: bytes) -> EncodeResult:
        """Visual tokens [N, D] of one encoded image file; InvalidInput for bad bytes."""
        start = time.perf_counter()
        digest = hashlib.sha256(data).hexdigest()
        cached = self._cache_get(digest)
        if cached is not None:
            return EncodeResult(cached, digest, (time.perf_counter() - start) * 1e3, cache_hit=True)
        image = decode_image(data, self.max_image_bytes, self.max_image_pixels)
        pixels = image.width * image.height
        tokens = self.run(self.preprocess(image))[0]  # [N, D]
        del image  # the decoded pixels are freed here, before the trim
        if pixels >= TRIM_AFTER_PIXELS:
            release_freed_memory()
        if tuple(tokens.shape) != self.output_shape:
            raise FailedPrecondition(
                f"backend {self.backend.name} returned {tuple(tokens.shape)}, expected {self.output_shape}"
            )
        self._cache_put(digest, tokens)
        elapsed = time.perf_counter() - start
        ENCODE_SECONDS.labels(self.backend.name).observe(elapsed)
        return EncodeResult(tokens, digest, elapsed * 1e3, cache_hit=False)

    def canary(self) -> None:
        """Encodes a synthetic PNG end to end (bypassing the cache); raises unless the tokens look sane."""
        # A non-square gradient: exercises the resize and the square padding, not just a constant tensor.
        red, green = np.meshgrid(np.linspace(0, 255, 97), np.linspace(255, 0, 61))
        pixels = np.stack([red, green, np.full_like(red, 128)], -1).astype(np.uint8)  # [61, 97, 3]
        buf = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buf, "PNG")
        image = decode_image(buf.getvalue(), self.max_image_bytes, self.max_image_pixels)
        tokens = self.run(self.preprocess(image))[0]
        if tuple(tokens.shape) != self.output_shape or not torch.isfinite(tokens).all():
            raise FailedPrecondition(
                f"canary encode failed: backend {self.backend.name} gave shape {tuple(tokens.shape)} "
                f"(expected {self.output_shape}) or non-finite values"
            )
        log.info("canary encode ok: %s -> %s", self.backend.name, tuple(tokens.shape))

    def _cache_get(self, digest: str) -> torch.Tensor | None:
        if self.cache_entries <= 0:
            return None
        with self._cache_lock:
            tokens = self._cache.get(digest)
            if tokens is None:
                self.stats.misses += 1
                CACHE_LOOKUPS.labels("miss").inc()
                return None
            self._cache.move_to_end(digest)
            self.stats.hits += 1
            CACHE_LOOKUPS.labels("hit").inc()
            return tokens

    def _cache_put(self, digest: str, tokens: torch.Tensor) -> None:
        if self.cache_entries <= 0:
            return
        with self._cache_lock:
            self._cache[digest] = tokens
            self._cache.move_to_end(digest)
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)

    def close(self) -> None:
        self.backend.close()
