"""The accuracy cost of each weight format against fp32: logits cosine and greedy-token agreement.

Checkpoints: the tiny test model and a mid-size one (8 layers of width 512, ~30M parameters), both generated here,
each at two weight scales: std 0.3 (the tiny checkpoint's choice, so that greedy output varies; it makes the
network chaotic: small weight errors grow from layer to layer) and std 0.02 (a trained model's scale); plus the
1.3B-shaped checkpoint (std 0.02) on a text prompt. Formats: bf16, int8 with the default kernel (fbgemm: int8
weights per channel, pair-bounded on CPUs without VNNI; 8-bit activations per token, two passes for down_proj; see
models/quant.py), int8 weight-only (dequantized to fp32), int4 (models/int4.py: q4_0 grid for decode rows,
down_proj and lm_head int8, prompts through the int8 copy) and int6 (the q6 grid on every linear, lm_head too;
prompts through the int8 copy).
Cosine is per step, teacher-forced on fp32's tokens; agreement is free-running greedy, position by position.

    .venv/bin/python bench/perf_accuracy.py [--tokens 16] [--big-tokens 6] [--no-big] [--only-big]
        [--formats bf16,int8,int8-dequant,int4,int6]   (--only-big/--formats merge into the existing JSON)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch
from common import RESULTS_DIR, load_average, machine_info, target, write_json
from PIL import Image

from edgeinspect.assets import asset_path
from edgeinspect.models.accuracy import compare, reference
from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.quant import default_kernel
from edgeinspect.models.tiny import TinySpec, make_tiny
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower

BIG = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
COSINE_TARGET = 0.99
MID = dict(layers=8, hidden=512, heads=8, kv_heads=4, intermediate=1408, image_size=64, seed=2)
FORMATS = [("bf16", None), ("int8", None), ("int8", "dequant"), ("int4", None), ("int6", None)]


def image_case(path: Path):
    ckpt = open_checkpoint(path)
    processor = load_processor(ckpt)
    ids = prompt_ids(processor, prompt_text(processor, build_messages(context="Scratches up to 0.5 mm wide pass.")))
    image = Image.open(asset_path("part_scratch.jpg")).convert("RGB")
    with torch.inference_mode():
        visual = load_vision_tower(ckpt)(ImagePreprocessor(ckpt)(image))[0]
    return ckpt, ids, visual


def text_case(path: Path):
    ckpt = open_checkpoint(path)
    processor = load_processor(ckpt)
    text = "Defect specifications: scratches up to 0.5 mm wide pass; dents deeper than 0.2 mm fail. Verdict:"
    return ckpt, list(processor.tokenizer(text)["input_ids"]), None


def evaluate(name: str, case, tokens: int) -> dict:
    ckpt, ids, visual = case
    print(f"[{name}] fp32 reference, {len(ids)} prompt tokens, {tokens} new", flush=True)
    ref = reference(ckpt, ids, visual, tokens)
    out = {}
    for weights, kernel in FORMATS:
        label = weights if kernel is None else f"{weights}-{kernel}"
        acc = compare(ckpt, ids, visual, weights, tokens, int8_kernel=kernel, ref=ref)
        out[label] = dataclasses.asdict(acc) | {"kernel": kernel or (default_kernel() if weights == "int8" else None)}
        print(f"[{name}] {label}: min cosine {acc.min_cosine:.5f}, agreement {acc.token_agreement:.2f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--big-tokens", type=int, default=6)
    ap.add_argument("--no-big", action="store_true", help="skip the 1.3B-shaped checkpoint")
    ap.add_argument("--only-big", action="store_true", help="only the 1.3B-shaped checkpoint")
    ap.add_argument("--big", type=Path, default=BIG, help="the 1.3B-shaped checkpoint")
    ap.add_argument("--formats", default="", help="subset of formats (labels as in the JSON); default all")
    args = ap.parse_args()
    if args.formats:
        wanted = set(args.formats.split(","))
        FORMATS[:] = [(w, k) for w, k in FORMATS if (w if k is None else f"{w}-{k}") in wanted]
    previous = RESULTS_DIR / "perf_accuracy.json"
    merge = (args.only_big or args.formats) and previous.is_file()
    machine = machine_info(bandwidth=False)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        specs = (
            {}
            if args.only_big
            else {
                "tiny_std0.3": TinySpec(),
                "tiny_std0.02": TinySpec(initializer_range=0.02),
                "mid_std0.3": TinySpec(**MID),
                "mid_std0.02": TinySpec(**MID, initializer_range=0.02),
            }
        )
        for name, spec in specs.items():
            results[name] = evaluate(name, image_case(make_tiny(Path(tmp) / name, spec)), args.tokens)
    if not args.no_big and (args.big / "config.json").is_file():
        results["1.3b_std0.02_text"] = evaluate("1.3b", text_case(args.big), args.big_tokens)
    if merge:  # a partial run updates the recorded rows it measured and keeps the others
        old = json.loads(previous.read_text())["results"]
        for ckpt, rows in results.items():
            old[ckpt] = old.get(ckpt, {}) | rows
        results = old
    targets = {
        f"{ckpt}.{fmt}.min_cosine": target(r[fmt]["min_cosine"], COSINE_TARGET)
        for ckpt, r in results.items()
        if "std0.02" in ckpt
        for fmt in r
    }
    payload = {
        "benchmark": "perf_accuracy",
        "machine": machine | {"loadavg_end": load_average()},
        "results": results,
        "targets": targets,
    }
    print(f"-> {write_json('perf_accuracy', payload)}")


if __name__ == "__main__":
    main()
