"""Decoder stages and vision on a CUDA GPU at the 1.3B shape (random weights from the config alone).

Decode ms/token at context 0/1000/4000, batch 1 and 8, for bf16/int8/int4 (a format the GPU refuses is recorded with
its reason), against the read bound (weight + KV bytes over the measured device copy bandwidth) and against
transformers' generate() with a static cache in bf16; prefill tokens/s; vision ms/image per backend. Writes
bench/results/gpu.json with the GPU's name, driver and torch version. Run by tools/gpu_check.sh.

What an H100's figures say about a Jetson Orin: the ratio to the read bound carries over (both are read-bound at
batch 1), the milliseconds do not (Orin NX ~100 GB/s shared LPDDR5 vs ~3 TB/s HBM, ~30x; no PCIe copies on the
Orin, where host and device share memory).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.common import write_json
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_device_stage
from edgeinspect.models.stage.device import format_refusal
from edgeinspect.models.tiny import make_random_preset

CUDA = torch.device("cuda", 0)


def gpu_info() -> dict:
    p = torch.cuda.get_device_properties(CUDA)
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        driver = "unknown"
    return {
        "gpu": p.name,
        "capability": f"sm{p.major}{p.minor}",
        "memory_gib": round(p.total_memory / 2**30, 1),
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy: each byte read once and written once."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=CUDA)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * nbytes * 10 / (time.perf_counter() - t0) / 1e9


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes a decode step reads: every parameter and buffer of the layers and the lm_head (not the embeddings)."""
    parts = [module.layers] + ([module.lm_head] if module.lm_head is not None else [])
    total = 0
    for part in parts:
        for t in list(part.parameters()) + list(part.buffers()):
            total += t.numel() * t.element_size()
    return total


def time_decode(ex: StageExecutor, batch: int, context: int, steps: int) -> float:
    """ms per decode step of `batch` sessions whose caches hold `context` positions (contents do not change the
    time: the step reads the whole static cache either way)."""
    sids = [f"b{i}" for i in range(batch)]
    for sid in sids:
        sess = ex.open(sid, capacity=context + steps + 8)
        sess.kv.length = context
    pos = context

    def step():
        nonlocal pos
        ex.step([(sid, StepInput(pos, input_ids=torch.tensor([7]))) for sid in sids])
        pos += 1

    for _ in range(3):  # the first steps capture the graph
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    for sid in sids:
        ex.release(sid)
    return (time.perf_counter() - t0) / steps * 1e3


def time_prefill(ex: StageExecutor, tokens: int) -> float:
    ex.step([("p", StepInput(0, input_ids=torch.arange(tokens) % 1000 + 5))])
    ex.release("p")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ex.step([("p", StepInput(0, input_ids=torch.arange(tokens) % 1000 + 5))])
    torch.cuda.synchronize()
    ex.release("p")
    return tokens / (time.perf_counter() - t0)


def _generate_s(model, ids: torch.Tensor, n: int, kw: dict) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(input_ids=ids, max_new_tokens=n, min_new_tokens=n, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def transformers_ms_per_token(path: Path, steps: int = 64) -> dict:
    from transformers import DeepseekVLForConditionalGeneration

    model = DeepseekVLForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).to(CUDA).eval()
    ids = torch.arange(16, device=CUDA)[None] + 5
    out = {}
    for label, compile_ in (("static", False), ("static+compile", True)):  # compile: where it works
        kw = {"cache_implementation": "static", "do_sample": False}
        model.generation_config.disable_compile = not compile_
        try:
            _generate_s(model, ids, 4, kw)
            run_time = _generate_s(model, ids, steps + 1, kw) - _generate_s(model, ids, 1, kw)
            out[label] = round(run_time / steps * 1e3, 3)
        except Exception as exc:  # a record of why, not a crash: the bench's other figures still count
            out[label] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    del model
    torch.cuda.empty_cache()
    return out


def vision_ms(path: Path) -> dict:
    from edgeinspect.services.vision.backends import TorchBackend

    ckpt = open_checkpoint(path)
    size = ckpt.config.vision_config.image_size
    pixels = torch.randn(1, 3, size, size)
    out = {}
    for weights in ("fp16", "bf16"):
        try:
            b = TorchBackend(ckpt, weights, CUDA)
            b(pixels)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                b(pixels)
            out[f"torch-cuda-{weights}"] = round((time.perf_counter() - t0) / 10 * 1e3, 2)
            b.close()
        except Exception as exc:
            out[f"torch-cuda-{weights}"] = f"failed: {exc}"
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--contexts", default="0,1000,4000")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--formats", default="bf16,int8,int4")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"bench/gpu.py needs a CUDA device; torch {torch.__version__} sees none")
    record: dict = {"machine": gpu_info(), "copy_bandwidth_gbs": round(copy_bandwidth_gbs(), 1), "decode": {}}
    bw = record["copy_bandwidth_gbs"] * 1e9
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = make_random_preset(Path(tmp) / "1.3b", "deepseek-vl-1.3b", torch.bfloat16)
        record["checkpoint_write_s"] = round(time.perf_counter() - t0, 1)
        ckpt = open_checkpoint(path)
        full = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
        for weights in args.formats.split(","):
            reason = format_refusal(weights, CUDA)
            if reason:
                record["decode"][weights] = {"refused": reason}
                continue
            ex = StageExecutor(load_device_stage(ckpt, full, weights, CUDA), device=CUDA)
            wbytes = module_bytes(ex.module)
            rows = {"weight_bytes": wbytes, "prefill_tok_s_1000": round(time_prefill(ex, 1000), 1)}
            for ctx in map(int, args.contexts.split(",")):
                for batch in map(int, args.batches.split(",")):
                    ms = time_decode(ex, batch, ctx, args.steps)
                    kv = batch * (ctx + 1) * ex.kv_bytes_per_position()
                    bound = (wbytes + kv) / bw * 1e3
                    rows[f"ctx{ctx}_b{batch}"] = {
                        "ms_per_step": round(ms, 3),
                        "read_bound_ms": round(bound, 3),
                        "x_bound": round(ms / bound, 2),
                    }
            record["decode"][weights] = rows
            del ex
            torch.cuda.empty_cache()
        record["transformers_bf16_ms_per_token_ctx0"] = transformers_ms_per_token(path)
        record["vision_ms_per_image"] = vision_ms(path)
    bf16 = record["decode"].get("bf16", {}).get("ctx0_b1")
    hf = record["transformers_bf16_ms_per_token_ctx0"].get("static")
    if bf16 and isinstance(hf, float):
        record["targets"] = {
            "bf16_b1_x_read_bound": bf16["x_bound"],
            "bf16_b1_vs_transformers_static": round(bf16["ms_per_step"] / hf, 2),
            "goal": "<= 1.3x read bound, <= 0.5x transformers",
        }
    print(write_json("gpu", record, args.out))


if __name__ == "__main__":
    main()
