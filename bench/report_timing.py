"""One report's measurements for perf_report.py: a report timed phase by phase on each side (transformers,
ours), a decode step against the read bound at the report's depth, and what the stage's linears run."""

from __future__ import annotations

import io
import statistics
import time

import torch
from PIL import Image

from edgeinspect.models.image_io import decode_image
from edgeinspect.models.int4 import Int4Linear
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.quant import Int8Linear
from edgeinspect.models.stage import StageExecutor, StepInput

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
        "decode_ms_per_token": median_gap_ms(steps),
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
        "decode_ms_per_token": median_gap_ms(steps),
        "prompt_tokens": len(ids),
        "generated": len(generated),
        "first_logits": first_logits.float(),
    }


def linear_kernels(module) -> str:
    """What the stage's packed linears run, as read off them ("" for torch's own linears)."""
    parts = []
    for bits in (6, 4):  # Int6Linear is an Int4Linear on another grid
        used = sorted({m.kernel for m in module.modules() if isinstance(m, Int4Linear) and m.bits == bits})
        parts += [f"int{bits} {'/'.join(used)} (prompts int8)"] if used else []
    int8 = sorted({m.kernel for m in module.modules() if isinstance(m, Int8Linear)})
    return ", ".join(parts + ([f"int8 {'/'.join(int8)}"] if int8 else []))


def decode_at_read_bound(executor: StageExecutor, depth: int, weight_bytes: int, steps: int = 32) -> dict:
    """Decode steps at the report's depth, each right after a read-bandwidth probe.

    The box's memory speed moves with other tenants by +-30% within seconds here (decode steps of one report ranged
    86-186 ms), so one bandwidth figure from the start of a 20-minute run does not bound a step taken later. Each
    probe sums as many bytes as the step's weights (far beyond the caches, and about as long as the step) with the
    same threads just before its step. A step must read every weight and, at the report's context, every cached
    key and value row once: its read bound is those bytes at the probe's speed (x_read_bound, the target's
    figure); x_weight_read_bound leaves the cache out (the bound earlier runs reported). The KV cache holds
    `depth` positions (its values do not change the work). Both are medians of the per-step ratios.
    """
    probe_bytes = weight_bytes // 4 * 4
    probe = torch.ones(probe_bytes // 4)
    probe.sum()  # resident before the first probe
    m = executor.module
    layers, heads, hd = len(m.layers), executor.kv_heads, executor.head_dim
    kv = executor.kv_rows(torch.randn(layers, 2, heads, depth, hd) * 0.1)
    executor.open_from(SID, kv, spare=steps + 1)
    per_position = executor.kv_bytes_per_position()
    ratios, weight_ratios, step_ms, gbs = [], [], [], []
    try:
        for i in range(steps):
            t0 = time.perf_counter()
            probe.sum()
            t1 = time.perf_counter()
            executor.step([(SID, StepInput(position=depth + i, input_ids=torch.tensor([5])))])
            t2 = time.perf_counter()
            bw = probe_bytes / (t1 - t0)
            gbs.append(bw / 1e9)
            step_ms.append((t2 - t1) * 1e3)
            ratios.append((t2 - t1) / ((weight_bytes + per_position * (depth + i)) / bw))
            weight_ratios.append((t2 - t1) / (weight_bytes / bw))
    finally:
        executor.release(SID)
    return {
        "depth": depth,
        "steps": steps,
        "weight_bytes": weight_bytes,
        "kv_bytes_at_depth": per_position * depth,
        "decode_ms_median": round(statistics.median(step_ms), 2),
        "probe_gbs_median": round(statistics.median(gbs), 2),
        "probe_gbs_range": [round(min(gbs), 2), round(max(gbs), 2)],
        "x_read_bound": round(statistics.median(ratios), 3),
        "x_read_bound_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "x_weight_read_bound": round(statistics.median(weight_ratios), 3),
    }


def median_gap_ms(stamps: list[float]) -> float | None:
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return statistics.median(gaps) * 1e3 if gaps else None
