"""Shared benchmark helpers: machine description, timing, target records, JSON output and skipping.

Every benchmark runs its baseline in the same process and run as its subject, so the machine facts recorded here
(load average above all: the build box is shared) describe both sides of each comparison.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

RESULTS_DIR = Path(__file__).with_name("results")


def skip(msg: str) -> NoReturn:
    """Says why the benchmark cannot run here and exits 0 (a missing input is not a failure)."""
    print(f"SKIPPED {Path(sys.argv[0]).name}: {msg}", flush=True)
    sys.exit(0)


def require_checkpoint(path: Path, also: str = "") -> None:
    """Skips (see skip) unless `path` is a checkpoint folder, saying how to make one (and `also`, another way)."""
    if not (path / "config.json").is_file():
        make = f"make one with `edgeinspect model make-tiny {path} --preset deepseek-vl-1.3b`"
        skip(f"no checkpoint at {path} ({make}{', ' + also if also else ''})")


def cpu_model() -> str:
    from edgeinspect.models.cpu import cpu_model as named

    return named() or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The SIMD extensions that decide which matmul kernels run (bf16 is slow without avx512_bf16/amx), less those
    above EDGEINSPECT_CPU_ISA's level where a run caps it."""
    from edgeinspect.models.cpu import cpu_flags as flags

    arm = platform.machine() == "aarch64"  # ARM's names by prefix would take x86's smep
    simd = ("asimd", "sve", "sme", "i8mm", "bf16", "fphp") if arm else ("avx", "amx", "fma", "f16c")
    return sorted(f for f in flags() if f.startswith(simd))


def meminfo_gib() -> dict[str, float]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                out[key] = round(int(value.split()[0]) / 2**20, 2)  # kB -> GiB
    except OSError:
        pass
    return out


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: other jobs on the box slow every figure, so record them."""
    return [round(x, 2) for x in os.getloadavg()]


def memory_bandwidth_gbs(nbytes: int = 1 << 30, threads: int = 2, repeats: int = 3) -> float:
    """Read bandwidth: the median time to sum a `nbytes` float32 array with `threads` torch threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = torch.ones(nbytes // 4, dtype=torch.float32)  # [N], touched once so pages are resident
        data.sum()
        seconds = median_s(lambda: data.sum(), repeats)
    finally:
        torch.set_num_threads(previous)
    return round(nbytes / seconds / 1e9, 2)


def machine_info(bandwidth: bool = True) -> dict:
    """CPU, cores, memory, library versions, load average and (optionally) measured read bandwidth."""
    import torch

    from edgeinspect.models.cpu import cpu_isa

    info = {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_isa": cpu_isa(),  # `native`, or the level EDGEINSPECT_CPU_ISA capped this run at
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": meminfo_gib(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_start": load_average(),
    }
    if bandwidth:
        info["read_bandwidth_gbs_2_threads"] = memory_bandwidth_gbs()
    return info


def median_s(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    return round(median_s(fn, repeats, warmup) * 1e3, 4)


def target(value: float, goal: float, higher_is_better: bool = True) -> dict:
    """A figure with its target: {"value", "target", "met"}."""
    met = value >= goal if higher_is_better else value <= goal
    return {"value": round(value, 4), "target": goal, "met": bool(met)}


def memory_buckets(probes: list[float], split_gbs: float, row_of: Callable[[list[int], float], dict]) -> dict:
    """Rounds split by the read probe taken before each (memory on a shared box moves by +-30% within seconds):
    {"slow" | "fast": row_of(indices of the rounds whose probe fell there, their median probe GB/s)}, a bucket with no
    round left out."""
    found = {}
    for bucket, keep in (("slow", lambda g: g < split_gbs), ("fast", lambda g: g >= split_gbs)):
        idx = [i for i, gbs in enumerate(probes) if keep(gbs)]
        if idx:
            found[bucket] = row_of(idx, statistics.median(probes[i] for i in idx))
    return found


def write_json(name: str, payload: dict, out: Path | None = None) -> Path:
    """Writes bench/results/<name>.json (or `out`), pretty-printed; returns the path."""
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def spec_context(tokenizer, n_tokens: int) -> str:
    """The sample KB's chunks as the gateway formats retrieved ones ("[doc / section] text"), cut to n_tokens."""
    from edgeinspect.rag import sample_kb_dir
    from edgeinspect.rag.chunking import ChunkConfig, chunk_document
    from edgeinspect.rag.documents import Document, read_document, scan_folder

    lines = []
    for path in scan_folder(sample_kb_dir()):
        doc = read_document(path, sample_kb_dir())
        if isinstance(doc, Document):
            lines += [f"[{c.doc_id} / {c.section}] {c.text}" for c in chunk_document(doc, ChunkConfig())[0]]
        if len(tokenizer("\n".join(lines))["input_ids"]) > n_tokens:
            break
    ids = tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"][:n_tokens]
    return tokenizer.decode(ids)


def inspection_prompt(ckpt, context_tokens: int):
    """The gateway's inspection prompt with ~context_tokens of sample-KB spec context: (ids with the image
    placeholders where DeepSeek-VL puts them, random visual tokens [N_img, Dv]: prefill cost does not depend on
    their values)."""
    import torch

    from edgeinspect.models.checkpoint import load_processor
    from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text

    processor = load_processor(ckpt)
    context = spec_context(processor.tokenizer, context_tokens)
    ids = prompt_ids(processor, prompt_text(processor, build_messages(context=context)))
    n_img = ids.count(ckpt.config.image_token_id)
    visual = torch.randn(n_img, ckpt.config.vision_config.hidden_size, generator=torch.Generator().manual_seed(0))
    return ids, visual
