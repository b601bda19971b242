"""Constrained decoding cost: the report-schema constraint against unconstrained decoding in the same run, at the
DeepSeek-VL 1.3B dimensions; grammar compile time per schema; and the library choice (xgrammar vs llguidance).

Decode at 1.3B runs on a slice: the last `--layers` decoder layers + norm + lm_head (the lm_head, 102400 x 2048, is
the sampling stage's own weight and where the logits the constraint masks come from). Two sessions step in
lockstep at the same positions, one sampling plainly and one through the constraint, so load drift hits both. The
constraint's share is also reported against a full 24-layer decode step estimated from the slice's per-layer time.

    .venv/bin/python bench/grammar_bench.py [--layers 2] [--steps 120] [--weights fp32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json

from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.grammar import GrammarCache, grammar_cache_for
from edgeinspect.models.sampling import SamplingParams, sample
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.services.gateway.reports.schema import build_report_grammar
from edgeinspect.testing import sample_spec_chunks

CKPT_13B = Path("var/checkpoints/deepseek-vl-1.3b")
PARTS = ["CVR-310", "PCB-410", "HSG-210", "ASM-100", "XYZ-999"]
PREFILL = 64


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def decode_overhead(ckpt, layers: int, steps: int, weights: str, grammar_text: str) -> dict:
    """Lockstep plain vs constrained decode on the last `layers` layers + lm_head."""
    total = ckpt.num_layers
    module = load_stage(ckpt, LayerRange(total - layers, total, total), weights)
    executor = StageExecutor(module)
    hidden = ckpt.text_config.hidden_size
    eos = ckpt.text_config.eos_token_id
    cache = grammar_cache_for(ckpt)
    greedy = SamplingParams()
    gen = torch.Generator().manual_seed(0)
    prefill = torch.randn(PREFILL, hidden, generator=gen)  # [P, D]
    for sid in ("plain", "constrained"):
        executor.step([(sid, StepInput(position=0, hidden=prefill))])
    constraint = cache.constraint(grammar_text)
    plain_ms, constrained_ms, mask_ms, objects = [], [], [], 0
    for k in range(steps):
        x = torch.randn(1, hidden, generator=gen)  # [1, D]: the previous stage's output for the new token
        pos = PREFILL + k
        t0 = time.perf_counter()
        logits = executor.step([("plain", StepInput(position=pos, hidden=x))])[0].logits  # [vocab]
        sample(logits, greedy)
        t1 = time.perf_counter()
        logits = executor.step([("constrained", StepInput(position=pos, hidden=x))])[0].logits
        t2 = time.perf_counter()
        token = sample(constraint.mask(logits), greedy)
        constraint.advance(token)
        t3 = time.perf_counter()
        if token == eos:  # the object is complete: start the next one so every step pays for a live grammar
            constraint = cache.constraint(grammar_text)
            objects += 1
        if k >= 3:  # warm-up steps excluded
            plain_ms.append((t1 - t0) * 1e3)
            constrained_ms.append((t3 - t1) * 1e3)
            mask_ms.append((t3 - t2) * 1e3)
    # The full-depth step is estimated from the slice: (slice step - norm/lm_head) / layers per decoder layer.
    with torch.inference_mode():
        h = torch.randn(1, 1, hidden).to(executor.dtype)
        t0 = time.perf_counter()
        for _ in range(10):
            module.lm_head(module.norm(h))
        head_ms = (time.perf_counter() - t0) / 10 * 1e3
    plain_med = statistics.median(plain_ms)
    per_layer_ms = max(plain_med - head_ms, 0.0) / layers
    full_step_ms = head_ms + per_layer_ms * total
    mask_med = statistics.median(mask_ms)
    return {
        "layers": layers,
        "weights": weights,
        "steps": len(plain_ms),
        "objects_completed": objects,
        "plain_step_ms_median": round(plain_med, 3),
        "constrained_step_ms_median": round(statistics.median(constrained_ms), 3),
        "constraint_ms_median": round(mask_med, 3),
        "constraint_ms_p95": round(pct(mask_ms, 0.95), 3),
        "lm_head_ms": round(head_ms, 3),
        "per_layer_ms_estimate": round(per_layer_ms, 3),
        "full_24_layer_step_ms_estimate": round(full_step_ms, 3),
        # The target is checked against the slice step, which is cheaper than any full-depth step: a bound.
        "overhead_vs_slice_pct": target(100 * mask_med / plain_med, 5.0, higher_is_better=False),
        "overhead_vs_full_step_estimate_pct": round(100 * mask_med / full_step_ms, 3),
        "overhead_from_step_medians_pct": round(100 * (statistics.median(constrained_ms) - plain_med) / plain_med, 2),
    }


def compile_times(ckpt, chunks, budget: int) -> list[dict]:
    """Fresh compile per part's schema (cache miss), then a cache hit, on the checkpoint's tokenizer."""
    cache = grammar_cache_for(ckpt)
    rows = []
    for part in PARTS:
        grammar = build_report_grammar(chunks, part, budget)
        t0 = time.perf_counter()
        entry = cache.compile(grammar.text)
        miss_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        cache.compile(grammar.text)
        hit_ms = (time.perf_counter() - t0) * 1e3
        rows.append(
            {
                "part": part,
                "classes": len(grammar.vocabulary.classes),
                "schema_chars": len(grammar.text),
                "compile_ms": round(entry.compile_ms, 2),
                "first_call_ms": round(miss_ms, 2),
                "cache_hit_ms": round(hit_ms, 3),
            }
        )
    return rows


def _walks(fill, accept, new, vocab, eos, tokenizer, schema, runs: int) -> dict:
    import jsonschema

    valid, times = 0, []
    for seed in range(runs):
        state = new()
        gen = torch.Generator().manual_seed(seed)
        tokens = []
        for _ in range(2000):
            logits = torch.randn(vocab, generator=gen) * 4  # [vocab]
            t0 = time.perf_counter()
            fill(state, logits)
            times.append((time.perf_counter() - t0) * 1e3)
            token = int(torch.argmax(logits))
            if token == eos:
                break
            accept(state, token)
            tokens.append(token)
        try:
            jsonschema.validate(json.loads(tokenizer.decode(tokens)), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return {"valid": f"{valid}/{runs}", "mask_ms_median": round(statistics.median(times), 4)}


def library_comparison(ckpt, schemas: dict[str, dict], runs: int) -> dict:
    """xgrammar (as used) vs llguidance (if importable): validity of random-logit walks and mask cost."""
    import xgrammar as xgr

    tokenizer = load_processor(ckpt).tokenizer
    vocab, eos = ckpt.text_config.vocab_size, ckpt.text_config.eos_token_id
    out: dict = {}
    for name, schema in schemas.items():
        row = {}
        cache = GrammarCache(tokenizer, vocab, eos, "bench")
        compiled = cache.compile(schema)
        bitmask = xgr.allocate_token_bitmask(1, vocab)

        def xfill(m, logits, bitmask=bitmask):
            m.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits.view(1, -1), bitmask)

        row["xgrammar"] = {
            "compile_ms": round(compiled.compile_ms, 2),
            **_walks(
                xfill,
                lambda m, t: m.accept_token(t),
                lambda c=compiled: xgr.GrammarMatcher(c.compiled),
                vocab,
                eos,
                tokenizer,
                schema,
                runs,
            ),
        }
        try:
            import llguidance
            import llguidance.hf
            import llguidance.torch as llt
        except ImportError:
            row["llguidance"] = "not installed (pip install llguidance to compare)"
        else:
            t0 = time.perf_counter()
            lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
            )
            llguidance.LLMatcher(lltok, grammar)
            compile_ms = (time.perf_counter() - t0) * 1e3
            mask = llt.allocate_token_bitmask(1, vocab)

            def lfill(m, logits, mask=mask):
                llt.fill_next_token_bitmask(m, mask)
                llt.apply_token_bitmask_inplace(logits, mask)

            row["llguidance"] = {
                "tokenizer_and_compile_ms": round(compile_ms, 2),
                "version": llguidance.get_version() if hasattr(llguidance, "get_version") else "",
                **_walks(
                    lfill,
                    lambda m, t: m.consume_token(t),
                    lambda lltok=lltok, grammar=grammar: llguidance.LLMatcher(lltok, grammar),
                    vocab,
                    eos,
                    tokenizer,
                    schema,
                    runs,
                ),
            }
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=CKPT_13B, help="the 1.3B-shaped checkpoint")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers in the sampling-stage slice")
    ap.add_argument("--steps", type=int, default=120, help="lockstep decode steps")
    ap.add_argument("--weights", default="fp32", help="stage weights: fp32 | bf16 (| int8 where supported)")
    ap.add_argument("--budget", type=int, default=256, help="token budget the report schema is sized for")
    ap.add_argument("--walks", type=int, default=10, help="random-logit walks per library and schema")
    ap.add_argument("--tiny", type=Path, default=None, help="also compare libraries on this tiny checkpoint")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt = open_checkpoint(args.checkpoint)
    chunks = sample_spec_chunks()
    grammar = build_report_grammar(chunks, "CVR-310", args.budget)
    result = {"machine": machine_info(), "budget_tokens": args.budget, "schema_max_tokens": grammar.max_tokens}
    print("decode, constraint vs plain ...", file=sys.stderr, flush=True)
    result["decode"] = decode_overhead(ckpt, args.layers, args.steps, args.weights, grammar.text)
    print("compile per schema ...", file=sys.stderr, flush=True)
    result["compile_1_3b_tokenizer"] = compile_times(ckpt, chunks, args.budget)
    print("libraries ...", file=sys.stderr, flush=True)
    plain_string = {
        "type": "object",
        "properties": {"description": {"type": "string", "maxLength": 40}},
        "required": ["description"],
        "additionalProperties": False,
    }
    schemas = {"report_schema": grammar.schema, "plain_string_maxLength_40": plain_string}
    result["libraries"] = {"deepseek-vl-1.3b tokenizer": library_comparison(ckpt, schemas, args.walks)}
    if args.tiny is not None:
        result["libraries"]["tiny tokenizer"] = library_comparison(open_checkpoint(args.tiny), schemas, args.walks)
    result["machine"]["loadavg_end"] = load_average()
    path = write_json("grammar", result, args.out)
    print(json.dumps(result["decode"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
