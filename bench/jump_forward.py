"""Grammar jump-forward: decode steps per structured report with and without it, same model, same run.

For each sample part, the report grammar the gateway builds (services/gateway/reports/schema.py, sample KB
vocabulary) drives a greedy constrained generation on a whole-model StageExecutor twice: step by step (one decode
step per token), and with jump-forward (after each sampled token, the tokens the grammar forces, i.e. where its
bitmask allows exactly one token, are appended in the same multi-token step; models/grammar.py
LogitsConstraint.forced_tokens). The tokens must be identical; the figure is the share of decode steps saved.

`--gateway` measures the same through the real stack instead (vision, 2 stages, retrieval over the sample KB,
gateway: separate processes, fp32): each sample part's report on each image, first with the gateway started with
`jump_forward_tokens: 0`, then with the gateway restarted with its default (each phase warmed by one round); the
reports say their decode steps (DefectReport.decode_steps, jump_forward_tokens). Seconds are per report, the two
phases minutes apart, not interleaved: only the steps are a same-run figure.

    .venv/bin/python bench/jump_forward.py --checkpoint PATH [--parts CVR-310,PCB-410] [--budget 160] [--gateway]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json

from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.grammar import grammar_cache_for
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.services.gateway.reports.schema import build_report_grammar
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
    ap.add_argument("--gateway", action="store_true", help="through the real gateway and stage processes")
    ap.add_argument("--images", default="part_scratch.jpg,part_ok.jpg", help="sample images (gateway mode)")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    if args.gateway:
        gateway_mode(args)
        return
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


def gateway_reports(stack, requests: list[tuple[str, str]], budget: int) -> dict[tuple[str, str], dict]:
    """One report per (part, image) through the stack's gateway: tokens, decode steps, forced tokens, seconds."""
    from edgeinspect.assets import asset_path
    from edgeinspect.services.client import InspectionClient

    out = {}
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        for part, image in requests:
            t0 = time.perf_counter()
            report = client.inspect(asset_path(image).read_bytes(), part=part, max_new_tokens=budget)
            out[part, image] = {
                "tokens": list(report.generated_token_ids),
                "decode_steps": report.decode_steps,
                "jump_forward_tokens": report.jump_forward_tokens,
                "seconds": time.perf_counter() - t0,
                "specs": len(report.references),
            }
    return out


def gateway_mode(args) -> None:
    """Step by step, then with jump-forward, through the real processes (one gateway restart between)."""
    import tempfile

    from edgeinspect.rag import sample_kb_dir
    from edgeinspect.rag.embed import Embedder
    from edgeinspect.rag.indexer import build_index
    from edgeinspect.stack.launcher import LocalStack, StackOptions

    machine = machine_info(bandwidth=False)
    eos = open_checkpoint(args.checkpoint).text_config.eos_token_id
    parts = [p for p in args.parts.split(",") if p]
    requests = [(part, image) for part in parts for image in args.images.split(",") if image]
    jump_off = "EDGEINSPECT_JUMP_FORWARD_TOKENS"
    with tempfile.TemporaryDirectory(prefix="jump-forward-") as tmp:
        kb = Path(tmp) / "kb"
        build_index(sample_kb_dir(), kb, Embedder())
        opts = StackOptions(
            workdir=Path(tmp) / "stack", checkpoint=args.checkpoint, stages=2, codec="fp32", kb_dir=kb,
            weights=args.weights, extra_env={jump_off: "0"},
        )  # fmt: skip
        with LocalStack(opts) as stack:
            # Each phase runs its requests twice and keeps the second: the first pays the grammar compilation and
            # the prompt prefix (the restarted gateway's prefix book is empty), so the seconds compare warm runs.
            gateway_reports(stack, requests, args.budget)
            plain = gateway_reports(stack, requests, args.budget)
            del stack.opts.extra_env[jump_off]  # the restarted gateway has the default
            stack.restart("gateway")
            gateway_reports(stack, requests, args.budget)
            jumped = gateway_reports(stack, requests, args.budget)
    rows = {}
    for key in requests:
        a, b = plain[key], jumped[key]
        saved = 1 - b["decode_steps"] / max(a["decode_steps"], 1)
        rows[" / ".join(key)] = {
            "tokens": len(a["tokens"]),
            "complete": a["tokens"][-1] == eos,
            "spec_chunks": a["specs"],
            "identical_tokens": a["tokens"] == b["tokens"],
            "decode_steps": a["decode_steps"],
            "decode_steps_jump_forward": b["decode_steps"],
            "forced_tokens": b["jump_forward_tokens"],
            "steps_saved": round(saved, 4),
            "seconds": round(a["seconds"], 2),
            "seconds_jump_forward": round(b["seconds"], 2),
        }
        print(f"{' / '.join(key)}: {rows[' / '.join(key)]}", flush=True)
    mean_saved = statistics.mean(r["steps_saved"] for r in rows.values())
    payload = {
        "benchmark": "jump_forward_gateway",
        "machine": machine | {"loadavg_end": load_average()},
        "checkpoint": str(args.checkpoint),
        "weights": args.weights,
        "budget": args.budget,
        "stack": "vision + 2 stages + retrieval (sample KB) + gateway, separate processes, fp32 wire",
        "reports": rows,
        "targets": {
            "decode_steps_saved_per_report": target(mean_saved, SAVED_TARGET),
            "identical_tokens": {"value": all(r["identical_tokens"] for r in rows.values())},
        },
    }
    path = write_json("jump_forward_gateway", payload)
    print(f"mean steps saved {mean_saved:.3f} via the gateway (target >= {SAVED_TARGET}) -> {path}")


if __name__ == "__main__":
    main()
