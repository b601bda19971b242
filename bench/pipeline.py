"""The distributed pipeline over loopback gRPC against the in-process monolith, on the same checkpoint.

For 1, 2 and 3 decoder stages (each its own process, driven by the gateway): time to first token and decode
ms/token measured at the gateway, the network's share of each token (wall time not spent computing in a stage),
and wire bytes per token and per image for each codec. The monolith (vision tower + all layers in this process,
no gRPC) runs in the same invocation as the baseline.

    .venv/bin/python bench/pipeline.py                      # 1.3B-shaped checkpoint, bf16 stages
    .venv/bin/python bench/pipeline.py --checkpoint DIR --tokens 16 --stages 1 2 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import load_average, machine_info, require_checkpoint, target, write_json
from PIL import Image

from edgeinspect import codec
from edgeinspect.assets import sample_image
from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.pipeline import LocalPipeline, load_local_stages
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_ids, prompt_text
from edgeinspect.models.stage import LayerRange, StepInput
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.client import InspectionClient
from edgeinspect.stack.launcher import LocalStack, StackOptions

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
HOP_TARGET = 0.03  # the hops may add at most 3% to the per-token time


def monolith(ckpt_path: Path, weights: str, tokens: int, repeats: int) -> dict:
    """Vision + prefill + decode in this process: one StageExecutor over every layer."""
    ckpt = open_checkpoint(ckpt_path)
    processor = load_processor(ckpt)
    tower = load_vision_tower(ckpt)
    preprocess = ImagePreprocessor(ckpt)
    pipe = LocalPipeline(load_local_stages(ckpt, [LayerRange(0, ckpt.num_layers, ckpt.num_layers)], weights))
    image = Image.open(io.BytesIO(sample_image().read_bytes())).convert("RGB")
    ids = prompt_ids(processor, prompt_text(processor, build_messages(DEFAULT_INSTRUCTION)))
    ttft, per_token = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        with torch.inference_mode():
            visual = tower(preprocess(image))[0]
        stage = pipe.stages[0]
        logits = stage.step([("m", StepInput(0, input_ids=torch.tensor(ids), visual_tokens=visual))])[0].logits
        t_first = time.perf_counter()
        token, pos = int(logits.argmax()), len(ids)
        for _ in range(tokens - 1):
            logits = stage.step([("m", StepInput(pos, input_ids=torch.tensor([token])))])[0].logits
            token, pos = int(logits.argmax()), pos + 1
        t_end = time.perf_counter()
        stage.release("m")
        if r or repeats == 1:
            ttft.append((t_first - t0) * 1e3)
            per_token.append((t_end - t_first) * 1e3 / (tokens - 1))
    del pipe, tower
    return {
        "prompt_tokens": len(ids),
        "ttft_ms": statistics.median(ttft),
        "decode_ms_per_token": statistics.median(per_token),
    }


def timing(report, name: str) -> float:
    return next(t.wire_ms for t in report.timings if t.stage == name)


def pipeline_run(ckpt_path: Path, weights: str, stages: int, wire: str, tokens: int, repeats: int) -> dict:
    with (
        tempfile.TemporaryDirectory() as work,
        LocalStack(
            StackOptions(
                workdir=Path(work),
                checkpoint=ckpt_path,
                stages=stages,
                codec=wire,
                weights=weights,
                start_timeout_s=900,
            )
        ) as stack,
        InspectionClient(stack.gateway_address, stack.api_token) as client,
    ):
        image = sample_image().read_bytes()
        reports = [client.inspect(image, max_new_tokens=tokens, prompt=DEFAULT_INSTRUCTION) for _ in range(repeats)]
        measured = reports[1:] if repeats > 1 else reports
        return {
            "stages": stages,
            "codec": wire,
            "ttft_ms": statistics.median(timing(r, "time_to_first_token") for r in measured),
            "decode_ms_per_token": statistics.median(timing(r, "decode_per_token") for r in measured),
            "network_ms_per_token": statistics.median(timing(r, "network_per_token") for r in measured),
            "generated": len(reports[-1].generated_token_ids),
        }


def wire_bytes(ckpt_path: Path) -> dict:
    """Payload bytes per decode step (one hidden state [1, hidden]) and per image ([N, vision_hidden])."""
    ckpt = open_checkpoint(ckpt_path)
    hidden = torch.randn(1, ckpt.text_config.hidden_size)
    v = ckpt.config.vision_config
    visual = torch.randn((v.image_size // v.patch_size) ** 2, v.hidden_size)
    out = {}
    for c in codec.Codec:
        for z in (False, True):
            out[f"{c.value}{'+zstd' if z else ''}"] = {
                "per_token_per_hop": len(codec.encode(hidden, c, z).payload),
                "per_image": len(codec.encode(visual, c, z).payload),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=Path(os.environ.get("EDGEINSPECT_BENCH_CKPT", DEFAULT_CKPT)))
    ap.add_argument("--weights", default="bf16")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="inspections per configuration (the first warms up)")
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = {
        "machine": machine_info(bandwidth=False),
        "checkpoint": str(args.checkpoint),
        "weights": args.weights,
        "tokens": args.tokens,
        "load_before": load_average(),
    }
    results["monolith"] = mono = monolith(args.checkpoint, args.weights, args.tokens, args.repeats)
    print(f"monolith: TTFT {mono['ttft_ms']:.0f} ms, decode {mono['decode_ms_per_token']:.1f} ms/token")
    runs = []
    for stages in args.stages:
        r = pipeline_run(args.checkpoint, args.weights, stages, "fp16", args.tokens, args.repeats)
        r["decode_ratio_vs_monolith"] = r["decode_ms_per_token"] / mono["decode_ms_per_token"]
        r["network_share"] = r["network_ms_per_token"] / r["decode_ms_per_token"]
        # What the hops add is the per-token time not spent computing in a stage (measured at the gateway on the
        # same tokens); the ratio to the monolith is also recorded, but on a shared box it mostly measures load.
        r["hops_overhead"] = target(r["network_share"], HOP_TARGET, higher_is_better=False)
        runs.append(r)
        print(
            f"{stages} stage(s): TTFT {r['ttft_ms']:.0f} ms, decode "
            f"{r['decode_ms_per_token']:.1f} ms/token ({r['decode_ratio_vs_monolith']:.3f}x monolith), network "
            f"{r['network_ms_per_token']:.2f} ms/token ({100 * r['network_share']:.1f}%)"
        )
    results["pipeline"] = runs
    results["wire_bytes"] = wire_bytes(args.checkpoint)
    results["load_after"] = load_average()
    print(f"wrote {write_json('pipeline', results)}")


if __name__ == "__main__":
    main()
