"""The VLM sees what the gate saw (issue 65): what a flagged part's explanation costs when its prompt shows the flagged
region (cut from the full-resolution frame) and a good frame beside the frame, against the frame alone, same run.

Both prompts are the gateway's: chat template, ~300 tokens of sample-KB spec context, the gate's sentence (where it
flagged the frame), the instruction; the evidence prompt has three images, each with its own 576 placeholders (SigLIP
at 384 px) and caption (services/gateway/evidence.py), the baseline one. Random weights at DeepSeek-VL 1.3B's
dimensions and random visual tokens: prefill cost depends on the shapes, not the values; what the evidence does for
accuracy needs the real weights and labelled photographs, and is not measured here.

- prefill: the whole prompt to its first token's logits on one StageExecutor holding every layer (the code a stage
  runs), the two prompts interleaved, median of --rounds;
- encode: the vision tower on the two extra images (the gateway asks the vision node for them beside the frame's).

    .venv/bin/python bench/explain_evidence.py [--checkpoint var/checkpoints/deepseek-vl-1.3b] [--weights bf16]
        [--layers 0] [--rounds 2] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from common import load_average, machine_info, spec_context, write_json

from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_ids, prompt_text
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.models.tiny import make_random_preset
from edgeinspect.models.vision import load_vision_tower
from edgeinspect.services.gateway import evidence, gate
from edgeinspect.v1 import inspection_pb2, vision_pb2

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
ROLES = ("frame", "crop", "reference")
# A flagged frame as the gate reports one: the sentence the explanation's prompt gains either way.
REGION = vision_pb2.AnomalyRegion(x=0.4, y=0.5, width=0.1, height=0.05)
SCORE = vision_pb2.AnomalyScore(score=31.0, threshold=20.0, regions=[REGION])


def prompts(ckpt, context_tokens: int) -> dict[str, list[int]]:
    """The explanation's prompt ids with the frame alone and with the evidence (three images)."""
    processor = load_processor(ckpt)
    context = spec_context(processor.tokenizer, context_tokens)
    instruction = f"{DEFAULT_INSTRUCTION}\n{gate.gate_instruction(SCORE)}"
    captions = evidence.Evidence([], [inspection_pb2.PromptImage(role=r) for r in ROLES]).captions
    shown = {"frame": (), "evidence": captions}
    return {k: prompt_ids(processor, prompt_text(processor, build_messages(instruction, context, captions=c)))
            for k, c in shown.items()}  # fmt: skip


@torch.inference_mode()
def prefill_ms(ex: StageExecutor, sid: str, ids: list[int], visual: torch.Tensor) -> tuple[float, float]:
    """(wall ms, this process's CPU ms): on a box other work shares, CPU time is the steadier of the two."""
    t0, c0 = time.perf_counter(), time.process_time()
    (out,) = ex.step([(sid, StepInput(0, input_ids=torch.tensor(ids), visual_tokens=visual))])
    elapsed, cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    ex.release(sid)
    if out.logits is None:
        raise RuntimeError("the prefill computed no logits")
    return elapsed, cpu


@torch.inference_mode()
def encode_ms(ckpt, weights: str, rounds: int) -> float:
    """The vision tower on one 384 px image, median of rounds (after one warm-up)."""
    tower = load_vision_tower(ckpt, weights)
    size = ckpt.vision_config.image_size
    pixels = torch.randn(1, 3, size, size, dtype=next(tower.parameters()).dtype)
    tower(pixels)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        tower(pixels)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(ckpt, weights: str, layers: int, rounds: int, context_tokens: int) -> dict:
    ids = prompts(ckpt, context_tokens)
    slot, dv = ckpt.config.image_token_id, ckpt.config.vision_config.hidden_size
    per_image = ids["frame"].count(slot)
    gen = torch.Generator().manual_seed(0)
    visual = {k: torch.randn(v.count(slot), dv, generator=gen) for k, v in ids.items()}  # [N_img * 576, Dv]
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, layers, layers), weights))  # the first `layers`, as one stage
    for k in ids:  # warm-up, both shapes
        prefill_ms(ex, f"warm-{k}", ids[k], visual[k])
    times: dict[str, list[float]] = {k: [] for k in ids}
    cpu: dict[str, list[float]] = {k: [] for k in ids}
    for r in range(rounds):  # interleaved: a load change hits both alike
        for k in ids:
            wall, used = prefill_ms(ex, f"{k}{r}", ids[k], visual[k])
            times[k].append(wall)
            cpu[k].append(used)
        print(f"round {r}: frame {times['frame'][-1]:.0f} ms, evidence {times['evidence'][-1]:.0f} ms", flush=True)
    del ex
    frame, more = statistics.median(times["frame"]), statistics.median(times["evidence"])
    cpu_frame, cpu_more = statistics.median(cpu["frame"]), statistics.median(cpu["evidence"])
    enc = encode_ms(ckpt, weights, rounds)
    extra = len(ids["evidence"]) - len(ids["frame"])
    return {
        "prompt_tokens": {"frame_alone": len(ids["frame"]), "with_evidence": len(ids["evidence"]), "extra": extra,
                          "tokens_per_image": per_image, "extra_image_placeholders": 2 * per_image,
                          "extra_caption_tokens": extra - 2 * per_image},
        "prefill_ms": {"frame_alone": [round(x) for x in times["frame"]],
                       "with_evidence": [round(x) for x in times["evidence"]],
                       "frame_alone_median": round(frame), "with_evidence_median": round(more),
                       "extra_median": round(more - frame), "ratio": round(more / frame, 3)},
        "prefill_cpu_ms": {"frame_alone": [round(x) for x in cpu["frame"]],
                           "with_evidence": [round(x) for x in cpu["evidence"]],
                           "extra_median": round(cpu_more - cpu_frame), "ratio": round(cpu_more / cpu_frame, 3),
                           "note": "CPU time of this process (all its threads): the wall time's share of the box"},
        "vision_encode_ms": {"per_image_median": round(enc), "extra_for_two_images": round(2 * enc),
                             "note": f"the checkpoint's vision tower in torch {weights}; the served vision backend "
                             "(ONNX Runtime, int8) differs"},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="1.3B-shaped; made (random) when missing")
    ap.add_argument("--weights", default="bf16", help="stage and vision weight format: fp32 | bf16")
    ap.add_argument("--layers", type=int, default=0, help="use only the first N LM layers (0: all 24)")
    ap.add_argument("--context-tokens", type=int, default=300, help="spec-context tokens in the prompt")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median reported)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/explain_evidence.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not (args.checkpoint / "config.json").is_file():
        print(f"making random DeepSeek-VL 1.3B weights in {args.checkpoint}", flush=True)
        make_random_preset(args.checkpoint, "deepseek-vl-1.3b", dtype=torch.bfloat16)
    ckpt = open_checkpoint(args.checkpoint)
    layers = args.layers or ckpt.num_layers
    payload = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine_info(bandwidth=False),
        "model": {"dimensions": "DeepSeek-VL 1.3B (hidden 2048, SigLIP-L at 384 px), random weights",
                  "lm_layers": layers, "of_lm_layers": 24, "weights": args.weights},
        "accuracy": "unmeasured: whether the crop and the reference make the explanation better needs the real "
        "weights and labelled photographs",
    }  # fmt: skip
    payload["evidence"] = measure(ckpt, args.weights, layers, args.rounds, args.context_tokens)
    payload["machine"]["loadavg_end"] = load_average()
    busy = max(payload["machine"]["loadavg_start"][0], payload["machine"]["loadavg_end"][0])
    if busy > payload["machine"]["usable_cores"]:
        payload["machine"]["contended"] = (
            f"load average {busy} on {payload['machine']['usable_cores']} cores: other work shared the box, wall "
            "times are inflated and noisy; the token counts are exact and the CPU-time ratio is the steadier figure"
        )
    path = write_json("explain_evidence", payload, args.out)
    t, p = payload["evidence"]["prompt_tokens"], payload["evidence"]["prefill_ms"]
    print(
        f"prompt {t['frame_alone']} -> {t['with_evidence']} tokens (+{t['extra']}: 2 x {t['tokens_per_image']} image "
        f"+ {t['extra_caption_tokens']} caption); prefill {p['frame_alone_median']} -> {p['with_evidence_median']} ms "
        f"(+{p['extra_median']} ms, {p['ratio']}x) over {layers} layers\n{path}"
    )


if __name__ == "__main__":
    main()
