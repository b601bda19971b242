"""`backend: auto`: the vision backend chosen by timing the candidates on this box at start-up.

Which one encodes fastest depends on the CPU and the libraries, not on anything a flag tells: on the 2-core Xeon
with AVX512-BF16 the ONNX Runtime int8 tower took 0.38 s where torch fp32 took 2.4 s, and bf16 torch is no faster
than fp32 there; on a 2-core Zen 4 torch int8 (our int8 linears and native attention) and ONNX Runtime int8 run
within ~10% of each other, which one ahead changing from run to run. So every candidate that can run here (torch
fp32, bf16 and int8, ONNX Runtime fp32 and int8, HailoRT when installed and a HEF is configured) is loaded, fed the
shipped sample part through the checkpoint's own preprocessing, and timed over a few encodes, the candidates
interleaved round by round so load from other jobs falls on all of them alike. The fastest whose visual tokens stay
at per-token cosine >= MIN_TOKEN_COSINE against torch fp32 wins (torch fp32 always qualifies); the others are
closed.

The choice is cached in a JSON file ($EDGEINSPECT_FORMAT_CACHE or ~/.cache/edgeinspect/formats/, shared with the
stages' `weights: auto`) keyed by CPU model and flags, torch and onnxruntime versions, threads, checkpoint
fingerprint, candidates and our kernels' sources, so a restart on the same box only loads the winner; each choice is
logged with its figures."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from edgeinspect.models.autoformat import cache_dir, fastest_within, read_cached, write_cached
from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.models.cpu import cpu_flags, cpu_model
from edgeinspect.services.vision.settings import VisionSettings

log = logging.getLogger(__name__)

MIN_TOKEN_COSINE = 0.99  # per visual token, the worst one; the language model sees each token on its own
WARMUP, ROUNDS = 1, 3
MEASURE_VERSION = 2  # 2: torch-int8 joined, kernel sources in the key


@dataclass
class BackendChoice:
    backend: str  # a candidate name: torch-fp32, torch-bf16, torch-int8, onnxruntime-fp32, onnxruntime-int8, hailo
    why: str
    ms_per_image: dict[str, float] = field(default_factory=dict)
    min_token_cosine: dict[str, float] = field(default_factory=dict)
    eligible: list[str] = field(default_factory=list)
    cached: bool = False
    loadavg: list[float] = field(default_factory=list)


def candidates(cfg: VisionSettings) -> list[str]:
    """What can run on this box: torch fp32 and bf16 always, int8 where the native int8 linear has a SIMD path
    (elsewhere its plain-C loop would only lose the timing); ONNX Runtime and HailoRT where their packages import;
    with `device` not cpu, the torch tower on CUDA and ONNX Runtime's CUDA / TensorRT providers where present."""
    from edgeinspect.models.kernels import bindings

    out = ["torch-fp32", "torch-bf16"]
    if bindings.q8_fast():
        out.append("torch-int8")
    if importlib.util.find_spec("onnxruntime") is not None:
        out += ["onnxruntime-fp32", "onnxruntime-int8"]
    if cfg.hef_path is not None and importlib.util.find_spec("hailo_platform") is not None:
        out.append("hailo")
    if cfg.device != "cpu":  # a GPU's candidates where one is present (services/vision/gpu.py)
        from edgeinspect.services.vision.gpu import gpu_candidates

        out += gpu_candidates()
    return out


def _cache_key(ckpt: Checkpoint, cfg: VisionSettings, names: list[str]) -> str:
    ort = importlib.util.find_spec("onnxruntime")
    ort_version = ""
    if ort is not None:
        import onnxruntime

        ort_version = onnxruntime.__version__
    h = hashlib.sha256()
    from edgeinspect.models.kernels import build

    parts = (cpu_model(), " ".join(sorted(cpu_flags())), torch.__version__, ort_version, str(cfg.threads))
    parts += (build.sources_digest(),)  # torch-int8 runs our kernels: a changed kernel is timed again
    for part in (*parts, ckpt.fingerprint, ",".join(names), str(cfg.hef_path or ""), str(MEASURE_VERSION)):
        h.update(part.encode() + b"\0")
    return "vision-" + h.hexdigest()[:20]


def decide(ms: dict[str, float], cosines: dict[str, float]) -> BackendChoice:
    """The fastest candidate whose worst visual token meets the bound (torch fp32, the reference, always does)."""
    best, eligible, why = fastest_within(
        ms, cosines, MIN_TOKEN_COSINE, "torch-fp32", "ms per image", "token cosine", ".3g"
    )
    return BackendChoice(best, why, ms, cosines, eligible)


def _min_token_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Worst per-token cosine of [B, N, D] visual tokens."""
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).min())


def measure(
    ckpt: Checkpoint, cfg: VisionSettings, loaders: dict[str, Callable[[], object]]
) -> tuple[BackendChoice, dict[str, object]]:
    """Loads and times every candidate; the choice and the loaded backends (the caller keeps the winner)."""
    from edgeinspect.assets import sample_image
    from edgeinspect.models.image_io import decode_image
    from edgeinspect.models.vision import ImagePreprocessor

    image = decode_image(sample_image().read_bytes(), 1 << 26, 1 << 28)
    pixels = ImagePreprocessor(ckpt)(image)  # [1, 3, S, S]
    backends: dict[str, object] = {}
    for name, load in loaders.items():
        try:
            backends[name] = load()
        except Exception as exc:  # a candidate that cannot load here is not a candidate
            log.warning("backend auto: %s cannot run here (%s); leaving it out", name, exc)
    reference = backends["torch-fp32"](pixels)  # type: ignore[operator]
    cosines = {name: round(_min_token_cosine(b(pixels), reference), 6) for name, b in backends.items()}  # type: ignore[operator]
    times: dict[str, list[float]] = {name: [] for name in backends}
    for r in range(WARMUP + ROUNDS):
        for name, b in backends.items():
            t0 = time.perf_counter()
            b(pixels)  # type: ignore[operator]
            if r >= WARMUP:
                times[name].append(time.perf_counter() - t0)
    ms = {name: round(statistics.median(t) * 1e3, 2) for name, t in times.items()}
    return replace(decide(ms, cosines), loadavg=[round(x, 2) for x in os.getloadavg()]), backends


def choose_backend(ckpt: Checkpoint, cfg: VisionSettings, loaders: dict[str, Callable[[], object]]):
    """(backend, choice): the cached choice loaded alone, else every candidate measured and the winner kept."""
    path = cache_dir() / f"{_cache_key(ckpt, cfg, list(loaders))}.json"
    cached = read_cached(path, BackendChoice, "vision backend")
    if cached is not None and cached.backend in loaders:
        log.info("vision backend auto -> %s (cached in %s: %s)", cached.backend, path, cached.why)
        return loaders[cached.backend](), cached
    t0 = time.perf_counter()
    choice, backends = measure(ckpt, cfg, loaders)
    for name, b in backends.items():
        if name != choice.backend:
            b.close()  # type: ignore[attr-defined]
    write_cached(path, choice)
    log.info("vision backend auto -> %s (measured in %.1f s: %s)", choice.backend, time.perf_counter() - t0, choice.why)
    return backends[choice.backend], choice
