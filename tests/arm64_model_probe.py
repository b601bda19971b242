"""The model path as an arm64 decoder stage runs it, printed as JSON: run by tests/test_arm64_model.py under
qemu-user with an aarch64 CPython, torch and our package (tools/arm64_env.py builds that folder), and here on x86.

1. transformers' generate() of the checkpoint (greedy, the shipped sample part photo and a prompt) in this process,
   and our fp32 stages split in two over the same inputs: tokens and logits.
2. One whole-model stage per packed format (int8 on the default kernel, int6, int4) over a prompt and four fixed
   decode steps: its logits, with the kernel each format ran and our kernels' SIMD levels.
3. The vision tower on the sample photo, as a Raspberry Pi vision node runs it: torch fp32 and int8, and ONNX
   Runtime fp32 and int8 as the node loads them (the export made on the box at first start, the int8 copy quantised
   there): its tokens, and the backends `backend: auto` would time there.

Usage: python arm64_model_probe.py CHECKPOINT OUT.json ONNX_PATH (ONNX_PATH: where the node's export goes)"""

from __future__ import annotations

import json
import platform
import sys

import torch

from edgeinspect.assets import asset_path
from edgeinspect.models import cpu, quant
from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.kernels import bindings
from edgeinspect.models.pipeline import LocalPipeline, Request, even_split, load_local_stages
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.vision.backends import auto_loaders
from edgeinspect.services.vision.settings import VisionSettings

NEW_TOKENS = 12
STEPS = (17, 230, 4, 99)  # the same decode tokens into every format's stage


def reference_and_split(ckpt, image, visual: torch.Tensor) -> dict:
    """`visual`: the fp32 tower's tokens of `image`, which our stages take where generate() runs the tower itself."""
    processor = load_processor(ckpt)
    text = prompt_text(
        processor, build_messages("Inspect the part in the image.", context="Scratches up to 0.5 mm pass.")
    )
    inputs = processor(text=text, images=image, return_tensors="pt")
    model = load_reference_model(ckpt)
    with torch.inference_mode():
        out = model.generate(
            **inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    n = inputs["input_ids"].shape[1]
    ids = prompt_ids(processor, text)
    pipe = LocalPipeline(load_local_stages(ckpt, even_split(ckpt.num_layers, 2)))
    got = pipe.generate({"s": Request(ids, visual, max_new_tokens=NEW_TOKENS)}, keep_logits=True)["s"]
    return {
        "same_prompt_ids": ids == inputs["input_ids"][0].tolist(),
        "generate_tokens": out.sequences[0, n:].tolist(),
        "split_tokens": got.tokens,
        "logits_max_diff": max((a - b[0]).abs().max().item() for a, b in zip(got.logits, out.logits, strict=True)),
    }


def format_logits(ckpt) -> dict:
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    ids = torch.randint(10, 500, (30,), generator=torch.Generator().manual_seed(5))
    logits = {}
    for weights in ("fp32", "int8", "int6", "int4"):
        ex = StageExecutor(load_stage(ckpt, whole, weights), kv_cache="fp16")
        rows = [ex.step([("a", StepInput(0, input_ids=ids))])[0].logits]
        for pos, token in zip(range(30, 30 + len(STEPS)), STEPS, strict=True):
            rows.append(ex.step([("a", StepInput(pos, input_ids=torch.tensor([token])))])[0].logits)
        logits[weights] = torch.stack(rows).float().flatten().tolist()
    return logits


def vision_tokens(ckpt, image, onnx_path: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Tokens per backend, and the backends `backend: auto` would time on this box."""
    pixels = ImagePreprocessor(ckpt)(image)
    with torch.inference_mode():
        tokens = {w: load_vision_tower(ckpt, w)(pixels)[0].float() for w in ("fp32", "int8")}
    loaders = auto_loaders(ckpt, VisionSettings(checkpoint=ckpt.path, backend="auto", onnx_path=onnx_path))
    for name in ("onnxruntime-fp32", "onnxruntime-int8"):  # as the node loads them: exported, quantised here
        tokens[name] = loaders[name]()(pixels)[0]
    return tokens, list(loaders)


def main() -> None:
    from PIL import Image

    ckpt = open_checkpoint(sys.argv[1])
    torch.manual_seed(0)
    image = Image.open(asset_path("part_scratch.jpg")).convert("RGB")
    vision, vision_candidates = vision_tokens(ckpt, image, sys.argv[3])
    result = {
        "machine": platform.machine(),
        "torch": torch.__version__,
        "cpu": cpu.cpu_model(),
        "cpu_flags": sorted(cpu.cpu_flags()),
        "int8_kernel": quant.default_kernel(),
        "int8_simd": quant.kernels_simd(),
        "int4_simd": int(bindings.int4_library().ei_int4_simd()) if bindings.int4_library() is not None else None,
        "reference": reference_and_split(ckpt, image, vision["fp32"]),
        "logits": format_logits(ckpt),
        "vision": {"shape": list(vision["fp32"].shape)} | {w: t.flatten().tolist() for w, t in vision.items()},
        "vision_auto_candidates": vision_candidates,
    }
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
