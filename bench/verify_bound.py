"""Calibration of `edgeinspect verify`'s rounding bound (edgeinspect/stack/verify.py WIRE_AMPLIFICATION and
WEIGHT_AMPLIFICATION) on the tiny checkpoints.

The cluster is models.pipeline.LocalPipeline: the wire codec round-trips the visual tokens and the hidden states at
every stage boundary, exactly as the gRPC path does; the stages run the weight format. Its greedy tokens are fed
teacher-forced through verify's own Reference, and per format we record max |dz| / rms(z) per unit error (dz: the
cluster's logits - the reference's, per position), the flips (the cluster's token not the reference's argmax) and
their largest margin in rms. A reference of another checkpoint (seed 7) gives the margins a wrong model shows.

    .venv/bin/python bench/verify_bound.py [--tokens 200] [--out bench/results/verify_bound.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, as the other benchmarks do
from common import load_average, machine_info, write_json  # noqa: E402

from edgeinspect.assets import asset_path  # noqa: E402
from edgeinspect.models.pipeline import LocalPipeline, Request, codec_boundary, even_split, load_local_stages  # noqa: E402
from edgeinspect.models.tiny import TinySpec, make_tiny  # noqa: E402
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower  # noqa: E402
from edgeinspect.stack.verify import UNIT_ERROR, Reference, margin_bound  # noqa: E402

# tests/conftest.py's TINY and TINY_MHA
SPECS = {
    "tiny": TinySpec(),
    "tiny-mha": TinySpec(layers=6, hidden=96, heads=4, kv_heads=4, intermediate=192, image_size=48, seed=1),
}
IMAGES = ["part_ok.jpg", "part_scratch.jpg", "part_dent.jpg", "part_missing_hole.jpg"]
PROMPT = "Inspect the part in the image."
# (wire, weights, stages): the wire alone over 1-5 stages, then each weight format alone
CONFIGS = [(w, "fp32", s) for w in ("fp16", "int8") for s in (1, 2, 3, 5)] + [
    ("fp32", w, 2) for w in ("fp16", "bf16", "int8")
]


def run_config(ref: Reference, wire: str, weights: str, stages: int, tokens: int) -> dict:
    from PIL import Image

    tower, pre = load_vision_tower(ref.ckpt), ImagePreprocessor(ref.ckpt)
    boundary = codec_boundary(wire)
    pipe = LocalPipeline(load_local_stages(ref.ckpt, even_split(ref.ckpt.num_layers, stages), weights), boundary)
    worst, flips, flip_margin, n = 0.0, 0, 0.0, 0
    for name in IMAGES:
        ids, pixels = ref.inputs(asset_path(name).read_bytes(), PROMPT)
        with torch.inference_mode():
            visual = boundary(tower(pre(Image.open(asset_path(name)).convert("RGB")))[0])  # [N_img, vision_hidden]
            gen = pipe.generate({"s": Request(ids, visual, max_new_tokens=tokens)}, keep_logits=True)["s"]
            z = ref.model.lm_head(ref.hidden(ids, pixels, gen.tokens)).float()  # [n, vocab]
        rms = z.pow(2).mean(dim=1).sqrt()  # [n]
        worst = max(worst, ((torch.stack(gen.logits) - z).abs().max(dim=1).values / rms).max().item())
        tok = torch.tensor(gen.tokens)
        top = z.max(dim=1)
        margin = (top.values - z.gather(1, tok[:, None])[:, 0]) / rms  # [n]
        flips += int((tok != top.indices).sum())
        flip_margin = max(flip_margin, margin.max().item())
        n += len(gen.tokens)
    unit = UNIT_ERROR[wire] + UNIT_ERROR[weights]
    return {
        "wire": wire,
        "weights": weights,
        "stages": stages,
        "tokens": n,
        "max_dz_over_rms": round(worst, 5),
        "per_unit_error": round(worst / unit, 1),
        "flips": flips,
        "worst_flipped_margin_rms": round(flip_margin, 5),
        "verify_bound_rms": round(margin_bound(wire, weights), 4),
    }


def wrong_model(good: Reference, bad: Reference, tokens: int) -> dict:
    """Margins (in rms) of a healthy fp32 cluster's tokens in the logits of another checkpoint's reference."""
    from PIL import Image

    tower, pre = load_vision_tower(good.ckpt), ImagePreprocessor(good.ckpt)
    pipe = LocalPipeline(load_local_stages(good.ckpt, even_split(good.ckpt.num_layers, 2)))
    rel: list[float] = []
    for name in IMAGES:
        ids, _ = good.inputs(asset_path(name).read_bytes(), PROMPT)
        ids_bad, pixels_bad = bad.inputs(asset_path(name).read_bytes(), PROMPT)
        assert ids == ids_bad, "the seed-7 checkpoint should share the tokenizer"
        with torch.inference_mode():
            visual = tower(pre(Image.open(asset_path(name)).convert("RGB")))[0]
        gen = pipe.generate({"s": Request(ids, visual, max_new_tokens=tokens)})["s"]
        tf = bad.teacher_forced(ids, pixels_bad, gen.tokens)
        rel += [m / r for m, r in zip(tf.margin, tf.rms, strict=True)]
    rel.sort()
    q = {f"q{int(f * 100)}": round(rel[int(f * (len(rel) - 1))], 3) for f in (0.05, 0.1, 0.5, 0.9)}
    return {"positions": len(rel), "argmax_positions": sum(1 for x in rel if x <= 0), **q}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200, help="greedy tokens per image")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = machine_info(bandwidth=False)
    rows, wrong = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        refs = {name: Reference(make_tiny(Path(tmp) / name, spec)) for name, spec in SPECS.items()}
        for name, ref in refs.items():
            for wire, weights, stages in CONFIGS:
                row = {"checkpoint": name, **run_config(ref, wire, weights, stages, args.tokens)}
                print(row, flush=True)
                rows.append(row)
        wrong = wrong_model(refs["tiny"], Reference(make_tiny(Path(tmp) / "seed7", TinySpec(seed=7))), args.tokens)
        print("wrong model (seed 7):", wrong, flush=True)
    worst = {
        kind: max(r["per_unit_error"] for r in rows if (r["weights"] == "fp32") == (kind == "wire"))
        for kind in ("wire", "weights")
    }
    payload = {"machine": info, "loadavg_end": load_average(), "tokens_per_image": args.tokens, "images": IMAGES,
               "rows": rows, "worst_per_unit_error": worst, "wrong_model_margin_rms": wrong}  # fmt: skip
    print("worst max|dz|/rms per unit error:", worst)
    print("wrote", write_json("verify_bound", payload, args.out))


if __name__ == "__main__":
    main()
