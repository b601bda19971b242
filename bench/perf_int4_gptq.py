"""Whether rounding that minds the layers' inputs (GPTQ) gets int4 to its 1.3B cosine target.

bench/perf_int4_bound.py shows that no 4.5-bit code with a small enough *weight* error exists on the random 1.3B
checkpoint. What the target measures is the *output* error, though, and a code may put its weight error where the
layers' inputs are small: for i.i.d. Gaussian weights the least output error at R bits per weight is the plain
bound times the ratio of the geometric to the arithmetic mean of the inputs' covariance eigenvalues (reverse
water-filling), so an anisotropic input covariance leaves room the plain bound does not. This measures that room
and what GPTQ (Frantar et al. 2022: columns rounded in turn, each one's error pushed onto the columns not yet
rounded through the inverse input covariance) makes of it, on the q4_0 grid (the same 4.5 bits, group 32, absmax /
-8 scale of each group as it stands when its turn comes):
  - calibration: the input Gram matrices (X^T X) of every linear int4 quantizes, from the fp32 model reading the
    sample knowledge base (rag/sample_kb), in 256-token pieces: what a plant would calibrate on, not the prompt
    that is evaluated;
  - the inputs' anisotropy per kind of input (attention, o_proj, MLP): the median over layers of AM/GM of the
    eigenvalues (the most a covariance-weighted code could gain) and the top 10 eigenvalues' share;
  - q4_0 round trip (the int4 format's rounding) and GPTQ at each damping (a fraction of the mean diagonal added to
    the covariance: small trusts the calibration text, large falls back towards plain rounding), each with its
    output error on the calibration inputs (what GPTQ minimises, so it must come out below the round trip's) and
    the minimum teacher-forced logits cosine vs fp32 over the evaluated prompt's decode steps (as perf_int4_bound).

    .venv/bin/python bench/perf_int4_gptq.py --checkpoint /work/ckpt-1.3b [--damp 0.1,1,10] [--out F]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json
from perf_accuracy import BIG, COSINE_TARGET
from perf_int4_bound import decode_min_cosine, fp32_case, round_trip_q4
from torch import nn

from edgeinspect.models.checkpoint import load_processor
from edgeinspect.models.int4 import GROUP, quantize_q4
from edgeinspect.models.stage import StepInput

KB = Path(__file__).resolve().parents[1] / "rag" / "sample_kb"
PIECE = 256  # calibration tokens per forward pass
BLOCK = 128  # GPTQ's lazy-update block (columns)
SHARED_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}  # linears reading the same input
INPUT_KIND = {"q_proj": "attention", "o_proj": "o_proj", "gate_proj": "mlp"}


def gram_owner(name: str) -> str:
    """The linear whose input Gram matrix `name` shares (q/k/v read one input, gate/up another)."""
    head, _, leaf = name.rpartition(".")
    return f"{head}.{SHARED_INPUT.get(leaf, leaf)}"


@torch.inference_mode()
def calibrate(ex, linears: list[tuple[str, nn.Linear]], ids: list[int]) -> dict[str, torch.Tensor]:
    """Input Gram matrices X^T X (fp64) of each distinct linear input over `ids`, read in PIECE-token prompts."""
    grams: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_mod, inp, _out) -> None:
            x = inp[0].reshape(-1, inp[0].shape[-1]).float()
            grams[name] = grams.get(name, 0) + (x.T @ x).double()

        return record

    owners = {gram_owner(n) for n, _ in linears}
    handles = [m.register_forward_hook(hook(n)) for n, m in linears if n in owners]
    try:
        for i in range(0, len(ids), PIECE):
            ex.step([("cal", StepInput(0, input_ids=torch.tensor(ids[i : i + PIECE])))])
            ex.release("cal")
    finally:
        for h in handles:
            h.remove()
    return grams


def anisotropy(grams: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Per kind of input, the median over layers of the eigenvalues' AM/GM and of the top 10's share."""
    rows: dict[str, list[tuple[float, float]]] = {}
    for name, gram in grams.items():
        ev = torch.linalg.eigvalsh(gram).clamp_min(1e-30)
        am_gm = float(ev.mean() / ev.log().mean().exp())
        rows.setdefault(INPUT_KIND[name.rsplit(".", 1)[-1]], []).append((am_gm, float(ev[-10:].sum() / ev.sum())))
    return {
        kind: {
            "am_gm_median": round(statistics.median(r[0] for r in v), 2),
            "top10_share_median": round(statistics.median(r[1] for r in v), 3),
            "layers": len(v),
        }
        for kind, v in rows.items()
    }


def round_q4(w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Columns w [N, c] rounded onto the q4_0 grid of scales d [N, 1] (quantize_q4's rule; a zero scale gives 0)."""
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    return (torch.clamp(torch.round(w * inv) + 8, 0, 15) - 8) * d


def gptq_q4(weight: torch.Tensor, gram: torch.Tensor, damp: float) -> torch.Tensor:
    """weight [N, K] rounded column by column onto the q4_0 grid, each column's error spread over the columns after
    it through the damped inverse Gram matrix (its upper Cholesky factor); returns the dequantized weights."""
    w = weight.double().clone()
    k = w.shape[1]
    h = gram.clone()
    dead = torch.diag(h) == 0  # inputs the calibration never saw: nothing to weigh their error by
    h[dead, dead] = 1
    h += damp * torch.diag(h).mean() * torch.eye(k, dtype=h.dtype)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    out = torch.zeros_like(w)
    for b0 in range(0, k, BLOCK):  # GROUP divides BLOCK: a group's scale is set from its block's updated columns
        b1 = min(b0 + BLOCK, k)
        wb, err = w[:, b0:b1].clone(), torch.zeros(w.shape[0], b1 - b0, dtype=w.dtype)
        ub = u[b0:b1, b0:b1]
        for i in range(b1 - b0):
            if i % GROUP == 0:
                d = quantize_q4(wb[:, i : i + GROUP])[1].double()  # [N, 1], the scale stored in fp16
            col = wb[:, i : i + 1]
            out[:, b0 + i : b0 + i + 1] = q = round_q4(col, d)
            err[:, i : i + 1] = e = (col - q) / ub[i, i]
            wb[:, i:] -= e @ ub[i : i + 1, i:]
        w[:, b1:] -= err @ u[b0:b1, b1:]
    return out.float()


def output_error(pairs, grams) -> float:
    """sum tr(dW G dW^T) / sum tr(W G W^T) over the linears: relative output error on the calibration inputs."""
    num = den = 0.0
    for name, w, wq in pairs:
        g = grams[gram_owner(name)]
        dw = (wq - w).double()
        num += float(((dw @ g) * dw).sum())
        den += float(((w.double() @ g) * w.double()).sum())
    return num / den


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=BIG)
    ap.add_argument("--tokens", type=int, default=6, help="greedy tokens (as perf_accuracy's --big-tokens)")
    ap.add_argument("--calibration-tokens", type=int, default=2048, help="sample knowledge base tokens read")
    ap.add_argument("--damp", default="0.1,1,10", help="GPTQ dampings to try, comma-separated")
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default bench/results/perf_int4_gptq.json)")
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)

    case, ref, ex, linears, originals = fp32_case(args.checkpoint, args.tokens)
    ckpt, ids, _ = case

    text = "\n".join(p.read_text() for p in sorted(KB.glob("*.md")))
    cal_ids = list(load_processor(ckpt).tokenizer(text)["input_ids"])[: args.calibration_tokens]
    t0 = time.perf_counter()
    grams = calibrate(ex, linears, cal_ids)
    print(f"calibration: {len(cal_ids)} tokens of the sample KB, {time.perf_counter() - t0:.0f} s", flush=True)
    inputs = anisotropy(grams)
    for kind, row in inputs.items():
        print(f"  {kind} inputs: AM/GM {row['am_gm_median']}, top-10 share {row['top10_share_median']}", flush=True)

    ref2 = sum(float(w.pow(2).sum()) for w in originals)

    def measure(label: str, rounding) -> dict:
        t = time.perf_counter()
        rounded = [rounding(name, w) for (name, _), w in zip(linears, originals, strict=True)]
        secs = time.perf_counter() - t
        err2 = sum(float((q - w).pow(2).sum()) for q, w in zip(rounded, originals, strict=True))

        def put() -> None:
            for (_, m), q in zip(linears, rounded, strict=True):
                m.weight.copy_(q)

        cos = decode_min_cosine(ex, case, ref, put)
        for (_, m), w in zip(linears, originals, strict=True):
            m.weight.copy_(w)
        pairs = [(name, w, q) for (name, _), w, q in zip(linears, originals, rounded, strict=True)]
        row = {
            "rho": round(math.sqrt(err2 / ref2), 5),
            "calibration_output_error": round(output_error(pairs, grams), 6),
            "min_cosine": round(cos, 5),
            "rounding_s": round(secs, 1),
        }
        print(f"{label}: {row}", flush=True)
        return row

    q4_0 = measure("q4_0 round trip", lambda _name, w: round_trip_q4(w))
    gptq = {
        damp: measure(f"GPTQ damp {damp:g}", lambda name, w, damp=damp: gptq_q4(w, grams[gram_owner(name)], damp))
        for damp in (float(x) for x in args.damp.split(","))
    }
    best = max(gptq.values(), key=lambda r: r["min_cosine"])
    result = {
        "benchmark": "perf_int4_gptq",
        "checkpoint": str(args.checkpoint),
        "prompt_tokens": len(ids),
        "tokens": args.tokens,
        "calibration_tokens": len(cal_ids),
        "cosine_target": COSINE_TARGET,
        "inputs": inputs,
        "q4_0_round_trip": q4_0,
        "gptq": {f"{d:g}": row for d, row in gptq.items()},
        "best_gptq_min_cosine": best["min_cosine"],
        "load_average": load_average(),
        "machine": machine_info(bandwidth=False),
        "targets": {"best_gptq_min_cosine": target(best["min_cosine"], COSINE_TARGET)},
    }
    print(f"-> {write_json('perf_int4_gptq', result, args.out)}")
    print(
        f"q4_0 round trip min cosine {q4_0['min_cosine']}, best GPTQ {best['min_cosine']} (target {COSINE_TARGET})",
        flush=True,
    )


if __name__ == "__main__":
    main()
