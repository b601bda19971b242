"""Stages and the vision node on a CUDA device (marked `gpu`: skipped with the reason where torch sees no CUDA
device; tools/gpu_check.sh runs them on a GPU box). The CPU runs of the same code are tests/test_stage_device.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeinspect.models.checkpoint import load_reference_model, open_checkpoint
from edgeinspect.models.pipeline import LocalPipeline, Request, even_split, load_local_stages

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=f"needs a CUDA device; torch {torch.__version__} sees none (run tools/gpu_check.sh on a GPU box)",
    ),
]

NEW_TOKENS = 64
CUDA = torch.device("cuda", 0)


def _prompt(ckpt, length=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, ckpt.text_config.vocab_size, (length,), generator=g).tolist()
    return [i if i != ckpt.config.image_token_id else 1 for i in ids]


def _generate(ckpt, stages, weights, device, new=NEW_TOKENS, graphs=True):
    executors = load_local_stages(ckpt, even_split(ckpt.num_layers, stages), weights, device)
    for ex in executors:
        ex.cuda_graphs = graphs
        if device.type == "cuda":
            ex.use_path("device")  # rebuilt: graphs on or off
    pipe = LocalPipeline(executors, preallocate=True)
    reqs = {"a": Request(_prompt(ckpt), max_new_tokens=new), "b": Request(_prompt(ckpt, 9, 1), max_new_tokens=new)}
    return pipe.generate(reqs, keep_logits=True)


def _max_diff(x, y):
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(x.logits, y.logits, strict=True))


@pytest.mark.parametrize("stages", [2, 3])
def test_split_cuda_stages_equal_one_cuda_stage(tiny_checkpoint, stages):
    ckpt = open_checkpoint(tiny_checkpoint)
    one, split = _generate(ckpt, 1, "bf16", CUDA), _generate(ckpt, stages, "bf16", CUDA)
    for sid in one:
        assert split[sid].tokens == one[sid].tokens
        assert _max_diff(split[sid], one[sid]) == 0.0  # bf16 hidden states cross the host boundary exactly


def test_cuda_graph_decode_equals_the_eager_static_step(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    eager, graphs = _generate(ckpt, 2, "bf16", CUDA, graphs=False), _generate(ckpt, 2, "bf16", CUDA)
    for sid in eager:
        assert graphs[sid].tokens == eager[sid].tokens
        assert _max_diff(graphs[sid], eager[sid]) == 0.0


def test_cuda_bf16_stage_tokens_equal_generate_on_the_gpu_or_part_at_a_near_tie(tiny_checkpoint):
    """64 greedy tokens of one CUDA bf16 stage vs transformers' generate() in bf16 on the same GPU; where they part,
    the reference's top two logits must have been within the verify bound's tie margin (bf16 sums differ)."""
    ckpt = open_checkpoint(tiny_checkpoint)
    model = load_reference_model(ckpt).to(CUDA, torch.bfloat16)
    ids = _prompt(ckpt)
    out = model.generate(
        input_ids=torch.tensor([ids], device=CUDA),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    ref_tokens = out.sequences[0, len(ids) :].tolist()
    got = _generate(ckpt, 1, "bf16", CUDA)["a"]
    scale = max(lg.abs().max().item() for lg in out.logits)
    for i, (a, b) in enumerate(zip(got.tokens, ref_tokens, strict=False)):
        if a != b:
            top2 = out.logits[i][0].float().topk(2).values
            margin = (top2[0] - top2[1]).item()
            assert margin <= 0.02 * scale, f"token {i}: {a} != {b} at a margin of {margin} (scale {scale})"
            break


def test_fp32_cuda_stage_matches_cpu_fp32_within_the_fp32_bound(tiny_checkpoint):
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (TF32 would be a format of its own)
    torch.backends.cudnn.allow_tf32 = False
    ckpt = open_checkpoint(tiny_checkpoint)
    gpu = _generate(ckpt, 2, "fp32", CUDA, new=24)
    cpu = _generate(ckpt, 2, "fp32", torch.device("cpu"), new=24)
    for sid in cpu:
        assert gpu[sid].tokens == cpu[sid].tokens
        scale = max(lg.abs().max().item() for lg in cpu[sid].logits)
        assert _max_diff(gpu[sid], cpu[sid]) <= 1e-4 * scale


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_packed_formats_run_on_cuda_or_are_refused_with_the_reason(tiny_checkpoint, weights):
    from edgeinspect.errors import InvalidInput
    from edgeinspect.models.stage.device import format_refusal

    ckpt = open_checkpoint(tiny_checkpoint)
    reason = format_refusal(weights, CUDA)
    if reason:
        with pytest.raises(InvalidInput, match="cannot|needs|no CUDA"):
            _generate(ckpt, 1, weights, CUDA, new=4)
        pytest.skip(f"{weights} refused on this GPU: {reason}")
    got = _generate(ckpt, 2, weights, CUDA, new=8)
    ref = _generate(ckpt, 2, "bf16", CUDA, new=8)
    cos = nn.functional.cosine_similarity(got["a"].logits[0].float(), ref["a"].logits[0].float(), dim=0).item()
    assert cos > (0.9 if weights == "int8" else 0.5), cos  # the tiny checkpoint amplifies; real sizes: bench


@pytest.mark.parametrize("weights", ["fp16", "bf16"])
def test_cuda_vision_tokens_match_cpu_fp32(tiny_checkpoint, part_images, weights):
    from edgeinspect.models.vision import ImagePreprocessor
    from edgeinspect.services.vision.backends import TorchBackend

    ckpt = open_checkpoint(tiny_checkpoint)
    pixels = ImagePreprocessor(ckpt)(part_images[1])
    ref = TorchBackend(ckpt, "fp32")(pixels)
    got = TorchBackend(ckpt, weights, CUDA)(pixels)
    assert got.device.type == "cpu" and got.dtype == torch.float32
    assert nn.functional.cosine_similarity(got, ref, dim=-1).min().item() >= 0.99


@pytest.mark.parametrize("kind", ["cuda", "tensorrt"])
def test_onnxruntime_gpu_providers_match_cpu_fp32(tiny_checkpoint, part_images, tmp_path, kind):
    from edgeinspect.models.onnx_export import export_vision_onnx
    from edgeinspect.models.vision import ImagePreprocessor
    from edgeinspect.services.vision.backends import OnnxBackend, TorchBackend
    from edgeinspect.services.vision.gpu import PROVIDERS, available_providers, provider_list

    if PROVIDERS[kind] not in available_providers():
        pytest.skip(f"{PROVIDERS[kind]} is not among onnxruntime's providers {available_providers()}")
    ckpt = open_checkpoint(tiny_checkpoint)
    path = tmp_path / "vision.onnx"
    export_vision_onnx(ckpt.path, path)
    pixels = ImagePreprocessor(ckpt)(part_images[1])
    ref = TorchBackend(ckpt, "fp32")(pixels)
    backend = OnnxBackend(path, ckpt.fingerprint, 0, provider_list(kind, CUDA, path, ckpt.fingerprint))
    assert backend.session.get_providers()[0] == PROVIDERS[kind]
    assert nn.functional.cosine_similarity(backend(pixels), ref, dim=-1).min().item() >= 0.99


def test_kv_budget_comes_from_free_device_memory():
    from edgeinspect.models.device import free_bytes
    from edgeinspect.services.stage.admission import kv_budget_bytes

    free = free_bytes(CUDA)
    assert free and free > 0
    assert kv_budget_bytes(1 << 50, free, 0.9) == int(free * 0.9)
