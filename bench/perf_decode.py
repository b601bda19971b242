"""Decode per token at batch 1 on the 1.3B-shaped checkpoint: our lean executor vs transformers' generate().

Baseline and subjects run interleaved in one process (round after round), continuing the same synthetic cache
(random keys/values of `--context` positions: decode cost does not depend on the cached values). Our stages load
the fp32 checkpoint as `weights: bf16` and `weights: int8` would on a stage (on a CPU without bf16 instructions
bf16 runs fbgemm's packed fp16 kernel, see models/quant.py); the baseline is transformers' own bf16 model.
Beside each figure: the read-bandwidth bound (weight bytes read per step / measured read bandwidth) and the ratio
to it.

    .venv/bin/python bench/perf_decode.py [--checkpoint PATH] [--tokens 6] [--rounds 3] [--context 256]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json

from edgeinspect.models.checkpoint import Checkpoint, load_reference_model, open_checkpoint
from edgeinspect.models.cpu import fast_bf16
from edgeinspect.models.int4 import Int4Linear
from edgeinspect.models.quant import Half16Linear, Int8Linear, use_half16
from edgeinspect.models.stage import LayerRange, StageExecutor, StageModule, StepInput, load_stage

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
SID = "bench"
LEAN_TARGET = 0.6  # our bf16 ms/token over generate()'s bf16 ms/token
INT8_TARGET = 0.75  # our int8 ms/token over our bf16 ms/token


def synthetic_kv(ckpt: Checkpoint, length: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values), each [1, H_kv, length, hd]."""
    cfg = ckpt.text_config
    g = torch.Generator().manual_seed(0)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    shape = (1, cfg.num_key_value_heads, length, head_dim)
    return [
        (torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype))
        for _ in range(cfg.num_hidden_layers)
    ]


def linear_bytes(linear) -> int:
    """Bytes a decode step reads of one packed linear: its weights as it streams them, and its own parameters."""
    return linear.weight_bytes() + sum(p.numel() * p.element_size() for p in linear.parameters(recurse=False))


def step_bytes(module: StageModule) -> int:
    """Weight bytes one decode step reads: every layer's parameters, the final norm and the lm_head (not embed).
    An Int4Linear counts its int4 weights only: its int8 copy serves prompt chunks, never a decode step."""

    def walk(mod) -> int:
        if isinstance(mod, (Int8Linear, Half16Linear, Int4Linear)):
            return linear_bytes(mod)
        own = sum(p.numel() * p.element_size() for p in mod.parameters(recurse=False))
        return own + sum(walk(child) for child in mod.children())

    return sum(walk(part) for part in (module.layers, module.norm, module.lm_head))


def ours_ms(executor: StageExecutor, kv, first: int, tokens: int) -> float:
    """Median ms per greedy decode step (embedding to argmax) continuing the synthetic cache."""
    pos = executor.install(SID, kv, spare=tokens).length
    token, times = first, []
    try:
        for _ in range(tokens):
            t0 = time.perf_counter()
            logits = executor.step([(SID, StepInput(position=pos, input_ids=torch.tensor([token])))])[0].logits
            token = int(torch.argmax(logits))
            times.append(time.perf_counter() - t0)
            pos += 1
    finally:
        executor.release(SID)
    return statistics.median(times) * 1e3


def generate_ms(model, ckpt: Checkpoint, kv, prompt: torch.Tensor, tokens: int) -> float:
    """Median ms between consecutive tokens of transformers' generate() continuing the same cache."""
    from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    cache = DynamicCache(config=ckpt.text_config)
    for i, (k, v) in enumerate(kv):
        cache.update(k.clone(), v.clone(), i)
    ids = torch.cat([prompt, prompt[-1:]]).unsqueeze(0)  # [1, T+1]: only the uncached last position runs
    model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        cache=cache,
        max_new_tokens=tokens + 1,
        min_new_tokens=tokens + 1,
        do_sample=False,
        logits_processor=LogitsProcessorList([Stamp()]),
    )
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:], strict=False)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--tokens", type=int, default=6, help="decode steps per run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every subject")
    ap.add_argument("--context", type=int, default=256, help="cached positions decode continues from")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    machine = machine_info()
    bw = machine["read_bandwidth_gbs_2_threads"]
    ckpt = open_checkpoint(args.checkpoint)
    print("loading the reference model (bf16) and the int8 stage", flush=True)
    ref = load_reference_model(ckpt, "bf16")
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    subjects = {
        w_: StageExecutor(load_stage(ckpt, whole, w)) for w_, w in (("ours_bf16", "bf16"), ("ours_int8", "int8"))
    }
    gc.collect()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, ckpt.text_config.vocab_size, (args.context,), generator=g)
    kv32 = synthetic_kv(ckpt, args.context, torch.float32)
    kv16 = [(k.bfloat16(), v.bfloat16()) for k, v in kv32]
    first = int(prompt[-1])
    runs: dict[str, list[float]] = {"generate_bf16": [], **{name: [] for name in subjects}}
    for r in range(args.rounds + 1):  # round 0 is warm-up
        results = {"generate_bf16": generate_ms(ref, ckpt, kv16, prompt, args.tokens)}
        for name, ex in subjects.items():
            results[name] = ours_ms(ex, kv16 if ex.dtype == torch.bfloat16 else kv32, first, args.tokens)
        print(f"round {r}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in results.items()), flush=True)
        if r:
            for k, v in results.items():
                runs[k].append(v)
    med = {k: statistics.median(v) for k, v in runs.items()}
    nbytes = {name: step_bytes(ex.module) for name, ex in subjects.items()}
    nbytes["generate_bf16"] = nbytes["ours_bf16"]
    bound = {k: b / (bw * 1e9) * 1e3 for k, b in nbytes.items()}
    rows = {
        k: {
            "ms_per_token": round(med[k], 2),
            "runs_ms": [round(x, 2) for x in runs[k]],
            "weight_bytes_per_step": nbytes[k],
            "read_bound_ms": round(bound[k], 2),
            "x_read_bound": round(med[k] / bound[k], 2),
        }
        for k in runs
    }
    lean = med["ours_bf16"] / med["generate_bf16"]
    int8 = med["ours_int8"] / med["ours_bf16"]
    payload = {
        "benchmark": "perf_decode",
        "machine": machine
        | {
            "loadavg_end": load_average(),
            "fast_bf16": fast_bf16(),
            "bf16_kernel": "fbgemm fp16" if use_half16("bf16") else "torch bf16",
        },
        "checkpoint": str(args.checkpoint),
        "context": args.context,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "results": rows,
        "targets": {
            "lean_bf16_vs_generate_bf16": target(lean, LEAN_TARGET, higher_is_better=False),
            "int8_vs_ours_bf16": target(int8, INT8_TARGET, higher_is_better=False),
            "int8_vs_generate_bf16": {"value": round(med["ours_int8"] / med["generate_bf16"], 4)},
        },
    }
    path = write_json("perf_decode", payload)
    for k, row in rows.items():
        print(
            f"{k:>14}: {row['ms_per_token']:8.1f} ms/token; read bound {row['read_bound_ms']:.1f} ms "
            f"({row['x_read_bound']:.2f}x)"
        )
    print(
        f"lean bf16 / generate bf16 = {lean:.3f} (target <= {LEAN_TARGET}); "
        f"int8 / our bf16 = {int8:.3f} (target <= {INT8_TARGET}) -> {path}"
    )


if __name__ == "__main__":
    main()
