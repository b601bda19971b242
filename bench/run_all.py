"""Runs the benchmark suite and summarises every target: bench/results/*.json + bench/results/SUMMARY.md.

Each bench/*.py script runs in its own process (one after another: they would disturb each other's timings),
with its own baseline in the same run, and writes bench/results/<name>.json. Afterwards every record of the form
{"value", "target", "met"} found in those files is collected into bench/results/summary.json and a Markdown table,
with the machine (CPU model, cores, read bandwidth, load average) beside it.

    .venv/bin/python bench/run_all.py                      # everything (long: the 1.3B benchmarks take minutes each)
    .venv/bin/python bench/run_all.py --only perf_decode,perf_batching
    .venv/bin/python bench/run_all.py --summary-only       # re-summarise the JSON already there
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS_DIR, load_average, machine_info, write_json

BENCH_DIR = Path(__file__).resolve().parent
# Helpers (report_timing: perf_report's measurements); prefill_ab compares two revisions: by hand.
NOT_BENCHMARKS = {"common", "step_ab", "run_all", "prefill_ab", "report_timing"}
# Perf benchmarks first (they answer the performance issue), then the others in name order.
FIRST = ["perf_decode", "perf_batching", "stage_split", "perf_report", "perf_pipeline", "perf_prefix"]


def scripts(only: set[str] | None, skip: set[str]) -> list[Path]:
    found = {p.stem: p for p in sorted(BENCH_DIR.glob("*.py")) if p.stem not in NOT_BENCHMARKS}
    order = [n for n in FIRST if n in found] + [n for n in found if n not in FIRST]
    return [found[n] for n in order if (only is None or n in only) and n not in skip]


def run_script(path: Path, timeout_s: float) -> dict:
    """Runs one benchmark; returns how it went (its JSON is whatever it wrote)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(path)],
            cwd=BENCH_DIR.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        status = "skipped" if "SKIPPED" in proc.stdout else ("ok" if proc.returncode == 0 else "failed")
        tail = (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        status, tail = "timeout", f"killed after {timeout_s:.0f} s"
    return {"script": path.name, "status": status, "seconds": round(time.perf_counter() - t0, 1), "tail": tail}


def collect_targets(node, prefix: str = "") -> dict[str, dict]:
    """Every {"value", "target", "met"} record under `node`, keyed by its dotted path."""
    found: dict[str, dict] = {}
    if isinstance(node, dict):
        if {"value", "target", "met"} <= node.keys():
            return {prefix: node}
        for key, value in node.items():
            found |= collect_targets(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found |= collect_targets(value, f"{prefix}[{i}]")
    return found


def summarise(machine: dict, runs: list[dict]) -> tuple[dict, str]:
    rows = []
    for path in sorted(RESULTS_DIR.glob("*.json")):
        if path.stem == "summary":
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        m = data.get("machine", {}) if isinstance(data, dict) else {}
        for name, rec in collect_targets(data).items():
            rows.append(
                {
                    "benchmark": path.stem,
                    "name": name,
                    "value": rec["value"],
                    "target": rec["target"],
                    "met": rec["met"],
                    "loadavg": m.get("loadavg_start"),
                }
            )
    summary = {"machine": machine, "runs": runs, "targets": rows}
    bw = machine.get("read_bandwidth_gbs_2_threads")
    lines = [
        "# Benchmark summary",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('usable_cores')} usable cores, read bandwidth {bw} GB/s "
        f"(2 threads), load average at start {machine.get('loadavg_start')}, at end {load_average()}.",
        "Each value is a ratio or figure against its baseline measured in the same run of that benchmark.",
        "",
        "| benchmark | target | value | goal | met | load avg (1/5/15 min) |",
        "|---|---|---:|---:|:---:|---|",
    ]
    for r in rows:
        met = "yes" if r["met"] else "**no**"
        lines.append(f"| {r['benchmark']} | {r['name']} | {r['value']} | {r['target']} | {met} | {r['loadavg']} |")
    if runs:
        lines += ["", "| script | status | seconds |", "|---|---|---:|"]
        lines += [f"| {r['script']} | {r['status']} | {r['seconds']} |" for r in runs]
    return summary, "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated benchmark names (file stems) to run")
    ap.add_argument("--skip", default="", help="comma-separated benchmark names to leave out")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark before it is killed")
    ap.add_argument("--summary-only", action="store_true", help="only re-summarise the JSON already written")
    args = ap.parse_args()
    machine = machine_info()
    runs = []
    if not args.summary_only:
        only = set(args.only.split(",")) - {""} or None
        for path in scripts(only, set(args.skip.split(",")) - {""}):
            print(f"running {path.name} ...", flush=True)
            res = run_script(path, args.timeout)
            print(f"  {res['status']} in {res['seconds']} s", flush=True)
            if res["status"] != "ok":
                print("  " + res["tail"].replace("\n", "\n  "), flush=True)
            runs.append(res)
    summary, markdown = summarise(machine, runs)
    write_json("summary", summary)
    (RESULTS_DIR / "SUMMARY.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
