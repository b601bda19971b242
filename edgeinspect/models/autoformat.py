"""`weights: auto`: the weight format a stage runs, chosen by timing the candidates on this CPU at start-up.

Which format decodes fastest depends on the CPU and not in a way its flags tell: on a 2-core Xeon with AVX512-BF16
(no AMX) torch's bf16 decode ran at 2.6x its read bound while int8 ran near it, so "bf16 where the CPU has bf16
instructions" picked a format 5x slower than the best. So each candidate is loaded for a slice of the stage's own
checkpoint (MEASURE_LAYERS layers from its middle, not the embedding or lm_head), given a synthetic KV cache of
CONTEXT positions, and timed over a few decode steps, the candidates interleaved round by round so load from other
jobs falls on all of them alike. The median ms per layer-step decides.

Accuracy bound: the same slice, fed the same hidden states, must keep its layers' output updates (out - in: the
residual stream itself would hide any error) at cosine >= MIN_UPDATE_COSINE against fp32. The bound is
calibrated on bench/perf_accuracy.py's checkpoints (see bench/README.md): formats passing it keep whole-model
logits cosine >= 0.99 there. The fastest candidate within the bound wins; fp32 always qualifies.

The result is cached in a JSON file ($EDGEINSPECT_FORMAT_CACHE or ~/.cache/edgeinspect/formats/) keyed by the
CPU's model and flags, torch's version, the checkpoint fingerprint, the candidates, the kernel sources and
MEASURE_VERSION, so a restart on the same box skips the ~10-60 s of measuring; each choice is logged with the
figures behind it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.models.cpu import cpu_flags, cpu_model
from edgeinspect.models.kernels import bindings, build

log = logging.getLogger(__name__)
T = TypeVar("T")

CANDIDATES = ("fp32", "bf16", "int8", "int6", "int4")
MEASURE_LAYERS = 2
CONTEXT = 512  # cached positions the timed steps attend over (the report's decode runs at ~1,000)
WARMUP_STEPS, TIMED_ROUNDS, STEPS_PER_ROUND = 2, 3, 3
MIN_UPDATE_COSINE = 0.99
MEASURE_VERSION = 7  # bump when the method changes: old cache entries then no longer match (kernel sources are keyed)
# 2: int8 KV rows, the vnni int8 kernel and native decode layers (what each format costs moved)
# 3: the vnni GEMV reads one weight row after another; vnni int8 layers decode in one native call
# 4: the int8 and int4 GEMVs prefetch into L2 (a 1.3B report's decode steps on a Zen 4 EPYC: int4 1.6x, int8 1.4x)
# 5: AVX2 without VNNI: our int4 kernel runs a SIMD path there (it ran plain C); vnni int8 builds one too
# 6: AVX2 without VNNI: int8 runs the vnni kernel there too (its prompt GEMM packs weight panels), not fbgemm
# 7: AVX2: the int8 GEMV prefetches 1 KiB ahead, the int4 loop forms its scale products per weight row (a 1.3B
#    step at depth 974 on a Zen 3: int8 ~0.97x, int4 ~0.82x)


@dataclass
class FormatChoice:
    weights: str
    why: str
    ms_per_layer_step: dict[str, float] = field(default_factory=dict)
    update_cosine: dict[str, float] = field(default_factory=dict)
    eligible: list[str] = field(default_factory=list)
    cached: bool = False
    measured_at: float = 0.0
    loadavg: list[float] = field(default_factory=list)


def cache_dir() -> Path:
    base = os.environ.get("EDGEINSPECT_FORMAT_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "edgeinspect" / "formats"


def cache_key(ckpt: Checkpoint, candidates: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (
        cpu_model(),
        " ".join(sorted(cpu_flags())),
        torch.__version__,
        str(torch.get_num_threads()),
        ckpt.fingerprint,
        ",".join(candidates),
        str(bindings.available()),
        build.sources_digest(),  # a kernel's change is a new measurement, with no version to bump
        str(MEASURE_VERSION),
    ):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


def measure_slice(ckpt: Checkpoint) -> tuple[int, int]:
    """The layers timed: MEASURE_LAYERS from the middle (hidden states in and out, like any inner stage)."""
    total = ckpt.num_layers
    n = min(MEASURE_LAYERS, max(total - 2, 1))
    start = max(min((total - n) // 2, total - n - 1), 1) if total > 2 else 0
    return start, start + n


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def measure(ckpt: Checkpoint, candidates: tuple[str, ...]) -> FormatChoice:
    """Times and checks every candidate on a slice of `ckpt`; the choice with its figures."""
    from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

    start, end = measure_slice(ckpt)
    layers = LayerRange(start, end, ckpt.num_layers)
    cfg = ckpt.text_config
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, cfg.hidden_size, generator=g)  # [1, D]
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_shape = (1, cfg.num_key_value_heads, CONTEXT, head_dim)
    kv = [(torch.randn(kv_shape, generator=g), torch.randn(kv_shape, generator=g)) for _ in range(ckpt.num_layers)]
    executors = {}
    for fmt in candidates:
        executors[fmt] = StageExecutor(load_stage(ckpt, layers, fmt))
    load = [round(x, 2) for x in os.getloadavg()]

    def step(ex: StageExecutor) -> torch.Tensor:
        sess = ex.install("autoformat", kv, spare=1)  # stored in each stage's cache format
        try:
            return ex.step([("autoformat", StepInput(position=sess.length, hidden=hidden))])[0].hidden
        finally:
            ex.release("autoformat")

    # Accuracy: each format's update on the same input and cache, against fp32's.
    updates = {fmt: step(ex) - hidden for fmt, ex in executors.items()}
    reference = updates.get("fp32")
    if reference is None:
        reference = step(StageExecutor(load_stage(ckpt, layers, "fp32"))) - hidden
    cosines = {fmt: round(_cosine(u, reference), 6) for fmt, u in updates.items()}
    # Timing: interleaved rounds; install() is outside the timed call (it copies the synthetic cache in).
    times: dict[str, list[float]] = {fmt: [] for fmt in candidates}
    for r in range(TIMED_ROUNDS + 1):
        for fmt, ex in executors.items():
            steps = WARMUP_STEPS if r == 0 else STEPS_PER_ROUND
            pos = ex.install("autoformat", kv, spare=steps).length
            try:
                for _ in range(steps):
                    t0 = time.perf_counter()
                    ex.step([("autoformat", StepInput(position=pos, hidden=hidden))])
                    if r:
                        times[fmt].append(time.perf_counter() - t0)
                    pos += 1
            finally:
                ex.release("autoformat")
    n = end - start
    ms = {fmt: round(statistics.median(t) * 1e3 / n, 3) for fmt, t in times.items()}
    return replace(decide(ms, cosines), loadavg=load)


def fastest_within(
    ms: dict[str, float],
    cosines: dict[str, float],
    bound: float,
    reference: str,
    unit: str,
    what: str = "cosine",
    digits: str = ".2f",
) -> tuple[str, list[str], str]:
    """(best, eligible, why): the fastest candidate whose cosine meets `bound` (`reference` always qualifies).
    Shared by `weights: auto` here and the vision node's `backend: auto`."""
    eligible = [c for c in ms if c == reference or cosines.get(c, 0.0) >= bound]
    best = min(eligible, key=lambda c: ms[c])
    refused = [f"{c} ({what} {cosines[c]:.4f} < {bound})" for c in ms if c not in eligible]
    timing = ", ".join(f"{c} {ms[c]:{digits}}" for c in sorted(ms, key=lambda c: ms[c]))
    why = f"fastest within the accuracy bound; {unit}: {timing}"
    if refused:
        why += f"; refused: {', '.join(refused)}"
    return best, eligible, why


def decide(ms: dict[str, float], cosines: dict[str, float]) -> FormatChoice:
    """The fastest format whose update cosine meets the bound (fp32 always does)."""
    best, eligible, why = fastest_within(ms, cosines, MIN_UPDATE_COSINE, "fp32", "ms per layer-step")
    return FormatChoice(best, why, ms, cosines, eligible)


def read_cached(path: Path, cls: type[T], what: str) -> T | None:
    """A cached choice (marked cached), or None when there is none or it cannot be read (then measured again)."""
    if not path.is_file():
        return None
    try:
        return replace(cls(**json.loads(path.read_text())), cached=True)  # type: ignore[type-var]
    except (ValueError, TypeError) as e:
        log.warning("%s cache %s is unreadable (%s): measuring again", what, path, e)
        return None


def write_cached(path: Path, choice: Any) -> None:
    """Writes a choice atomically (a restart mid-write reads the old one or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(choice), indent=2))
    os.replace(tmp, path)


def choose_weights(ckpt: Checkpoint, candidates: tuple[str, ...] = CANDIDATES, refresh: bool = False) -> FormatChoice:
    """The format `weights: auto` runs for this checkpoint on this CPU: cached, else measured now (and cached)."""
    candidates = tuple(c for c in candidates if c not in ("int4", "int6") or bindings.int4_library() is not None)
    path = cache_dir() / f"{cache_key(ckpt, candidates)}.json"
    cached = None if refresh else read_cached(path, FormatChoice, "format")
    if cached is not None:
        log.info("weights auto -> %s (cached in %s: %s)", cached.weights, path, cached.why)
        return cached
    t0 = time.perf_counter()
    choice = replace(measure(ckpt, candidates), measured_at=time.time())
    write_cached(path, choice)
    log.info(
        "weights auto -> %s (measured in %.1f s on layers %s: %s)",
        choice.weights,
        time.perf_counter() - t0,
        measure_slice(ckpt),
        choice.why,
    )
    return choice
