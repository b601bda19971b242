"""Camera frames at their own resolution: the gate's AUROC and time against tiles per frame (models/anomaly/tiles.py).

    .venv/bin/python bench/anomaly_tiles.py [--threads 2] [--tiles 1 4 9 16] [--out bench/results/anomaly_tiles.json]

Accuracy: the camera-resolution part of the photograph set (retina, 1411 x 1411, defects of 10-30 px; models/anomaly/
photos.py), taught and evaluated as a user runs `anomaly teach --max-tiles N` + `anomaly eval` (efficientnet-lite0
defaults). 1 tile is the frame squashed to the 448 px input (what the gate did before tiling: 3.15x smaller); 16
tiles is native resolution. Time: a 5 MP station frame (2448 x 2048) through the tiled extractor and a 4096-patch
kNN, median of 3, per tile count, so the takt trade-off reads off one table. Same process, same box, same run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import cv2
import faiss
import numpy as np
import torch
from common import load_average, machine_info, write_json

from edgeinspect.models.anomaly import photos
from edgeinspect.models.anomaly.evaluate import evaluate
from edgeinspect.models.anomaly.features import open_extractor
from edgeinspect.models.anomaly.scoring import Scorer
from edgeinspect.models.anomaly.teach import load_frames, teach
from edgeinspect.models.anomaly.tiles import tiled_for

COUNTS = {"n_train": 20, "n_test_good": 10, "per_severity": 2}
FIVE_MP = (2048, 2448)  # (height, width)


def accuracy(root, base, max_tiles: int) -> dict:
    t0 = time.perf_counter()
    bank, _ = teach(load_frames(root / "retina" / "train" / "good"), base, "retina", max_tiles=max_tiles)
    teach_s = time.perf_counter() - t0
    extractor = open_extractor(bank.extractor["name"], **bank.extractor["options"])
    r = evaluate(root / "retina", Scorer(bank, extractor)).to_json()
    tiles = bank.extractor["options"].get("tiles")
    row = {"max_tiles": max_tiles, "tiles": bank.stats["tiles"], "scale": tiles["scale"] if tiles else None,
           "grid": list(bank.grid), "image_auroc": r["image_auroc"], "pixel_auroc": r.get("pixel_auroc"),
           "escaped": r["escaped"], "n_defect": r["n_defect"], "flagged_good": r["flagged_good"],
           "n_good": r["n_good"], "ms_per_frame": r["ms_per_frame"], "teach_s": round(teach_s, 1)}  # fmt: skip
    print(row, flush=True)
    return row


def five_mp(base, frame: np.ndarray, max_tiles: int) -> dict:
    extractor = tiled_for(base, FIVE_MP, max_tiles=max_tiles)
    index = faiss.IndexFlatL2(120)
    index.add(np.random.default_rng(0).standard_normal((4096, 120)).astype(np.float32))
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        grid = extractor.extract([frame])
        index.search(np.ascontiguousarray(grid.reshape(-1, grid.shape[-1])), 1)
        times.append(1e3 * (time.perf_counter() - t0))
    n = getattr(extractor, "n_tiles", 1)
    row = {"max_tiles": max_tiles, "tiles": n, "scale": round(getattr(extractor, "scale", 2448 / 448), 3),
           "ms": round(float(np.median(times[1:])), 1)}  # fmt: skip
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tiles", type=int, nargs="*", default=[1, 4, 9, 16])
    ap.add_argument("--time-tiles", type=int, nargs="*", default=[1, 2, 4, 6, 9, 12, 20])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    load_before = load_average()
    root = photos.cached_photo_set(0, ["retina"], **COUNTS)
    base = open_extractor("efficientnet-lite0")
    frame = cv2.resize(photos.photo("retina"), (FIVE_MP[1], FIVE_MP[0]), interpolation=cv2.INTER_CUBIC)
    timing = [five_mp(base, frame, m) for m in args.time_tiles]
    rows = [accuracy(root, base, m) for m in args.tiles]
    cmd = "python anomaly_tiles.py " + " ".join(
        [f"--threads {args.threads}", "--tiles", *map(str, args.tiles), "--time-tiles", *map(str, args.time_tiles)]
    )
    write_json("anomaly_tiles", {"command": cmd, "machine": machine_info(bandwidth=False), "load_before": load_before,
                                 "set": {"root": str(root), **COUNTS}, "five_mp_ms": timing, "retina": rows,
                                 "load_after": load_average()}, Path(args.out) if args.out else None)  # fmt: skip


if __name__ == "__main__":
    main()
