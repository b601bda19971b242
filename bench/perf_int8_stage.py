"""The int8 kernels on a whole stage: one 1.3B int8 stage per kernel ("vnni", "fbgemm"), the report's prompt.

What `default_kernel()` (models/quant.py) must get right: the kernel it picks should give the faster report on this
CPU. The kernel microbenchmark (perf_int8_kernel.py) times the linears alone; here each kernel runs the whole stage
as a report does (prefill of the gateway's ~974-token inspection prompt with visual tokens, then decode steps at
that depth), the kernels interleaved round by round so the box's moving memory speed falls on both alike. Each side
also reports its first-token logits cosine against an fp32 stage of the same checkpoint (the accuracy each costs).

    .venv/bin/python bench/perf_int8_stage.py [--checkpoint PATH] [--rounds 3] [--steps 24] [--tokens 80] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import inspection_prompt, load_average, machine_info, require_checkpoint, skip, target, write_json

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.quant import default_kernel, fbgemm_available, kernels_simd, vnni_available
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"


def report_round(ex: StageExecutor, sid: str, ids: torch.Tensor, visual: torch.Tensor, steps: int) -> dict:
    """One prefill and `steps` decode steps after it: seconds, the decode steps' median and the first logits."""
    t0 = time.perf_counter()
    first = ex.step([(sid, StepInput(0, input_ids=ids, visual_tokens=visual))])[0].logits
    prefill_s = time.perf_counter() - t0
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        ex.step([(sid, StepInput(len(ids) + i, input_ids=torch.tensor([7 + i])))])
        times.append(time.perf_counter() - t0)
    ex.release(sid)
    return {"prefill_s": prefill_s, "decode_s": statistics.median(times), "first": first.float()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="DeepSeek-VL checkpoint folder")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per kernel (after one untimed)")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per round")
    ap.add_argument("--tokens", type=int, default=80, help="generated tokens the report estimate counts")
    ap.add_argument("--context-tokens", type=int, default=300, help="spec-context tokens in the prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default bench/results/perf_int8_stage.json)")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    kernels = [k for k, ok in (("vnni", vnni_available()), ("fbgemm", fbgemm_available())) if ok]
    if len(kernels) < 2:
        skip(f"needs both the vnni and fbgemm int8 kernels here (have: {', '.join(kernels) or 'neither'})")
    torch.set_num_threads(args.threads)
    machine = machine_info()
    ckpt = open_checkpoint(args.checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    ids, visual = inspection_prompt(ckpt, args.context_tokens)
    ids = torch.tensor(ids)
    with torch.inference_mode():
        reference = StageExecutor(load_stage(ckpt, whole, "fp32"))
        ref = reference.step([("ref", StepInput(0, input_ids=ids, visual_tokens=visual))])[0].logits.float()
        del reference
        executors, load_s = {}, {}
        for kernel in kernels:
            t0 = time.perf_counter()
            executors[kernel] = StageExecutor(load_stage(ckpt, whole, "int8", int8_kernel=kernel))
            load_s[kernel] = round(time.perf_counter() - t0, 1)
            print(f"{kernel}: loaded in {load_s[kernel]} s", flush=True)
        rows: dict[str, list[dict]] = {k: [] for k in kernels}
        for r in range(args.rounds + 1):  # round 0 warms up
            for kernel in kernels if r % 2 else kernels[::-1]:
                out = report_round(executors[kernel], f"r{r}", ids, visual, args.steps)
                print(f"round {r} {kernel}: prefill {out['prefill_s']:.2f} s, decode {out['decode_s'] * 1e3:.1f} ms")
                if r:
                    rows[kernel].append(out)
    per_kernel = {}
    for kernel, outs in rows.items():
        prefill = statistics.median(o["prefill_s"] for o in outs)
        decode = statistics.median(o["decode_s"] for o in outs)
        cosine = torch.nn.functional.cosine_similarity(outs[-1]["first"], ref, dim=0).item()
        per_kernel[kernel] = {
            "prefill_s": round(prefill, 3),
            "prefill_tok_s": round(len(ids) / prefill, 1),
            "decode_ms": round(decode * 1e3, 2),
            "report_text_s": round(prefill + args.tokens * decode, 3),
            "load_s": load_s[kernel],
            "first_logits_cosine_vs_fp32": round(cosine, 5),
        }
    chosen = default_kernel()
    other = next(k for k in kernels if k != chosen)
    # per round (the kernels ran back to back), the chosen kernel's report estimate over the other's
    ratios = [
        (a["prefill_s"] + args.tokens * a["decode_s"]) / (b["prefill_s"] + args.tokens * b["decode_s"])
        for a, b in zip(rows[chosen], rows[other], strict=True)
    ]
    payload = {
        "benchmark": "perf_int8_stage",
        "machine": machine | {"loadavg_end": load_average(), "vnni_kernel_simd": kernels_simd()},
        "checkpoint": str(args.checkpoint),
        "prompt_tokens": len(ids),
        "rounds": args.rounds,
        "decode_steps": args.steps,
        "tokens": args.tokens,
        "kernels": per_kernel,
        "default_kernel": chosen,
        "default_vs_other_per_round": [round(x, 3) for x in ratios],
        "targets": {  # the default kernel's prefill + tokens x decode against the other kernel's, per round
            "default_kernel_report_vs_other": target(statistics.median(ratios), 1.0, higher_is_better=False),
        },
    }
    for kernel, row in per_kernel.items():
        print(f"{kernel}: {row}")
    print(f"default {chosen} vs {other}: {statistics.median(ratios):.3f}x the report's text time (per round {ratios})")
    print(f"-> {write_json('perf_int8_stage', payload, args.out)}")


if __name__ == "__main__":
    main()
