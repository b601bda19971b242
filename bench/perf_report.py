"""Time to a complete report on one box: our fastest formats vs plain transformers bf16 generate(), same run.

One report = a JPEG part image (384x384 SigLIP at 1.3B: 576 visual tokens), ~`--context-tokens` tokens of spec
context from the shipped sample KB in the gateway's chat-template prompt, and `--tokens` greedy tokens (EOS ignored
on both sides). Each side is timed end to end from the image bytes: decode + preprocessing + prompt, vision,
prefill, decode.

- Baseline: DeepseekVLForConditionalGeneration in bf16 (load_reference_model), processor(images, text) and
  generate(max_new_tokens=N, min_new_tokens=N, do_sample=False); phases from hooks on its vision tower and a
  logits-processor stamp per token.
- Ours: the vision tower in onnxruntime (int8 when bench/results/vision.json records cosine >= 0.99 against torch
  fp32 for this checkpoint, else fp32), the prompt built as the gateway builds it (models/prompt.py), then one
  whole-model StageExecutor for prefill and N-1 decode steps. A stage holds one weights format (the KV cache lives
  in its executor), so every candidate format (fp32; bf16, i.e. fbgemm packed fp16 linears on CPUs without bf16
  instructions; int8 only where perf_accuracy.json's 1.3B record is met) runs the whole report, and the fastest
  whose first-token logits keep cosine >= 0.99 against fp32's on the same visual tokens is "ours" (fp32 always
  runs, as that reference; cosine against the bf16 baseline is recorded too, but it carries the baseline's own
  bf16 error).

Only one 1.3B model is in memory at a time: the baseline is freed before any stage loads, each candidate stage
before the next. Load times are not part of a report (transformers converts to bf16 while loading; an fp32 stage
maps the safetensors files, so its first prefill also faults its weights in from the page cache).

    .venv/bin/python bench/perf_report.py [--checkpoint PATH] [--tokens 80] [--context-tokens 300] [--rounds 1]
        [--formats fp32,bf16,int8] [--warmup 0] [--out bench/results/perf_report.json]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import statistics
import time
from pathlib import Path

import torch
from common import RESULTS_DIR, load_average, machine_info, skip, spec_context, target, write_json
from perf_decode import step_bytes
from PIL import Image

from edgeinspect.assets import asset_path
from edgeinspect.models.checkpoint import Checkpoint, load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.image_io import decode_image
from edgeinspect.models.onnx_export import export_vision_onnx, quantize_vision_onnx
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.quant import use_half16
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.vision.backends import OnnxBackend

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CKPT = ROOT / "var" / "checkpoints" / "deepseek-vl-1.3b"
IMAGE = "part_scratch.jpg"
RATIO_TARGET = 0.4  # our report time over transformers bf16's
MIN_COSINE = 0.99  # logits cosine a format must keep to count
MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS = 20 << 20, 40_000_000  # the vision node's limits (far above this image)
SID = "report"


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def baseline_report(model, processor, image_bytes: bytes, context: str, tokens: int) -> dict:
    """transformers end to end: image decode + processor, then one generate(); phases from hooks and stamps."""
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: dict[str, float] = {}
    steps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            steps.append(time.perf_counter())
            return scores

    def stamp(name: str):
        def hook(*_) -> None:  # a hook returning a value would replace the module's input or output
            stamps.setdefault(name, time.perf_counter())

        return hook

    vision = model.model.vision_model
    hooks = [
        vision.register_forward_pre_hook(stamp("vision_start")),
        vision.register_forward_hook(stamp("vision_end")),
    ]
    try:
        t0 = time.perf_counter()
        image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
        text = processor.apply_chat_template(build_messages(context=context), add_generation_prompt=True)
        inputs = processor(images=image, text=text, return_tensors="pt")
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
        t1 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                logits_processor=LogitsProcessorList([Stamp()]),
                output_logits=True,
                return_dict_in_generate=True,
            )
        t2 = time.perf_counter()
    finally:
        for h in hooks:
            h.remove()
    generated = out.sequences.shape[1] - inputs["input_ids"].shape[1]
    return {
        "total_s": t2 - t0,
        "preprocess_s": t1 - t0,
        "vision_s": stamps["vision_end"] - stamps["vision_start"],
        "prefill_s": steps[0] - stamps["vision_end"],  # aligner, embedding, all prompt positions, first logits
        "decode_ms_per_token": _median_gap_ms(steps),
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "generated": int(generated),
        "first_logits": out.logits[0][0].float(),  # [vocab], before min_new_tokens masks EOS
    }


def ours_report(parts: dict, executor: StageExecutor, image_bytes: bytes, context: str, tokens: int) -> dict:
    """Our path end to end: decode + preprocess + prompt, ONNX vision, one prefill step, tokens-1 decode steps."""
    t0 = time.perf_counter()
    image = decode_image(image_bytes, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS)
    pixels = parts["preprocess"](image)  # [1, 3, S, S]
    ids = prompt_ids(parts["processor"], prompt_text(parts["processor"], build_messages(context=context)))
    t1 = time.perf_counter()
    visual = parts["vision"](pixels)[0]  # [N_img, vision_hidden]
    t2 = time.perf_counter()
    executor.open(SID, capacity=len(ids) + tokens)
    steps = []
    try:
        out = executor.step([(SID, StepInput(position=0, input_ids=torch.tensor(ids), visual_tokens=visual))])[0]
        first_logits = out.logits
        token, pos = int(torch.argmax(out.logits)), len(ids)
        steps.append(time.perf_counter())
        generated = [token]
        for _ in range(tokens - 1):  # EOS ignored: every report is `tokens` long, like min_new_tokens
            out = executor.step([(SID, StepInput(position=pos, input_ids=torch.tensor([token])))])[0]
            token, pos = int(torch.argmax(out.logits)), pos + 1
            generated.append(token)
            steps.append(time.perf_counter())
    finally:
        executor.release(SID)
    return {
        "total_s": steps[-1] - t0,
        "preprocess_s": t1 - t0,
        "vision_s": t2 - t1,
        "prefill_s": steps[0] - t2,
        "decode_ms_per_token": _median_gap_ms(steps),
        "prompt_tokens": len(ids),
        "generated": len(generated),
        "first_logits": first_logits.float(),
    }


def _median_gap_ms(stamps: list[float]) -> float | None:
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return statistics.median(gaps) * 1e3 if gaps else None


def vision_choice(ckpt: Checkpoint, onnx_dir: Path, pixels: torch.Tensor, threads: int) -> dict:
    """int8 ONNX if its cosine to torch fp32 (recorded in vision.json for this checkpoint, else measured) >= 0.99."""
    fp32_path = onnx_dir / f"vision-{ckpt.fingerprint}.onnx"
    int8_path = onnx_dir / f"vision-{ckpt.fingerprint}-int8.onnx"
    if not fp32_path.is_file():
        export_vision_onnx(ckpt.path, fp32_path)
    if not int8_path.is_file():
        quantize_vision_onnx(fp32_path, int8_path)
    source, cos = "", None
    record = RESULTS_DIR / "vision.json"
    if record.is_file():
        data = json.loads(record.read_text())
        rows = {r["backend"]: r for r in data.get("rows", [])}
        if data.get("fingerprint") == ckpt.fingerprint and "onnxruntime int8" in rows:
            cos, source = rows["onnxruntime int8"]["cosine_min_token"], f"{record.name} (min over tokens)"
    if cos is None:
        tower = load_vision_tower(ckpt, "fp32")
        with torch.inference_mode():
            ref = tower(pixels)[0]  # [N, D]
        int8 = OnnxBackend(int8_path, ckpt.fingerprint, threads)(pixels)[0]
        cos = float(torch.nn.functional.cosine_similarity(ref.double(), int8.double(), dim=-1).min())
        source = "measured here against torch fp32 (min over tokens)"
        del tower
    chosen = "int8" if cos >= MIN_COSINE else "fp32"
    return {
        "format": chosen,
        "path": str(int8_path if chosen == "int8" else fp32_path),
        "int8_cosine": round(cos, 6),
        "cosine_source": source,
    }


def int8_allowed() -> tuple[bool, str]:
    """Whether perf_accuracy.json's 1.3B int8 logits-cosine record is met (another engineer is improving it)."""
    path = RESULTS_DIR / "perf_accuracy.json"
    if not path.is_file():
        return False, "no perf_accuracy.json"
    recs = json.loads(path.read_text()).get("targets", {})
    rec = next((v for k, v in recs.items() if k.startswith("1.3b") and k.endswith(".int8.min_cosine")), None)
    if rec is None:
        return False, "perf_accuracy.json has no 1.3B int8 record"
    return bool(rec["met"]), f"perf_accuracy.json 1.3B int8 min cosine {rec['value']} (target {rec['target']})"


def summarise(runs: list[dict]) -> dict:
    """Median of each phase over rounds (first_logits dropped)."""
    keys = ["total_s", "preprocess_s", "vision_s", "prefill_s", "decode_ms_per_token"]
    row = {k: round(statistics.median(r[k] for r in runs), 4) for k in keys if runs[0][k] is not None}
    row["runs_total_s"] = [round(r["total_s"], 3) for r in runs]
    row["prompt_tokens"], row["generated"] = runs[0]["prompt_tokens"], runs[0]["generated"]
    return row


def timed(fn, rounds: int, warmup: int) -> list[dict]:
    for _ in range(warmup):
        fn()
    out = []
    for r in range(rounds):
        out.append(fn())
        print(f"  round {r}: {out[-1]['total_s']:.2f} s", flush=True)
    return out


def run_baseline(ckpt: Checkpoint, processor, image_bytes: bytes, context: str, args) -> tuple[list[dict], int]:
    """The baseline's timed reports and the bytes one of its decode steps reads (layers, norm, lm_head)."""
    ref = load_reference_model(ckpt, "bf16")
    runs = timed(lambda: baseline_report(ref, processor, image_bytes, context, args.tokens), args.rounds, args.warmup)
    parts = (ref.model.language_model.layers, ref.model.language_model.norm, ref.lm_head)
    return runs, sum(p.numel() * p.element_size() for part in parts for p in part.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT, help="DeepSeek-VL checkpoint folder")
    ap.add_argument("--tokens", type=int, default=80, help="generated tokens per report (EOS ignored)")
    ap.add_argument("--context-tokens", type=int, default=300, help="spec-context tokens in the prompt")
    ap.add_argument("--rounds", type=int, default=1, help="timed reports per side (median)")
    ap.add_argument("--warmup", type=int, default=0, help="untimed reports per side first")
    ap.add_argument("--formats", default="fp32,bf16,int8", help="candidate stage weight formats for ours")
    ap.add_argument("--threads", type=int, default=2, help="torch and onnxruntime intra-op threads")
    ap.add_argument("--onnx-dir", type=Path, default=ROOT / "var" / "onnx", help="vision ONNX exports (cached)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "perf_report.json", help="JSON to write")
    args = ap.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        skip(f"no checkpoint at {args.checkpoint} (make one with `edgeinspect model make-tiny DIR`)")
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    torch.set_num_threads(args.threads)
    machine = machine_info()
    ckpt = open_checkpoint(args.checkpoint)
    processor = load_processor(ckpt)
    context = spec_context(processor.tokenizer, args.context_tokens)
    image_bytes = asset_path(IMAGE).read_bytes()

    print("baseline: transformers bf16 generate()", flush=True)
    base_runs, base_bytes = run_baseline(ckpt, processor, image_bytes, context, args)
    gc.collect()  # the baseline model is gone before any stage loads: one 1.3B model at a time

    preprocess = ImagePreprocessor(ckpt)
    vision = vision_choice(
        ckpt, args.onnx_dir, preprocess(decode_image(image_bytes, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS)), args.threads
    )
    parts = {
        "processor": processor,
        "preprocess": preprocess,
        "vision": OnnxBackend(Path(vision["path"]), ckpt.fingerprint, args.threads),
    }
    int8_ok, int8_why = int8_allowed()
    formats = [f for f in args.formats.split(",") if f and (f != "int8" or int8_ok)]
    # fp32 is the accuracy reference: the other formats' first-token logits are compared with it on the same
    # visual tokens (the baseline's own bf16 error would otherwise count against them).
    formats = ["fp32", *(f for f in formats if f != "fp32")]
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    candidates = {}
    for fmt in formats:
        print(f"ours: ONNX {vision['format']} vision + StageExecutor {fmt}", flush=True)
        t0 = time.perf_counter()
        executor = StageExecutor(load_stage(ckpt, whole, fmt))
        load_s = time.perf_counter() - t0
        runs = timed(
            lambda ex=executor: ours_report(parts, ex, image_bytes, context, args.tokens), args.rounds, args.warmup
        )
        row = summarise(runs)
        row["load_s"] = round(load_s, 1)
        row["first_logits_cosine_vs_baseline"] = round(cosine(runs[0]["first_logits"], base_runs[0]["first_logits"]), 6)
        if fmt == "fp32":
            reference_logits = runs[0]["first_logits"]
        row["first_logits_cosine_vs_fp32"] = round(cosine(runs[0]["first_logits"], reference_logits), 6)
        row["weight_bytes_per_step"] = step_bytes(executor.module)
        row["kernel"] = "fbgemm fp16" if use_half16(fmt) else ("fbgemm int8" if fmt == "int8" else "torch " + fmt)
        candidates[fmt] = row
        del executor, runs
        gc.collect()

    bw = machine["read_bandwidth_gbs_2_threads"]
    baseline = summarise(base_runs) | {"weight_bytes_per_step": base_bytes}
    for row in [baseline, *candidates.values()]:
        if row.get("decode_ms_per_token") is not None:
            row["read_bound_ms"] = round(row["weight_bytes_per_step"] / (bw * 1e9) * 1e3, 2)
            row["x_read_bound"] = round(row["decode_ms_per_token"] / row["read_bound_ms"], 2)
    eligible = {f: r for f, r in candidates.items() if r["first_logits_cosine_vs_fp32"] >= MIN_COSINE}
    if not eligible:
        raise SystemExit(f"no format kept logits cosine >= {MIN_COSINE}: {candidates}")
    best = min(eligible, key=lambda f: eligible[f]["total_s"])
    ratio = eligible[best]["total_s"] / baseline["total_s"]
    payload = {
        "benchmark": "perf_report",
        "machine": machine | {"loadavg_end": load_average()},
        "checkpoint": str(args.checkpoint),
        "image": IMAGE,
        "context_tokens": args.context_tokens,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "baseline": {"what": "transformers DeepseekVLForConditionalGeneration bf16 generate()"} | baseline,
        "vision": vision,
        "int8_decode": {"allowed": int8_ok, "why": int8_why},
        "candidates": candidates,
        "ours": {"format": best, "vision": f"onnxruntime {vision['format']}"} | eligible[best],
        "targets": {"report_time_ours_vs_transformers_bf16": target(ratio, RATIO_TARGET, higher_is_better=False)},
    }
    path = write_json("perf_report", payload, args.out)
    print(f"{'':>10} {'total s':>9} {'prep s':>7} {'vision s':>9} {'prefill s':>10} {'decode ms/tok':>14}")
    for name, row in [("baseline", baseline), *candidates.items()]:
        print(
            f"{name:>10} {row['total_s']:9.2f} {row['preprocess_s']:7.3f} {row['vision_s']:9.2f} "
            f"{row['prefill_s']:10.2f} {row.get('decode_ms_per_token') or 0:14.1f}"
        )
    print(f"ours ({best}) / transformers bf16 = {ratio:.3f} (target <= {RATIO_TARGET}) -> {path}")


if __name__ == "__main__":
    main()
