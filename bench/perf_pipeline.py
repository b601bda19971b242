"""Pipelined decoder stages vs a monolith, each a real `edgeinspect serve stage` process pinned to its own core.

Every stage is a separate OS process started with `taskset -c K` and threads=1, driven by the gateway's own client
(services/gateway/decode/stages.py StageCluster / InferenceSession) over loopback gRPC. One configuration runs at a
time: its processes are stopped before the next starts (the box's RAM is shared).

1. Time to first token (TTFT) of an inspection prompt: 576 visual tokens (a random frame [576, vision_hidden]:
   cost does not depend on values) placed by the real prompt builder, plus ~300 tokens of spec context from the
   sample KB. TTFT = from sending the prompt to receiving the first token (prefill incl. sampling).
   Monolith (one process, all layers, one core): prompt whole and chunked, the better counts. Split (S=2 stages,
   one core each): pipelined prefill (chunks overlap across stages) at each of `--chunks`, the best counts.
   Target: split / monolith <= 0.65. The weights format is picked by the monolith's whole-prompt TTFT in fp32 and
   bf16 (`--weights measure`) and used on both sides.
2. Aggregate decode throughput: C concurrent sessions (asyncio tasks, each its own PipelineSession), a ~32-token
   text prompt each, then `--decode-tokens` steps each; only the decode phase is timed. Monolith on one core (its
   continuous batching folds the C streams into one pass) vs S=2 stages on two cores, the split both ways the
   gateway's `micro_batches` setting allows: sessions in S groups, one group per stage pass (default), and all in
   one group (lockstep). Target (bf16, each C): split tok/s >= 0.9 x S x monolith tok/s, the better mode counting
   (recorded by name). Other formats are reported beside it.

The client (this process: gRPC, frame slicing) is not pinned and shares the box's cores with the stages.

    .venv/bin/python bench/perf_pipeline.py                               # 1.3B, both measurements
    .venv/bin/python bench/perf_pipeline.py --only ttft --weights bf16 --chunks 64,128,256
    .venv/bin/python bench/perf_pipeline.py --checkpoint DIR --decode-tokens 8 --concurrency 2,4 --out FILE
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from common import (
    RESULTS_DIR,
    inspection_prompt,
    load_average,
    machine_info,
    meminfo_gib,
    memory_bandwidth_gbs,
    require_checkpoint,
    skip,
    spec_context,
    target,
    write_json,
)

from edgeinspect import codec
from edgeinspect.config import ServerConfig, write_yaml
from edgeinspect.errors import Unavailable
from edgeinspect.models.checkpoint import Checkpoint, load_processor, open_checkpoint
from edgeinspect.services.gateway.decode.pipeline import WireOptions
from edgeinspect.services.gateway.decode.stages import StageCluster
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.stack.launcher import RoleProcess, stage_ranges
from edgeinspect.v1 import stage_pb2

log = logging.getLogger("perf_pipeline")
DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
TTFT_TARGET = 0.65  # split / monolith
THROUGHPUT_TARGET = 0.9  # split / (S x monolith)
STAGES = 2
MAX_MESSAGE_MB = 64
MAX_STEP_TOKENS = 8192  # a whole prompt is one pass on the stage: the client decides the chunking
SAMPLING = stage_pb2.SamplingParams()  # greedy


# -- processes --------------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when this benchmark dies, even by SIGKILL (run_all's timeout)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _wait_serving(role: RoleProcess, port_file: Path, timeout_s: float) -> None:
    """Waits for the port file, then for the health service to say SERVING (weights loaded, canary passed)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if role.proc.poll() is not None:
            raise Unavailable(f"{role.name} exited with {role.proc.returncode}:\n{role.log_tail()}")
        if not role.port and port_file.is_file() and port_file.read_text().strip():
            role.port = int(port_file.read_text())
        if role.port:
            with grpc.insecure_channel(f"127.0.0.1:{role.port}") as channel, contextlib.suppress(grpc.RpcError):
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        time.sleep(0.2)
    raise Unavailable(f"{role.name} was not SERVING within {timeout_s:.0f} s; see {role.log_path}")


@contextlib.contextmanager
def stage_processes(
    ckpt: Checkpoint, cores: list[int], weights: str, workdir: Path, timeout_s: float
) -> Iterator[list[str]]:
    """Starts len(cores) stages over [0, num_layers), stage k pinned to cores[k] with one thread; yields addresses
    and stops (SIGTERM, then SIGKILL) exactly the processes it started."""
    roles: list[RoleProcess] = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    try:
        for k, ((a, b), core) in enumerate(zip(stage_ranges(ckpt.num_layers, len(cores)), cores, strict=True)):
            name = f"stage{k}of{len(cores)}"
            port_file = workdir / f"{name}.port"
            port_file.unlink(missing_ok=True)
            cfg = StageSettings(
                checkpoint=ckpt.path,
                layer_start=a,
                layer_end=b,
                weights=weights,
                threads=1,
                max_batch_sessions=8,
                max_step_tokens=MAX_STEP_TOKENS,
                log_level="WARNING",
                server=ServerConfig(host="127.0.0.1", port=0, port_file=port_file, grace_s=1.0),
            )
            write_yaml(cfg, workdir / f"{name}.yaml")
            log_path = workdir / f"{name}.log"
            with log_path.open("ab") as logf:
                cmd = ["taskset", "-c", str(core), sys.executable, "-m", "edgeinspect.services.stage"]
                proc = subprocess.Popen(
                    [*cmd, "--config", str(workdir / f"{name}.yaml")],
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            roles.append(RoleProcess(name, proc, 0, log_path))
        for role in roles:
            _wait_serving(role, workdir / f"{role.name}.port", timeout_s)
        yield [f"127.0.0.1:{r.port}" for r in roles]
    finally:
        for role in roles:
            if role.proc.poll() is None:
                role.proc.send_signal(signal.SIGTERM)
        for role in roles:
            try:
                role.proc.wait(15)
            except subprocess.TimeoutExpired:
                role.proc.kill()
                role.proc.wait()


async def _pipeline(ckpt: Checkpoint, addresses: list[str], wire: codec.Codec, micro_batches: int = 0) -> StageCluster:
    cluster = await StageCluster.connect(
        addresses, ckpt, WireOptions(wire, False), micro_batches=micro_batches, max_message_mb=MAX_MESSAGE_MB
    )
    cluster.regroup()
    return cluster


# -- 1. time to first token -------------------------------------------------------------------------------------


async def ttft_runs(ckpt, addresses, wire, ids, visual, chunks: list[int], repeats: int) -> dict[str, dict]:
    """TTFT per chunk size (0 = whole prompt) through the stages at `addresses`, median of `repeats`."""
    pipeline = await _pipeline(ckpt, addresses, wire)
    frame = codec.encode_frame(visual, wire)  # as the vision node sends it
    image_id = ckpt.config.image_token_id
    out = {}
    try:
        # Untimed: first touch of every weight page and of a chunk-sized pass's buffers.
        warm = [i for i in ids if i != image_id][: max(64, *chunks)]
        async with pipeline.session("warmup", warm, None, SAMPLING, chunk_tokens=min(64, len(warm))) as session:
            await session.prefill()
        for chunk in chunks:
            times, busiest = [], []
            for r in range(repeats):
                async with pipeline.session(f"ttft-{chunk}-{r}", ids, frame, SAMPLING, chunk_tokens=chunk) as session:
                    t0 = time.perf_counter()
                    res = await session.prefill()
                    times.append((time.perf_counter() - t0) * 1e3)
                per_stage: dict[str, float] = {}
                for t in res.timings:
                    per_stage[t.stage] = per_stage.get(t.stage, 0.0) + t.compute_ms
                busiest.append(max(per_stage.values()))
            out["whole" if chunk == 0 else str(chunk)] = {
                "chunk_tokens": chunk,
                "ttft_ms": round(statistics.median(times), 1),
                "runs_ms": [round(t, 1) for t in times],
                "busiest_stage_compute_ms": round(statistics.median(busiest), 1),
            }
            log.info("  chunk %s: %.0f ms", chunk or "whole", statistics.median(times))
    finally:
        await pipeline.close()
    return out


def measure_ttft(ckpt, cores, args, wire, workdir) -> dict:
    ids, visual = inspection_prompt(ckpt, args.context_tokens)
    n_img = visual.shape[0]
    result: dict = {"prompt_tokens": len(ids), "image_tokens": n_img, "text_tokens": len(ids) - n_img}

    def config(label: str, stage_cores: list[int], weights: str, chunks: list[int]) -> dict:
        log.info("ttft %s (%s, cores %s), free %s GiB", label, weights, stage_cores, meminfo_gib())
        row = {"weights": weights, "cores": stage_cores, "loadavg": load_average(), "memory_gib": meminfo_gib()}
        with stage_processes(ckpt, stage_cores, weights, workdir, args.start_timeout) as addresses:
            row["runs"] = asyncio.run(ttft_runs(ckpt, addresses, wire, ids, visual, chunks, args.repeats))
        row["best"] = min(row["runs"].values(), key=lambda r: r["ttft_ms"])
        return row

    formats = ["fp32", "bf16"] if args.weights == "measure" else [args.weights]
    # Whole and chunked prompts on the same monolith process; its best TTFT per format picks the format.
    monolith = {f: config(f"monolith {f}", cores[:1], f, [0, args.monolith_chunk]) for f in formats}
    weights = min(formats, key=lambda f: monolith[f]["best"]["ttft_ms"])
    result["weights"] = weights
    result["format_choice"] = {f: monolith[f]["best"]["ttft_ms"] for f in formats}
    mono = monolith[weights]
    split = config(f"split x{len(cores)} {weights}", cores, weights, args.chunks)
    result |= {"monolith": mono, "split": split}
    if len(formats) > 1:
        result["monolith_other_formats"] = {f: monolith[f] for f in formats if f != weights}
    ratio = split["best"]["ttft_ms"] / mono["best"]["ttft_ms"]
    result["per_chunk_ratio"] = {k: round(r["ttft_ms"] / mono["best"]["ttft_ms"], 4) for k, r in split["runs"].items()}
    result["split_vs_monolith"] = round(ratio, 4)
    return result


# -- 2. aggregate decode throughput -----------------------------------------------------------------------------


def text_prompts(ckpt: Checkpoint, n: int, tokens: int) -> list[list[int]]:
    """n different ~`tokens`-token text prompts (spec text at different offsets)."""
    tok = load_processor(ckpt).tokenizer
    ids = tok(spec_context(tok, tokens * (n + 1)), add_special_tokens=False)["input_ids"]
    bos = ckpt.text_config.bos_token_id
    return [[bos, *ids[k * tokens : (k + 1) * tokens - 1]] for k in range(n)]


async def _decode(session, steps: int) -> float:
    """`steps` greedy decode steps; returns the mean per-token latency in ms."""
    t0 = time.perf_counter()
    for _ in range(steps):
        await session.decode()
    return (time.perf_counter() - t0) * 1e3 / steps


async def decode_runs(
    ckpt, addresses, wire, prompts_by_c: dict[int, list[list[int]]], steps: int, micro_batches: int = 0
) -> dict:
    """For each concurrency C: C sessions prefill concurrently, then decode `steps` tokens each, all at once."""
    pipeline = await _pipeline(ckpt, addresses, wire, micro_batches)
    out = {}
    try:
        for c, prompts in [(0, prompts_by_c[min(prompts_by_c)]), *prompts_by_c.items()]:  # C=0: warm-up round
            async with contextlib.AsyncExitStack() as stack:
                sessions = [
                    await stack.enter_async_context(pipeline.session(f"dec{c}-{i}", p, None, SAMPLING, chunk_tokens=0))
                    for i, p in enumerate(prompts)
                ]
                await asyncio.gather(*(s.prefill() for s in sessions))
                n = steps if c else 2
                t0 = time.perf_counter()
                latencies = await asyncio.gather(*(_decode(s, n) for s in sessions))
                wall = time.perf_counter() - t0
            if c:
                out[str(c)] = {
                    "sessions": c,
                    "decode_tokens": c * n,
                    "seconds": round(wall, 3),
                    "tokens_per_s": round(c * n / wall, 3),
                    "mean_token_latency_ms": round(statistics.mean(latencies), 1),
                }
                log.info("  C=%d: %.2f tok/s", c, c * n / wall)
    finally:
        await pipeline.close()
    return out


def measure_throughput(ckpt, cores, args, wire, workdir) -> dict:
    prompts = {c: text_prompts(ckpt, c, args.prompt_tokens) for c in args.concurrency}
    result: dict = {"prompt_tokens": args.prompt_tokens, "decode_steps_per_session": args.decode_tokens, "formats": {}}
    for weights in args.decode_weights:
        rows = {}
        for label, stage_cores in (("monolith", cores[:1]), ("split", cores)):
            log.info("throughput %s %s (cores %s), free %s GiB", label, weights, stage_cores, meminfo_gib())
            row = {"cores": stage_cores, "loadavg": load_average(), "memory_gib": meminfo_gib()}
            with stage_processes(ckpt, stage_cores, weights, workdir, args.start_timeout) as addresses:
                row["runs"] = asyncio.run(decode_runs(ckpt, addresses, wire, prompts, args.decode_tokens))
                if label == "split":  # the same stages with every session in one group: the lockstep alternative
                    row["runs_one_group"] = asyncio.run(
                        decode_runs(ckpt, addresses, wire, prompts, args.decode_tokens, micro_batches=1)
                    )
            rows[label] = row
        s = len(cores)
        mono, split = rows["monolith"]["runs"], rows["split"]
        modes = {"micro_batches=S": split["runs"], "micro_batches=1": split["runs_one_group"]}
        vs = {  # split / (S x monolith) per mode and C
            m: {str(c): runs[str(c)]["tokens_per_s"] / (s * mono[str(c)]["tokens_per_s"]) for c in args.concurrency}
            for m, runs in modes.items()
        }
        # the gateway's micro_batches setting picks the mode: the better one counts, and it is named
        rows["split_mode"] = {str(c): max(vs, key=lambda m, c=str(c): vs[m][c]) for c in args.concurrency}
        ratios = {c: vs[m][c] for c, m in rows["split_mode"].items()}
        rows["split_micro_batches_vs_S_x_monolith"] = {c: round(r, 4) for c, r in vs["micro_batches=S"].items()}
        rows["split_vs_S_x_monolith"] = {c: round(r, 4) for c, r in ratios.items()}
        rows["split_vs_monolith"] = {c: round(r * s, 4) for c, r in ratios.items()}
        result["formats"][weights] = rows
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="DeepSeek-VL checkpoint folder")
    ap.add_argument(
        "--weights",
        default="measure",
        choices=["measure", "fp32", "bf16", "int8"],
        help="TTFT weights format on both sides (measure: the faster monolith prefill of fp32 and bf16)",
    )
    ap.add_argument("--decode-weights", default="bf16,fp32", help="formats for the decode throughput measurement")
    ap.add_argument("--chunks", default="64,128,256", help="pipelined prefill chunk sizes tried for the split")
    ap.add_argument("--monolith-chunk", type=int, default=256, help="chunk size of the monolith's chunked prefill")
    ap.add_argument("--context-tokens", type=int, default=300, help="spec-context tokens in the TTFT prompt")
    ap.add_argument("--repeats", type=int, default=1, help="timed prefills per chunk size (median)")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="text prompt tokens per decode session")
    ap.add_argument("--decode-tokens", type=int, default=20, help="timed decode steps per session")
    ap.add_argument("--concurrency", default="2,4", help="concurrent sessions C for the decode measurement")
    ap.add_argument("--codec", default="fp16", choices=["fp32", "fp16"], help="tensor codec between nodes")
    ap.add_argument("--only", choices=["ttft", "throughput"], help="run only one of the two measurements")
    ap.add_argument("--start-timeout", type=float, default=600.0, help="seconds a stage may take to load")
    ap.add_argument("--no-bandwidth", action="store_true", help="skip the read-bandwidth probe (1 GiB array)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "perf_pipeline.json", help="JSON to write")
    args = ap.parse_args()
    # SIGTERM unwinds like an exception, so the stage processes this run started are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.chunks = [int(c) for c in args.chunks.split(",") if c]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.decode_weights = [w for w in args.decode_weights.split(",") if w]
    require_checkpoint(args.checkpoint)
    if subprocess.run(["taskset", "-V"], capture_output=True, check=False).returncode != 0:
        skip("taskset (util-linux) is not installed")
    torch.set_num_threads(1)
    usable = sorted(os.sched_getaffinity(0))
    cores = usable[:STAGES] if len(usable) >= STAGES else [usable[0]] * STAGES  # one core: both share it (noted)
    ckpt = open_checkpoint(args.checkpoint)
    wire = codec.Codec[args.codec]
    machine = machine_info(bandwidth=not args.no_bandwidth)
    if not args.no_bandwidth:  # one core's share of the memory bus: what a pinned bandwidth-bound stage can read
        machine["read_bandwidth_gbs_1_thread"] = memory_bandwidth_gbs(threads=1)
    payload: dict = {
        "checkpoint": str(args.checkpoint),
        "stages": STAGES,
        "stage_cores": cores,
        "threads_per_stage": 1,
        "codec": args.codec,
        "client": "this process, not pinned: its gRPC and frame work share the cores with the stages",
        "machine": machine,
        "targets": {},
    }
    with tempfile.TemporaryDirectory(prefix="perf_pipeline-") as tmp:
        if args.only in (None, "ttft"):
            payload["ttft"] = measure_ttft(ckpt, cores, args, wire, Path(tmp))
            ratio = payload["ttft"]["split_vs_monolith"]
            payload["targets"]["ttft_split_vs_monolith"] = target(ratio, TTFT_TARGET, higher_is_better=False)
        if args.only in (None, "throughput"):
            payload["throughput"] = measure_throughput(ckpt, cores, args, wire, Path(tmp))
            bf16 = payload["throughput"]["formats"].get("bf16", {})
            for c, ratio in bf16.get("split_vs_S_x_monolith", {}).items():
                payload["targets"][f"decode_split_vs_S_x_monolith_bf16_C{c}"] = target(ratio, THROUGHPUT_TARGET)
    machine["loadavg_end"] = load_average()
    path = write_json("perf_pipeline", payload, args.out)
    for name, rec in payload["targets"].items():
        log.info("%s: %s", name, rec)
    log.info("wrote %s", path)


if __name__ == "__main__":
    main()
