"""Decoder split benchmark on the 1.3B-shaped checkpoint: what cutting the language model into stages costs.

Per weight dtype it measures time per decoder layer (decode with a ~600-token cache, and prefill of 600 tokens),
stage 0's embedding (+ the aligner on 576 visual tokens), the last stage's norm + lm_head, and decode ms/token of
the monolith (one StageExecutor over every layer; and transformers' generate() of the reference model, the user
baseline) against an in-process 2-stage split with fp16 at the boundary. Weight memory per stage is counted in
parameter bytes and as the RSS of a subprocess that loads that stage alone.

    .venv/bin/python bench/stage_split.py [--checkpoint PATH] [--weights fp32,bf16] [--tokens 16] [--repeats 3]

Decode starts from a synthetic 600-position KV cache (random keys/values in the stage's dtype) instead of a real
prefill: decode cost does not depend on the cached values, and a bf16 prefill of 600 tokens takes many minutes on
a CPU without bf16 matmul instructions. The split's stages share the monolith's parameter tensors (same compute,
no second copy of the weights); memory per stage is measured separately, each stage loaded alone from disk.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import RESULTS_DIR, load_average, machine_info, median_ms, require_checkpoint, target, write_json
from torch import nn

from edgeinspect.models.checkpoint import Checkpoint, load_reference_model, open_checkpoint, torch_dtype
from edgeinspect.models.pipeline import LocalPipeline, codec_boundary, even_split
from edgeinspect.models.stage import LayerRange, StageExecutor, StageModule, StepInput, load_stage

DEFAULT_CKPT = Path(__file__).resolve().parents[1] / "var" / "checkpoints" / "deepseek-vl-1.3b"
SID = "bench"
RATIO_TARGET = 0.97  # monolith ms/token over split ms/token: the split may cost at most 3%
IMAGE_TOKENS = 576  # DeepSeek-VL 1.3B: (384 / 16)^2 SigLIP patches per image


def random_prompt(ckpt: Checkpoint, n: int, seed: int = 0) -> torch.Tensor:
    """[n] int64 random ids above the special tokens, never the image placeholder (no image in the LM bench)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, ckpt.text_config.vocab_size, (n,), generator=g)
    return torch.where(ids == ckpt.config.image_token_id, ids + 1, ids)


def synthetic_kv(ckpt: Checkpoint, length: int, dtype: torch.dtype, seed: int = 0) -> list[tuple]:
    """Per layer (keys, values), each [1, kv_heads, length, head_dim]."""
    cfg = ckpt.text_config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    shape = (1, cfg.num_key_value_heads, length, head_dim)
    return [
        (torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype))
        for _ in range(cfg.num_hidden_layers)
    ]


def install_cache(executor: StageExecutor, kv: list[tuple]) -> int:
    """Opens session SID on the executor holding `kv` for its own layers; returns the cached length."""
    return executor.install(SID, kv, spare=64).length  # copies: the snapshot stays intact for the next run


def shared_split(mono: StageModule, ckpt: Checkpoint, ranges: list[LayerRange]) -> list[StageModule]:
    """Stages over the monolith's own modules: the split's compute with no second copy of the weights.

    Modules, not parameter tensors, are shared: packed linears (int8, fbgemm fp16) hold no nn.Parameter.
    """
    stages = []
    for r in ranges:
        module = StageModule(ckpt, r)
        module.layers = nn.ModuleList(mono.layers[r.start : r.end])
        for part in ("embed_tokens", "aligner", "norm", "lm_head"):
            if getattr(module, part) is not None:
                setattr(module, part, getattr(mono, part))
        module.weights = mono.weights
        module.rotary_emb.to(torch.float32)
        stages.append(module.eval())
    return stages


def param_bytes(module: nn.Module | None) -> int:
    """Parameter bytes, counting packed linears (int8, fbgemm fp16: no nn.Parameter) by their weight_bytes()."""
    if module is None:
        return 0
    packed = sum(m.weight_bytes() for m in module.modules() if hasattr(m, "weight_bytes"))
    return packed + sum(p.numel() * p.element_size() for p in module.parameters())


class SpanTimer:
    """Wall time (seconds) from a start module's call to an end module's return, per name, via forward hooks.

    A decoder layer is timed from its input_layernorm to its mlp: the first and last thing it runs whether the
    executor calls the LlamaDecoderLayer itself or drives its submodules one by one.
    """

    def __init__(self, spans: dict[str, tuple[nn.Module, nn.Module]]):
        self.spans = spans
        self.times: dict[str, list[float]] = {name: [] for name in spans}
        self._started: dict[str, float] = {}
        self._handles: list = []

    def __enter__(self) -> SpanTimer:
        for name, (first, last) in self.spans.items():
            self._handles.append(first.register_forward_pre_hook(self._pre(name)))
            self._handles.append(last.register_forward_hook(self._post(name)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()

    def _pre(self, name):
        def hook(_mod, _args):
            self._started[name] = time.perf_counter()

        return hook

    def _post(self, name):
        def hook(_mod, _args, _out):
            self.times[name].append(time.perf_counter() - self._started[name])

        return hook


def decode_run(pipe: LocalPipeline, kv: list[tuple], first_token: int, tokens: int) -> list[float]:
    """Greedy decode of `tokens` steps after the cached positions; seconds per step."""
    pos = 0
    for stage in pipe.stages:
        pos = install_cache(stage, kv)
    token, times = first_token, []
    try:
        for _ in range(tokens):
            t0 = time.perf_counter()
            logits = pipe.forward([(SID, StepInput(position=pos, input_ids=torch.tensor([token])))])[0]
            token = int(torch.argmax(logits))
            times.append(time.perf_counter() - t0)
            pos += 1
    finally:
        for stage in pipe.stages:
            stage.release(SID)
    return times


def layer_prefill_s(mono: StageModule, ckpt: Checkpoint, prompt_tokens: int, budget_s: float) -> list[float]:
    """One middle decoder layer (a 1-layer stage) prefilling `prompt_tokens` hidden states; repeats within budget."""
    cfg = ckpt.text_config
    one = StageExecutor(shared_split(mono, ckpt, [LayerRange(1, 2, cfg.num_hidden_layers)])[0])
    hidden = torch.randn(prompt_tokens, cfg.hidden_size).to(one.dtype)  # [T, D]
    times, t_start = [], time.perf_counter()
    while len(times) < 3 and (not times or time.perf_counter() - t_start < budget_s):
        t0 = time.perf_counter()
        one.step([(SID, StepInput(position=0, hidden=hidden))])
        times.append(time.perf_counter() - t0)
        one.release(SID)
    return times


@torch.inference_mode()
def edge_costs(mono: StageModule, ckpt: Checkpoint, prompt: torch.Tensor) -> dict:
    """Stage 0's embedding (decode and prefill) and aligner, the last stage's norm + lm_head, the fp16 boundary."""
    cfg = ckpt.text_config
    dtype = mono.embed_tokens.weight.dtype
    one_id = prompt[-1:]  # [1]
    visual = torch.randn(IMAGE_TOKENS, mono.aligner.linear1.in_features).to(dtype)  # [576, vision_hidden]
    last = torch.randn(1, 1, cfg.hidden_size).to(dtype)  # [1, 1, D]
    hop = torch.randn(1, cfg.hidden_size)  # [1, D]: one decode step's hidden state on the wire
    boundary = codec_boundary("fp16")
    slow = dtype != torch.float32  # bf16 matmuls fall back to slow kernels on AVX2-only CPUs
    return {
        "embed_decode_ms": median_ms(lambda: mono.embed_tokens(one_id), 200),
        "embed_prefill_ms": median_ms(lambda: mono.embed_tokens(prompt), 20),
        "aligner_576_ms": median_ms(lambda: mono.aligner(visual), 1 if slow else 5),
        "norm_lm_head_decode_ms": median_ms(lambda: mono.lm_head(mono.norm(last)), 5 if slow else 20),
        "fp16_boundary_decode_ms": median_ms(lambda: boundary(hop), 200),
    }


def reference_decode_s(ckpt: Checkpoint, weights: str, prompt: torch.Tensor, kv: list[tuple], tokens: int) -> dict:
    """transformers' generate() of the whole reference model, continuing the same synthetic cache; s per step."""
    from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

    t0 = time.perf_counter()
    model = load_reference_model(ckpt, weights)
    load_s = time.perf_counter() - t0
    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())  # once per generated token, right after its forward
            return scores

    cache = DynamicCache(config=ckpt.text_config)
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    ids = torch.cat([prompt, prompt[-1:]]).unsqueeze(0)  # [1, T+1]: generate() runs only the uncached last one
    model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        cache=cache,
        max_new_tokens=tokens + 1,
        min_new_tokens=tokens + 1,  # random weights may pick EOS early; the timing needs every step
        do_sample=False,
        logits_processor=LogitsProcessorList([Stamp()]),
    )
    out = {"load_s": round(load_s, 2), "param_bytes": param_bytes(model)}
    del model, cache
    gc.collect()
    return out | {"step_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)]}


def summary_ms(times_s: list[float]) -> dict:
    ms = [t * 1e3 for t in times_s]
    return {"median": round(statistics.median(ms), 2), "min": round(min(ms), 2), "max": round(max(ms), 2), "n": len(ms)}


def bench_weights(ckpt: Checkpoint, weights: str, args: argparse.Namespace) -> dict:
    """Every timing for one weight dtype; the monolith, the split and the reference run in this same call."""
    n_layers = ckpt.num_layers
    dtype = torch_dtype(weights)
    print(f"[{weights}] loading the monolith (all {n_layers} layers)", flush=True)
    t0 = time.perf_counter()
    mono_mod = load_stage(ckpt, LayerRange(0, n_layers, n_layers), weights)
    load_s = time.perf_counter() - t0
    ranges = even_split(n_layers, 2)
    split_mods = shared_split(mono_mod, ckpt, ranges)
    mono = LocalPipeline([StageExecutor(mono_mod)])
    split = LocalPipeline([StageExecutor(m) for m in split_mods], codec_boundary("fp16"))
    prompt = random_prompt(ckpt, args.prompt_tokens)
    kv = synthetic_kv(ckpt, args.prompt_tokens, dtype)
    first = int(prompt[-1])

    print(f"[{weights}] per-layer decode profile (monolith, {args.tokens} tokens; also its warm-up)", flush=True)
    layers = {f"layer {i}": (layer.input_layernorm, layer.mlp) for i, layer in enumerate(mono_mod.layers)}
    with SpanTimer(layers) as timer:
        decode_run(mono, kv, first, args.tokens)
    per_layer = [statistics.median(t) for t in timer.times.values()]
    decode_run(split, kv, first, 2)  # warm-up of the split's own modules

    runs: dict[str, list[float]] = {"monolith": [], "split": []}
    repeat_ratios = []
    for r in range(args.repeats):
        order = [("monolith", mono), ("split", split)]
        medians = {}
        for name, pipe in order if r % 2 == 0 else order[::-1]:  # alternate so drifting load hits both alike
            print(f"[{weights}] repeat {r + 1}/{args.repeats}: {name}", flush=True)
            times = decode_run(pipe, kv, first, args.tokens)
            runs[name].extend(times)
            medians[name] = statistics.median(times)
        repeat_ratios.append(round(medians["monolith"] / medians["split"], 4))

    print(f"[{weights}] one layer prefilling {args.prompt_tokens} tokens; stage edges", flush=True)
    prefill = layer_prefill_s(mono_mod, ckpt, args.prompt_tokens, budget_s=20.0)
    edges = edge_costs(mono_mod, ckpt, prompt)
    stage_bytes = [
        {
            "layers": str(r),
            "param_bytes": param_bytes(m),
            "layer_bytes": param_bytes(m.layers),
            "embed_aligner_bytes": param_bytes(m.embed_tokens) + param_bytes(m.aligner),
            "norm_lm_head_bytes": param_bytes(m.norm) + param_bytes(m.lm_head),
        }
        for r, m in zip(ranges, split_mods, strict=True)
    ]
    mono_bytes = param_bytes(mono_mod)
    del mono, split, mono_mod, split_mods
    gc.collect()

    reference = None
    if not args.no_reference:
        print(f"[{weights}] transformers generate() on the reference model ({args.tokens} tokens)", flush=True)
        reference = reference_decode_s(ckpt, weights, prompt, kv, args.tokens)
        reference["decode_ms_per_token"] = summary_ms(reference.pop("step_s"))

    mono_ms, split_ms = summary_ms(runs["monolith"]), summary_ms(runs["split"])
    return {
        "monolith_load_s": round(load_s, 2),
        "decode_ms_per_token": {"monolith": mono_ms, "split_2_fp16": split_ms},
        "reference_generate": reference,
        "monolith_over_split": target(mono_ms["median"] / split_ms["median"], RATIO_TARGET),
        "monolith_over_split_per_repeat": repeat_ratios,
        "layer_decode_ms": {
            "median": round(statistics.median(per_layer) * 1e3, 3),
            "min": round(min(per_layer) * 1e3, 3),
            "max": round(max(per_layer) * 1e3, 3),
            "per_layer": [round(t * 1e3, 3) for t in per_layer],
        },
        "layer_prefill_ms": summary_ms(prefill) | {"tokens": args.prompt_tokens},
        "edges": edges,
        "param_bytes": {"monolith": mono_bytes, "stages": stage_bytes},
    }


def proc_status() -> dict[str, int]:
    """VmRSS, VmHWM (peak), RssAnon and RssFile of this process, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024  # kB
    return out


def child_rss(ckpt_path: Path, start: int, end: int, weights: str) -> None:
    """Subprocess body: load one stage alone and print its memory as JSON on stdout."""
    before = proc_status()  # torch and transformers already imported: the runtime's own footprint
    ckpt = open_checkpoint(ckpt_path)
    module = load_stage(ckpt, LayerRange(start, end, ckpt.num_layers), weights)
    gc.collect()
    after = proc_status()
    print(json.dumps({"before": before, "after": after, "param_bytes": param_bytes(module)}))


def stage_rss(ckpt: Checkpoint, weights: str) -> list[dict]:
    """RSS of each 2-split stage and of the monolith, each loaded alone in a fresh subprocess."""
    n = ckpt.num_layers
    rows = []
    for r in [*even_split(n, 2), LayerRange(0, n, n)]:
        cmd = [sys.executable, __file__, "--checkpoint", str(ckpt.path), "--weights", weights]
        cmd += ["--child-rss", str(r.start), str(r.end)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        child = json.loads(done.stdout.strip().splitlines()[-1])
        before, after = child["before"], child["after"]
        rows.append(
            {
                "layers": str(r),
                "param_bytes": child["param_bytes"],
                "rss_bytes": after["VmRSS"],
                "rss_added_by_load_bytes": after["VmRSS"] - before["VmRSS"],
                "peak_rss_bytes": after["VmHWM"],
                "rss_anon_bytes": after["RssAnon"],
                "rss_file_bytes": after["RssFile"],
                "runtime_rss_before_load_bytes": before["VmRSS"],
            }
        )
    return rows


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--checkpoint",
        type=Path,
        default=Path(os.environ.get("EDGEINSPECT_BENCH_CKPT", DEFAULT_CKPT)),
        help="the 1.3B-shaped checkpoint (env EDGEINSPECT_BENCH_CKPT; default var/checkpoints/deepseek-vl-1.3b)",
    )
    ap.add_argument("--weights", default="fp32,bf16", help="comma-separated weight dtypes to measure")
    ap.add_argument("--prompt-tokens", type=int, default=600, help="cached positions before decode; prefill length")
    ap.add_argument("--tokens", type=int, default=16, help="decode steps per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="alternating monolith/split runs per dtype")
    ap.add_argument("--no-reference", action="store_true", help="skip transformers' generate() baseline")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "stage_split.json", help="JSON output path")
    ap.add_argument("--child-rss", nargs=2, type=int, metavar=("START", "END"), help=argparse.SUPPRESS)
    return ap.parse_args()


def _fmt_rows(r: dict, mem: list[dict] | None) -> list[str]:
    """One dtype's column of the README table, in the order of TABLE_ROWS."""
    mib = 2**20
    ref = r["reference_generate"]
    ratio, layer, edge = r["monolith_over_split"], r["layer_decode_ms"], r["edges"]
    stages = [s["param_bytes"] for s in r["param_bytes"]["stages"]] + [r["param_bytes"]["monolith"]]
    return [
        "-" if ref is None else f"{ref['decode_ms_per_token']['median']:.1f}",
        f"{r['decode_ms_per_token']['monolith']['median']:.1f}",
        f"{r['decode_ms_per_token']['split_2_fp16']['median']:.1f}",
        f"**{ratio['value']:.3f}** ({'met' if ratio['met'] else 'NOT met'})",
        ", ".join(f"{x:.3f}" for x in r["monolith_over_split_per_repeat"]),
        f"{layer['median']:.1f} ({layer['min']:.1f}-{layer['max']:.1f})",
        f"{r['layer_prefill_ms']['median']:,.0f} (n={r['layer_prefill_ms']['n']})",
        f"{edge['embed_decode_ms']:.3f}",
        f"{edge['embed_prefill_ms']:.2f} / {edge['aligner_576_ms']:,.1f}",
        f"{edge['norm_lm_head_decode_ms']:.1f}",
        f"{edge['fp16_boundary_decode_ms']:.3f}",
        " / ".join(f"{b / mib:,.0f}" for b in stages),
        "-" if mem is None else " / ".join(f"{m['rss_bytes'] / mib:,.0f}" for m in mem),
        "-" if mem is None else " / ".join(f"{m['peak_rss_bytes'] / mib:,.0f}" for m in mem),
    ]


TABLE_ROWS = [
    "decode ms/token, transformers generate() (user baseline)",
    "decode ms/token, monolith (1 stage, all {layers} layers)",
    "decode ms/token, 2-stage split, fp16 boundary",
    "**monolith / split** (target >= 0.97)",
    "monolith / split per repeat",
    "decoder layer at decode ({tokens}-token cache), ms (median of {layers} layers; min-max)",
    "decoder layer prefilling {tokens} tokens, ms",
    "stage 0 embedding per decode step, ms",
    "stage 0 embedding of {tokens} ids / aligner on 576 visual tokens, ms",
    "last stage norm + lm_head per decode step, ms",
    "fp16 boundary encode+decode per decode step, ms",
    "parameters MiB: stage 0 / stage 1 / monolith",
    "RSS MiB, loaded alone: stage 0 / stage 1 / monolith",
    "peak RSS MiB while loading: stage 0 / stage 1 / monolith",
]


def markdown_table(result: dict) -> str:
    """The README table: one column per weight dtype."""
    cols = list(result["by_weights"])
    cells = [_fmt_rows(result["by_weights"][w], result["memory"].get(w)) for w in cols]
    lines = ["| figure | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    sizes = {"layers": result["meta"]["layers"], "tokens": result["meta"]["prompt_tokens"]}
    for i, label in enumerate(TABLE_ROWS):
        lines.append(f"| {label.format(**sizes)} | " + " | ".join(c[i] for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    weights_list = [w.strip() for w in args.weights.split(",") if w.strip()]
    require_checkpoint(args.checkpoint, also="or point --checkpoint / EDGEINSPECT_BENCH_CKPT at one")
    if args.child_rss:
        child_rss(args.checkpoint, *args.child_rss, weights_list[0])
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ckpt = open_checkpoint(args.checkpoint)
    started = time.perf_counter()
    result: dict = {
        "meta": {
            "checkpoint": str(ckpt.path),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": machine_info(),
            "layers": ckpt.num_layers,
            "prompt_tokens": args.prompt_tokens,
            "decode_tokens_per_run": args.tokens,
            "repeats": args.repeats,
            "kv_cache": "synthetic random keys/values in the weight dtype (decode cost is value-independent)",
            "split": "2 stages, even_split, fp16 codec at the boundary, weights shared with the monolith",
        },
        "by_weights": {},
        "memory": {},
    }
    for w in weights_list:
        result["by_weights"][w] = bench_weights(ckpt, w, args)
        result["meta"][f"loadavg_after_{w}"] = load_average()
    for w in weights_list:
        print(f"[{w}] stage memory, each stage loaded alone in a subprocess", flush=True)
        result["memory"][w] = stage_rss(ckpt, w)
    result["targets"] = {f"monolith_over_split_{w}": r["monolith_over_split"] for w, r in result["by_weights"].items()}
    result["meta"]["loadavg_end"] = load_average()
    result["meta"]["runtime_s"] = round(time.perf_counter() - started, 1)
    path = write_json("stage_split", result, args.out)
    print(f"\nwrote {path} in {result['meta']['runtime_s']} s\n")
    print(markdown_table(result))


if __name__ == "__main__":
    main()
