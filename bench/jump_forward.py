"""Grammar jump-forward: decode steps per structured report with and without it, same model, same run.

For each sample part, the report grammar the gateway builds (services/gateway/schema.py, sample KB vocabulary) drives
a greedy constrained generation on a whole-model StageExecutor twice: step by step (one decode step per token), and
with jump-forward (after each sampled token, the tokens the grammar forces, i.e. where its bitmask allows exactly
one token, are appended in the same multi-token step; models/grammar.py LogitsConstraint.forced_tokens). The
tokens must be identical; the figure is the share of decode steps saved.

    .venv/bin/python bench/jump_forward.py [--checkpoint PATH] [--parts CVR-310,PCB-410] [--budget 160]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, skip, target, write_json

from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.grammar import grammar_cache_for
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.services.gateway.schema import build_report_grammar
from edgeinspect.testing import sample_spec_chunks

SAVED_TARGET = 0.25


def run(executor, cache, grammar_text: str, prompt: list[int], budget: int, jump: bool) -> dict:
    constraint = cache.constraint(grammar_text)
    t0 = time.perf_counter()
    out = executor.step([("jf", StepInput(0, input_ids=torch.tensor(prompt)))])[0]
    tokens, steps, pos = [], 0, len(prompt)
    try:
        while len(tokens) < budget:
            token = int(torch.argmax(constraint.mask(out.logits)))
            constraint.advance(token)
            new = [token, *(constraint.forced_tokens(64) if jump else [])]
            tokens += new
            if tokens[-1] == cache.eos_id or len(tokens) >= budget:
                break
            out = executor.step([("jf", StepInput(pos, input_ids=torch.tensor(new)))])[0]
            pos += len(new)
            steps += 1
    finally:
        executor.release("jf")
    return {"tokens": tokens, "decode_steps": steps, "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="DeepSeek-VL checkpoint (make-tiny output)")
    ap.add_argument("--parts", default="CVR-310,PCB-410")
    ap.add_argument("--budget", type=int, default=160, help="token budget of a report")
    ap.add_argument("--weights", default="fp32")
    args = ap.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        skip(f"no checkpoint at {args.checkpoint}")
    machine = machine_info(bandwidth=False)
    ckpt = open_checkpoint(args.checkpoint)
    cache = grammar_cache_for(ckpt)
    executor = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), args.weights))
    processor = load_processor(ckpt)
    prompt = prompt_ids(processor, prompt_text(processor, build_messages(context="")))
    image_id = ckpt.config.image_token_id
    prompt = [t for t in prompt if t != image_id]  # text only: the grammar, not the image, decides what is forced
    rows = {}
    for part in [p for p in args.parts.split(",") if p]:
        grammar = build_report_grammar(sample_spec_chunks(), part, args.budget)
        plain = run(executor, cache, grammar.text, prompt, args.budget, jump=False)
        jumped = run(executor, cache, grammar.text, prompt, args.budget, jump=True)
        saved = 1 - jumped["decode_steps"] / max(plain["decode_steps"], 1)
        rows[part] = {
            "tokens": len(plain["tokens"]),
            "complete": plain["tokens"][-1] == cache.eos_id,
            "identical_tokens": plain["tokens"] == jumped["tokens"],
            "decode_steps": plain["decode_steps"],
            "decode_steps_jump_forward": jumped["decode_steps"],
            "steps_saved": round(saved, 4),
            "seconds": round(plain["seconds"], 2),
            "seconds_jump_forward": round(jumped["seconds"], 2),
        }
        print(f"{part}: {rows[part]}", flush=True)
    mean_saved = statistics.mean(r["steps_saved"] for r in rows.values())
    payload = {
        "benchmark": "jump_forward",
        "machine": machine | {"loadavg_end": load_average()},
        "checkpoint": str(args.checkpoint),
        "weights": args.weights,
        "budget": args.budget,
        "parts": rows,
        "targets": {
            "decode_steps_saved_per_report": target(mean_saved, SAVED_TARGET),
            "identical_tokens": {"value": all(r["identical_tokens"] for r in rows.values())},
        },
    }
    print(f"mean steps saved {mean_saved:.3f} (target >= {SAVED_TARGET}) -> {write_json('jump_forward', payload)}")


if __name__ == "__main__":
    main()
