"""Checkpoint loading reads only what a role needs; fingerprints are stable and content-sensitive."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from edgeinspect.errors import CheckpointError
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.sampling import SamplingParams, sample
from edgeinspect.models.stage import LayerRange, load_stage
from edgeinspect.models.tiny import TinySpec, make_tiny

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


def test_generated_checkpoint_is_a_plain_hugging_face_folder(tiny_checkpoint):
    names = {p.name for p in tiny_checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "processor_config.json"} <= names
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert config["model_type"] == "deepseek_vl"
    assert config["tie_word_embeddings"] is False
    ckpt = open_checkpoint(tiny_checkpoint)
    assert ckpt.lm_head_key == "lm_head.weight"


def test_fingerprint_is_stable_and_changes_with_the_weights(tiny_checkpoint, tmp_path):
    first = open_checkpoint(tiny_checkpoint).fingerprint
    assert open_checkpoint(tiny_checkpoint).fingerprint == first
    other = make_tiny(tmp_path / "other", TinySpec(seed=7))
    assert open_checkpoint(other).fingerprint != first
    # Same config and tokenizer, other weights: still a different fingerprint.
    assert open_checkpoint(other).tokenizer_fingerprint == open_checkpoint(tiny_checkpoint).tokenizer_fingerprint


def test_a_stage_loads_only_its_own_tensors(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    middle = load_stage(ckpt, LayerRange(1, 3, ckpt.num_layers))
    assert middle.embed_tokens is None and middle.lm_head is None and middle.aligner is None
    assert [layer.self_attn.layer_idx for layer in middle.layers] == [1, 2]
    first = load_stage(ckpt, LayerRange(0, 1, ckpt.num_layers))
    assert first.embed_tokens is not None and first.aligner is not None and first.lm_head is None
    last = load_stage(ckpt, LayerRange(4, 5, ckpt.num_layers), weights="bf16")
    assert last.lm_head.weight.dtype == torch.bfloat16 and last.embed_tokens is None


def test_missing_checkpoint_parts_give_clear_errors(tiny_checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        open_checkpoint(broken)


RSS_PROBE = textwrap.dedent("""
    import json, sys, gc
    from edgeinspect.models.checkpoint import open_checkpoint
    from edgeinspect.models.stage import LayerRange, load_stage
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    ckpt = open_checkpoint(sys.argv[1]); start, end = int(sys.argv[2]), int(sys.argv[3])
    gc.collect(); before = rss()
    stage = load_stage(ckpt, LayerRange(start, end, ckpt.num_layers))
    for p in stage.parameters():  # weights may be memory-mapped: touch every page so it is resident
        p.sum()
    gc.collect()
    print(json.dumps({"rss": rss() - before, "params": sum(p.numel() * p.element_size() for p in stage.parameters())}))
""")


def test_half_the_layers_take_about_half_the_weight_memory(tmp_path):
    # Large enough that layer weights dominate (8 layers x ~50 MB fp32); embeddings are small (tokenizer-sized vocab).
    spec = TinySpec(layers=8, hidden=1024, heads=8, kv_heads=8, intermediate=2816, initializer_range=0.02)
    path = make_tiny(tmp_path / "mid", spec)

    def measure(start, end):
        out = subprocess.run(
            [sys.executable, "-c", RSS_PROBE, str(path), str(start), str(end)],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    whole, half = measure(0, 8), measure(4, 8)
    print(f"resident weights: all 8 layers {whole['rss'] / 1e6:.0f} MB, layers 4-8 {half['rss'] / 1e6:.0f} MB")
    assert 0.4 <= half["params"] / whole["params"] <= 0.6
    assert 0.35 <= half["rss"] / whole["rss"] <= 0.65


def test_seeded_sampling_is_reproducible_and_top_p_narrows_to_greedy():
    logits = torch.randn(500, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=3)
    draws = [sample(logits, params, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert draws[0] == draws[1]
    tiny_p = SamplingParams(temperature=1.0, top_p=1e-6, seed=3)
    assert sample(logits, tiny_p, torch.Generator().manual_seed(3)) == int(logits.argmax())
