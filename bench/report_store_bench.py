"""The report store's costs: storing a report with its frame vs without, and the console's queries on many reports.

complete() per report, three ways in the same run: report only (the baseline), report + a 53 kB sample frame
(content-addressed file + 256 px thumbnail), and the same with a byte budget so every store also prunes. Then, on
N stored reports: ListReports filtered by defect class, by review state, and AggregateReports per station in 8 h
buckets (the stations page's shift counts), each the median of repeats.

--writers: the database under a gateway pair, SQLite (synchronous=FULL) vs PostgreSQL (fsync, synchronous_commit on:
the server's defaults) on this box in the same run: N writer threads each storing reports (claim + complete, two
commits) with their own store (connection), and the same threads sharing one store (one gateway process); reports/s
and the p50/p99 latency of each commit. PostgreSQL is a throwaway server from Debian's binaries on a unix socket.

--outbox: what the line's transactional outbox costs a result: one writer storing reports (claim + complete) with
0, 1 and 2 outputs' rows written in complete()'s transaction, SQLite (synchronous=FULL) and PostgreSQL in the same
run; reports/s and the p50/p99 of the complete() commit.

    .venv/bin/python bench/report_store_bench.py            # -> bench/results/report_store.json
    .venv/bin/python bench/report_store_bench.py --writers 8  # -> bench/results/report_store_writers.json
    .venv/bin/python bench/report_store_bench.py --outbox 300  # -> bench/results/report_store_outbox.json
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/pg_testing.py: a throwaway PostgreSQL
from common import load_average, machine_info, median_ms, write_json  # noqa: E402
from pg_testing import PostgresServer, unavailable_reason  # noqa: E402

from edgeinspect.assets import asset_path  # noqa: E402
from edgeinspect.services.gateway.reports.store import ReportStore  # noqa: E402
from edgeinspect.services.gateway.settings import FrameSettings  # noqa: E402
from edgeinspect.services.outputs.outbox import OutboxWriter  # noqa: E402
from edgeinspect.services.store.database import PostgresDatabase  # noqa: E402
from edgeinspect.v1 import inspection_pb2  # noqa: E402

T0 = datetime(2026, 1, 5, 6, 0, tzinfo=UTC)
CLASSES = ["porosity", "scratch", "dent", "burr", "crack"]
# Reports are 7 s apart: 20,000 of them span 1.6 days, so the shift window below (day 1, 06:00-14:00) is full.


def _report(store: ReportStore, rng: random.Random, i: int, prefix: str = "k") -> inspection_pb2.DefectReport:
    key = f"{prefix}{i}"
    report_id, _ = store.claim(key, "bench")
    verdict = rng.choice([1, 1, 2, 3])
    r = inspection_pb2.DefectReport(report_id=report_id, idempotency_key=key, station=f"st{rng.randint(1, 8)}",
                                    camera_id=f"cam{rng.randint(1, 16)}", verdict=verdict,
                                    description="x" * 120)  # fmt: skip
    for c in rng.sample(CLASSES, rng.randint(1, 2)) if verdict == 2 else []:
        r.defects.add(defect_class=c, severity="minor", location="edge", evidence="seen")
    r.created_time.FromDatetime(T0 + timedelta(seconds=i * 7))
    return r


def store_per_report_ms(folder: Path, n: int, frames: FrameSettings | None, frame: bytes | None) -> float:
    rng = random.Random(1)
    with ReportStore(folder / "reports.sqlite", frames=frames) as store:
        t0 = time.perf_counter()
        for i in range(n):
            # A unique trailer after the JPEG's end marker: a distinct file per report that still decodes.
            image = frame + i.to_bytes(4, "big") if frame else None
            store.complete(_report(store, rng, i), image=image)
        return round((time.perf_counter() - t0) / n * 1e3, 3)


def _ms_quantiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"p50": round(ordered[len(ordered) // 2] * 1e3, 2), "p99": round(ordered[int(len(ordered) * 0.99)] * 1e3, 2)}


def concurrent_writers(open_store: Callable[[], ReportStore], writers: int, per_writer: int, shared: bool) -> dict:
    """`writers` threads storing `per_writer` reports each (claim + complete), each with its own store or all
    through one: reports/s over the whole run and each commit's latency."""
    stores = [open_store()] if shared else [open_store() for _ in range(writers)]
    barrier = threading.Barrier(writers + 1)
    claims: list[float] = []
    completes: list[float] = []

    def run(w: int) -> None:
        store, rng = stores[0 if shared else w], random.Random(w)
        mine_claim, mine_complete = [], []
        barrier.wait()
        for i in range(per_writer):
            t0 = time.perf_counter()
            report = _report(store, rng, i, prefix=f"w{w}-")
            t1 = time.perf_counter()
            store.complete(report)
            mine_claim.append(t1 - t0)
            mine_complete.append(time.perf_counter() - t1)
        claims.extend(mine_claim)
        completes.extend(mine_complete)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for store in stores:
        store.close()
    return {
        "reports_per_s": round(writers * per_writer / wall, 1),
        "claim_commit_ms": _ms_quantiles(claims),
        "complete_commit_ms": _ms_quantiles(completes),
    }


def writers_main(writers: int, per_writer: int, out: Path | None) -> None:
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"PostgreSQL is needed for --writers: {reason}")
    info = machine_info(bandwidth=False)
    load_start = load_average()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, PostgresServer() as pg:
        for shared in (False, True):
            mode = "one_store_shared" if shared else "store_per_writer"
            # A fresh database per run: the SQLite file (FULL sync) and a new, empty PostgreSQL schema.
            path, dsn = Path(tmp) / f"{mode}.sqlite", pg.fresh_schema_dsn()
            runs = {
                "sqlite_full": lambda path=path: ReportStore(path),
                "postgres": lambda dsn=dsn: ReportStore(PostgresDatabase(dsn)),
            }
            for name, open_store in runs.items():
                results[f"{name}/{mode}"] = concurrent_writers(open_store, writers, per_writer, shared)
                print(name, mode, results[f"{name}/{mode}"], flush=True)
    result = {
        "machine": info,
        "loadavg_start": load_start,
        "loadavg_end": load_average(),
        "writers": writers,
        "reports_per_writer": per_writer,
        "postgres": "Debian postgresql, defaults (fsync=on, synchronous_commit=on), unix socket, same disk as SQLite",
        "results": results,
    }
    print(write_json("report_store_writers", result, out))


def outbox_commits(store: ReportStore, n: int) -> dict:
    """`n` reports stored for the line (claim + complete(to_line=True)) by one writer: reports/s, complete() commits."""
    rng, completes = random.Random(3), []
    t0 = time.perf_counter()
    for i in range(n):
        report = _report(store, rng, i)
        t1 = time.perf_counter()
        store.complete(report, to_line=True)
        completes.append(time.perf_counter() - t1)
    wall = time.perf_counter() - t0
    store.close()
    return {"reports_per_s": round(n / wall, 1), "complete_commit_ms": _ms_quantiles(completes)}


def outbox_main(n: int, out: Path | None) -> None:
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"PostgreSQL is needed for --outbox: {reason}")
    info = machine_info(bandwidth=False)
    load_start = load_average()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, PostgresServer() as pg:
        for outputs in ((), ("mqtt",), ("mqtt", "webhook0")):
            # Rows pile up as they would with every peer down (no drainer): the insert cost, not a drain race.
            writer = OutboxWriter(outputs, 10_000_000, False)
            path, dsn = Path(tmp) / f"outbox{len(outputs)}.sqlite", pg.fresh_schema_dsn()
            for name, db in (("sqlite_full", path), ("postgres", PostgresDatabase(dsn))):
                key = f"{name}/{len(outputs)}_outputs"
                results[key] = outbox_commits(ReportStore(db, outbox=writer), n)
                print(key, results[key], flush=True)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "machine": info,
        "loadavg_start": load_start,
        "loadavg_end": load_average(),
        "reports": n,
        "postgres": "Debian postgresql, defaults (fsync=on, synchronous_commit=on), unix socket, same disk as SQLite",
        "results": results,
    }
    print(write_json("report_store_outbox", result, out))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writes", type=int, default=300, help="reports stored per complete() variant")
    parser.add_argument("--reports", type=int, default=20000, help="reports in the database the queries run on")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--writers", type=int, default=0, help="SQLite vs PostgreSQL with this many writers, only")
    parser.add_argument("--per-writer", type=int, default=50, help="--writers: reports each writer stores")
    parser.add_argument("--outbox", type=int, default=0, help="the outbox's cost with this many reports, only")
    args = parser.parse_args()
    if args.outbox:
        outbox_main(args.outbox, args.out)
        return
    if args.writers:
        writers_main(args.writers, args.per_writer, args.out)
        return
    info = machine_info(bandwidth=False)
    frame = asset_path("part_dent.jpg").read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        baseline = store_per_report_ms(root / "a", args.writes, None, None)
        with_frame = store_per_report_ms(root / "b", args.writes, FrameSettings(), frame)
        pruning = store_per_report_ms(root / "c", args.writes, FrameSettings(max_bytes=50 * len(frame)), frame)

        rng = random.Random(2)
        with ReportStore(root / "q" / "reports.sqlite") as store:
            store._db.execute("PRAGMA synchronous=OFF")  # filling only: the queries are what is measured
            for i in range(args.reports):
                store.complete(_report(store, rng, i))
                if i % 10 == 0:
                    store.review(store.list(page_size=1)[0][0].report_id, 1, [], "", "bench", "admin")
            queries = {
                "list_class_page_ms": median_ms(lambda: store.list(defect_class="porosity", page_size=50), 9),
                "list_disagreed_page_ms": median_ms(lambda: store.list(review=3, page_size=50), 9),
                "list_station_page_ms": median_ms(lambda: store.list(station="st3", page_size=50), 9),
                "aggregate_8h_buckets_ms": median_ms(lambda: store.aggregate(bucket_s=8 * 3600), 5),
                "aggregate_one_shift_ms": median_ms(
                    lambda: store.aggregate(since=T0 + timedelta(days=1), until=T0 + timedelta(days=1, hours=8)), 9
                ),
            }
    result = {
        "machine": info,
        "loadavg_end": load_average(),
        "writes": args.writes,
        "reports": args.reports,
        "complete_ms_per_report": {
            "report_only": baseline,
            "with_frame": with_frame,
            "with_frame_and_pruning": pruning,
        },
        "frame_cost_ratio": round(with_frame / baseline, 2),
        "frame_and_prune_cost_ratio": round(pruning / baseline, 2),
        "queries_on_reports": queries,
    }
    print(write_json("report_store", result, args.out))
    print(result["complete_ms_per_report"], result["queries_on_reports"])


if __name__ == "__main__":
    main()
