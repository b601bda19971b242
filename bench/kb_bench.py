"""Knowledge-base benchmark: indexing throughput, search latency (embedding + search), HNSW recall vs exact.

    .venv/bin/python bench/kb_bench.py            # -> bench/results/kb.json

Chunk texts are synthesised from spec-like templates (products x defect classes x numbers). Sizes up to
--embed-max are embedded for real; larger bases replicate the largest embedded set (--embed-max) with small
Gaussian noise (renormalised), because embedding 100k chunks takes ~5+ min even on a quiet box.
Baseline: exact inner-product search (IndexFlatIP) at every size,
beside HNSW (M=32, efConstruction=200, efSearch=128), both fed the same embedded queries.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

import numpy as np

from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.indexer import IndexConfig, build_faiss

PRODUCTS = ["HSG-210 housing", "PCB-410 board", "CVR-310 cover", "SHF-510 shaft", "GSK-610 gasket", "WLD-710 bracket"]
DEFECTS = ["burr", "porosity", "crack", "scratch", "sink mark", "solder bridge", "void", "undercut", "dent",
           "flash", "blister", "corrosion", "cold shut", "short shot", "runout", "label offset"]  # fmt: skip
ZONES = ["zone A", "zone B", "zone C", "the sealing face", "the mounting flange", "the bearing seat"]
SEVER = ["minor", "major", "critical"]
QUERIES = [
    "burr along the housing edge, is 0.3 mm acceptable?",
    "pores on the sealing face after machining",
    "solder bridge between two pins",
    "crack near the mounting boss",
    "sink mark over the rib on the cover",
    "undercut on the bracket weld",
    "runout of the output shaft too high",
    "label 3 mm out of position",
]


def synth_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, d, z, s = rng.choice(PRODUCTS), rng.choice(DEFECTS), rng.choice(ZONES), rng.choice(SEVER)
        lim = round(rng.uniform(0.02, 2.0), 2)
        out.append(
            f"{p} | {d} limits, clause {i % 97}.{i % 13}\n{d.capitalize()} on {z} of the {p}: max {lim} mm, "
            f"at most {rng.randint(1, 6)} per 10 cm². Above the limit the defect is {s}; measure with "
            f"{rng.choice(['the dial depth gauge', 'comparator card DC-5', 'the profilometer', 'X-ray'])}."
        )
    return out


def percentiles(ms: list[float]) -> dict:
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "n": len(ms)}


def time_search(index, embedder: Embedder, queries: list[str], k: int, rounds: int) -> dict:
    ms = []
    for r in range(rounds):
        for q in queries:
            t0 = time.perf_counter()
            qv = embedder.encode_query(f"{q} ({r})")  # [1, 384]; varied text so no cache helps
            index.search(qv, k)
            ms.append((time.perf_counter() - t0) * 1000)
    return percentiles(ms)


def recall_at_k(exact, approx, qvecs: np.ndarray, k: int) -> float:
    _, truth = exact.search(qvecs, k)
    _, got = approx.search(qvecs, k)
    return float(np.mean([len(set(t) & set(g)) / k for t, g in zip(truth, got, strict=True)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="chunk counts")
    ap.add_argument("--rounds", type=int, default=25, help="passes over the 8 queries per latency figure")
    ap.add_argument("--embed-max", type=int, default=10_000, help="largest base embedded for real; above: replicated")
    ap.add_argument("--threads", type=int, default=1, help="torch and FAISS threads (1: steady on a shared box)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/kb.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cfg = IndexConfig()
    import faiss

    faiss.omp_set_num_threads(args.threads)
    embedder = Embedder(batch_size=64, threads=args.threads)
    embedder.encode_query("warm up")

    real_n = min(max(sizes), args.embed_max)
    texts = synth_texts(real_n)
    results: dict = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "load_avg_at_start": list(os.getloadavg()),
        "embed_max": real_n,
        "rounds": args.rounds,
        "sizes": [],
    }
    vec_cache: dict[int, np.ndarray] = {}
    for n in sorted({s for s in sizes if s <= real_n} | {real_n}):
        t0 = time.perf_counter()
        vec_cache[n] = embedder.encode(texts[:n])  # [n, 384]
        embed_s = time.perf_counter() - t0
        results.setdefault("embedding", []).append({"chunks": n, "seconds": embed_s, "chunks_per_s": n / embed_s})
        print(f"embedded {n} chunks in {embed_s:.1f}s ({n / embed_s:.0f}/s)", flush=True)
    base = vec_cache[max(vec_cache)]
    rng = np.random.default_rng(0)
    qvecs = embedder.encode([f"{q} variant {i}" for i in range(63) for q in QUERIES[:8]])  # [504, 384]
    for n in sizes:
        if n in vec_cache:
            vecs, synthetic = vec_cache[n], False
        else:
            reps = -(-n // len(base))
            vecs = np.tile(base, (reps, 1))[:n] + rng.normal(0, 0.02, (reps * len(base), base.shape[1]))[:n]
            vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
            synthetic = True
        row = {"chunks": n, "vectors": f"replicated {len(base)} + noise" if synthetic else "embedded"}
        for kind in ("flat_ip", "hnsw_ip"):
            t0 = time.perf_counter()
            index = build_faiss(vecs, kind, cfg)
            build_s = time.perf_counter() - t0
            row[kind] = {"build_s": build_s, "search": time_search(index, embedder, QUERIES, 5, args.rounds)}
            t0 = time.perf_counter()
            index.search(qvecs, 5)
            row[kind]["index_only_ms_per_query"] = (time.perf_counter() - t0) * 1000 / len(qvecs)
            if kind == "flat_ip":
                exact = index
        row["hnsw_recall_at_5"] = recall_at_k(exact, index, qvecs, 5)
        emb = [e for e in results["embedding"] if e["chunks"] <= n]
        embed_rate = emb[-1]["chunks_per_s"]  # the largest real embedding run not above n
        for kind in ("flat_ip", "hnsw_ip"):
            # Indexing = embedding (measured rate; at 100k the 10k rate) + building the index.
            row[kind]["index_chunks_per_s"] = n / (n / embed_rate + row[kind]["build_s"])
        results["sizes"].append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
