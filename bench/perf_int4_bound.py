"""How small a weight error int4 would need on the 1.3B-shaped checkpoint, against what 4.5 bits can carry.

The int4 format (models/int4.py) misses its logits-cosine target (>= 0.99 vs fp32) on the random 1.3B checkpoint.
This asks whether any 4-bit format with q4_0's bytes could meet it there, by causing the error instead of
reasoning about it. On the fp32 model, the prompt runs with the exact weights (an int4 stage runs prompts through
its int8 copy), then for the decode steps the linears int4 quantizes (all but down_proj and the lm_head) get:
  - their q4_0 round trip (weights only, activations exact): what the int4 grid itself costs;
  - i.i.d. Gaussian noise at a relative RMS error rho (||dW|| / ||W||, per matrix), for a sweep of rho,
    bisected on log scale to the rho at which the minimum teacher-forced logits cosine reaches the target.
The checkpoint's weights are i.i.d. N(0, 0.02^2), and for an i.i.d. Gaussian source the rate-distortion bound
says no code of R bits per weight (scalar, vector, any grid, any scales) has a relative RMS error below 2^-R:
for q4_0's 4.5 bits that is 0.0442. If the rho the target needs is below it, no 4.5-bit format can meet the
target on this checkpoint; the bits it would need are log2(1 / rho).
Same prompt as bench/perf_accuracy.py's 1.3B case (text prompt, fp32's greedy tokens fed back); the cosine is
the minimum over the decode steps.

    .venv/bin/python bench/perf_int4_bound.py --checkpoint /work/ckpt-1.3b [--tokens 6] [--bisect 5] [--out F]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json
from perf_accuracy import BIG, COSINE_TARGET, text_case
from torch import nn

from edgeinspect.models.accuracy import reference, whole_model
from edgeinspect.models.int4 import INT8_LINEARS, dequantize_q4, pack_q4, quantize_q4
from edgeinspect.models.stage import StepInput

BITS_Q4_0 = 4 + 16 / 32  # 4-bit values + one fp16 scale per 32


def quantized_to_int4(layers: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The decoder layers' linears an int4 stage quantizes to int4 (models/int4.py: all but INT8_LINEARS; the
    lm_head, outside the layers, stays int8 too)."""
    return [
        (name, m)
        for name, m in layers.named_modules()
        if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] not in INT8_LINEARS
    ]


def decode_min_cosine(ex, case, ref, swap) -> float:
    """Min logits cosine vs fp32 over the decode steps, teacher-forced: the prompt runs with the exact weights (as
    an int4 stage runs prompts through its int8 copy), then swap() puts the perturbed weights in for decode."""
    ckpt, ids, visual = case
    ref_tokens, ref_logits = ref
    sid, pos = "bound", len(ids)
    ex.step([(sid, StepInput(0, input_ids=torch.tensor(ids), visual_tokens=visual))])
    swap()
    cos = []
    try:
        for tok, want in zip(ref_tokens[:-1], ref_logits[1:], strict=True):
            got = ex.step([(sid, StepInput(pos, input_ids=torch.tensor([tok])))])[0].logits
            cos.append(float(nn.functional.cosine_similarity(want, got, dim=0)))
            pos += 1
    finally:
        ex.release(sid)
    return min(cos)


def round_trip_q4(w: torch.Tensor) -> torch.Tensor:
    """w through the int4 format and back: q4_0's rounding, what an int4 stage's decode multiplies by."""
    q, d = quantize_q4(w)
    return dequantize_q4(pack_q4(q), d)


def fp32_case(checkpoint: Path, tokens: int):
    """The evaluated prompt (perf_accuracy's text case), fp32's greedy tokens and logits on it, a whole fp32 model,
    the linears int4 quantizes in it and copies of their weights (to put back after each perturbation)."""
    case = text_case(checkpoint)
    ckpt, ids, visual = case
    print(f"fp32 reference: {len(ids)} prompt tokens, {tokens} new", flush=True)
    ref = reference(ckpt, ids, visual, tokens)
    ex = whole_model(ckpt, "fp32")
    linears = quantized_to_int4(ex.module.layers)
    return case, ref, ex, linears, [m.weight.detach().clone() for _, m in linears]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=BIG)
    ap.add_argument("--tokens", type=int, default=6, help="greedy tokens (as perf_accuracy's --big-tokens)")
    ap.add_argument("--bisect", type=int, default=5, help="bisection steps on log(rho)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default bench/results/perf_int4_bound.json)")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)

    case, ref, ex, linears, originals = fp32_case(args.checkpoint, args.tokens)
    ckpt, ids, visual = case
    n_weights = sum(w.numel() for w in originals)
    print(f"{len(linears)} linears, {n_weights / 1e9:.2f} G weights perturbed", flush=True)

    def restore() -> None:
        for (_, m), w in zip(linears, originals, strict=True):
            m.weight.copy_(w)

    # q4_0 round trip of the weights: the grid's own error and what it costs.
    err2 = ref2 = 0.0
    rounded = []
    for w in originals:
        rounded.append(round_trip_q4(w))
        err2 += float((rounded[-1] - w).pow(2).sum())
        ref2 += float(w.pow(2).sum())
    rho_q4 = math.sqrt(err2 / ref2)

    def put_rounded() -> None:
        for (_, m), wq in zip(linears, rounded, strict=True):
            m.weight.copy_(wq)

    cos_q4 = decode_min_cosine(ex, case, ref, put_rounded)
    restore()
    rounded.clear()  # frees the copies before the sweep
    print(f"q4_0 round trip: rho {rho_q4:.4f}, min cosine {cos_q4:.5f}", flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    sweep: list[dict] = []

    def noisy(rho: float) -> float:
        def put_noise() -> None:
            for (_, m), w in zip(linears, originals, strict=True):
                noise = torch.randn(w.shape, generator=gen)
                m.weight.copy_(w + noise * (rho * float(w.norm()) / float(noise.norm())))

        cos = decode_min_cosine(ex, case, ref, put_noise)
        restore()
        sweep.append({"rho": round(rho, 5), "min_cosine": round(cos, 5)})
        print(f"noise rho {rho:.4f}: min cosine {cos:.5f}", flush=True)
        return cos

    cos_same = noisy(rho_q4)  # the noise model against the grid at the same error
    lo, hi = rho_q4 / 64, rho_q4  # cosine at lo should meet the target, at hi not
    if noisy(lo) < COSINE_TARGET:
        raise SystemExit("even rho / 64 misses the target: widen the sweep")
    for _ in range(args.bisect):
        mid = math.sqrt(lo * hi)
        if noisy(mid) >= COSINE_TARGET:
            lo = mid
        else:
            hi = mid
    rho_needed = lo
    bound = 2.0**-BITS_Q4_0
    result = {
        "benchmark": "perf_int4_bound",
        "checkpoint": str(args.checkpoint),
        "prompt_tokens": len(ids),
        "tokens": args.tokens,
        "weights_perturbed": n_weights,
        "cosine_target": COSINE_TARGET,
        "q4_0_round_trip": {"rho": round(rho_q4, 5), "min_cosine": round(cos_q4, 5)},
        "gaussian_noise_at_q4_0_rho": {"min_cosine": round(cos_same, 5)},
        "rho_meeting_target": round(rho_needed, 5),
        "rho_missing_target": round(hi, 5),
        "rate_distortion_rho_at_4.5_bits": round(bound, 5),
        # the threshold lies between the two rhos: at least log2(1 / rho_missing) bits, at most log2(1 / rho_meeting)
        "bits_per_weight_needed": [round(math.log2(1 / hi), 2), round(math.log2(1 / rho_needed), 2)],
        # the best any 4.5-bit code can do (the bound) has more error than a rho that already misses the target
        "reachable_at_4.5_bits": bound < hi,
        "sweep": sorted(sweep, key=lambda s: s["rho"]),
        "load_average": load_average(),
        "machine": machine_info(bandwidth=False),
        "targets": {"q4_0_round_trip.min_cosine": target(cos_q4, COSINE_TARGET)},
    }
    print(f"-> {write_json('perf_int4_bound', result, args.out)}")
    print(
        f"the target is met at rho {rho_needed:.4f} and missed at {hi:.4f} (so it needs"
        f" {result['bits_per_weight_needed'][0]}-{result['bits_per_weight_needed'][1]} bits per weight by the Gaussian"
        f" rate-distortion bound); q4_0 has {rho_q4:.4f}; the bound at 4.5 bits is {bound:.4f}: "
        + ("reachable" if result["reachable_at_4.5_bits"] else "no 4.5-bit format can meet it here"),
        flush=True,
    )


if __name__ == "__main__":
    main()
