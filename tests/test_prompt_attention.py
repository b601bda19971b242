"""Prompt attention of packed stages (models/kernels/prompt_attention.c): bf16 dot products on CPUs with
AVX512-BF16, fp32 on CPUs with AVX2 + FMA; elsewhere the kernel declines and SDPA runs, which is what these tests
then check. Each test holds the path this CPU builds to what that path promises."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import cosine_similarity, scaled_dot_product_attention

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kernels import bindings, ops
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped

needs_kernels = pytest.mark.skipif(not bindings.available(), reason="no C compiler here to build the native kernels")


def chunk(t: int, past: int, heads: int, kv_heads: int, hd: int, seed: int = 0):
    """q [H, t, hd], keys/values [H_kv, past + t, hd] as the stage passes them: views of [rows, heads, hd]."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(t, heads, hd, generator=g) * 2).transpose(0, 1)
    k = (torch.randn(past + t, kv_heads, hd, generator=g) * 2).transpose(0, 1)
    v = torch.randn(past + t, kv_heads, hd, generator=g).transpose(0, 1)
    return q, k, v


def sdpa(q, k, v, past: int, scale: float) -> torch.Tensor:
    heads, t, hd = q.shape
    mask = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past)  # query i sees keys 0..past + i
    out = scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(t, heads * hd)


@needs_kernels
@pytest.mark.parametrize(
    ("t", "past", "heads", "kv_heads", "hd"),
    [(40, 0, 4, 2, 16), (37, 11, 4, 2, 16), (100, 0, 8, 2, 64), (3, 200, 16, 16, 128), (70, 63, 2, 2, 160)],
)
def test_a_prompt_chunk_attends_as_sdpa_does_within_its_precision(t, past, heads, kv_heads, hd):
    q, k, v = chunk(t, past, heads, kv_heads, hd)
    got = ops.prompt_attention(q, k, v, past, hd**-0.5)
    if not bindings.prompt_attention_fast():
        assert got is None  # neither instruction set here: the stage keeps SDPA
        return
    want = sdpa(q, k, v, past, hd**-0.5)
    assert got.shape == want.shape
    if bindings.prompt_attention_bf16():
        # q, k, v and the probabilities rounded to bf16 (2^-9 relative each), scores and sums in fp32
        assert ((got - want).norm() / want.norm()) < 1e-2
        assert cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.9999
    else:  # fp32 throughout: only the order of the sums differs from SDPA's
        assert ((got - want).norm() / want.norm()) < 1e-5


@needs_kernels
@pytest.mark.skipif(not bindings.prompt_attention_fast(), reason="neither AVX512-BF16 nor AVX2 + FMA on this CPU")
def test_each_query_sees_only_the_keys_up_to_its_position():
    t, past, heads, hd = 45, 7, 4, 32
    q, k, v = chunk(t, past, heads, heads, hd, seed=1)
    before = ops.prompt_attention(q, k, v, past, hd**-0.5)
    k2, v2 = k.clone(), v.clone()
    k2[:, past + 30 :] += 5.0  # keys and values from position past + 30 on change
    v2[:, past + 30 :] -= 3.0
    after = ops.prompt_attention(q, k2, v2, past, hd**-0.5)
    assert torch.equal(after[:30], before[:30])  # rows 0..29 sit at positions up to past + 29
    assert not torch.equal(after[30], before[30])


@needs_kernels
@pytest.mark.parametrize(("t", "heads", "hd"), [(576, 16, 64), (50, 4, 32), (7, 2, 16)])
def test_without_the_causal_mask_every_query_attends_over_all_keys_as_sdpa_does(t, heads, hd):
    """The vision tower's patches (576 at 384 px, 16 heads of 64 in SigLIP-L) see each other both ways."""
    q, k, v = chunk(t, 0, heads, heads, hd, seed=2)
    got = ops.prompt_attention(q, k, v, 0, hd**-0.5, causal=False)
    if not bindings.prompt_attention_fast():
        assert got is None
        return
    want = scaled_dot_product_attention(q[None], k[None], v[None], scale=hd**-0.5)[0].transpose(0, 1).reshape(t, -1)
    bound = 1e-2 if bindings.prompt_attention_bf16() else 1e-5  # as for causal chunks above
    assert ((got - want).norm() / want.norm()) < bound
    causal = ops.prompt_attention(q, k, v, 0, hd**-0.5)
    assert ((causal[:-1] - want[:-1]).norm() / want[:-1].norm()) > 0.1  # the mask really is off
    assert ((causal[-1] - want[-1]).norm() / want[-1].norm()) < bound  # the last query saw every key either way


@needs_kernels
def test_shapes_it_does_not_take_go_back_to_sdpa():
    q, k, v = chunk(9, 0, 4, 4, 24)  # head_dim not a multiple of 16
    assert ops.prompt_attention(q, k, v, 0, 24**-0.5) is None
    q, k, v = chunk(9, 0, 4, 4, 32)
    assert ops.prompt_attention(q.half(), k.half(), v.half(), 0, 32**-0.5) is None  # fp32 only
    assert ops.prompt_attention(q, k[:, :5], v[:, :5], 0, 32**-0.5) is None  # keys must be past + t


@needs_kernels
def test_packed_stages_run_prompts_through_it_and_fp32_stages_never(tiny_checkpoint, monkeypatch):
    ckpt = open_checkpoint(tiny_checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    assert not StageExecutor(load_stage(ckpt, whole, "fp32")).prompt_kernel  # SDPA: what generate() runs
    ex = StageExecutor(load_stage(ckpt, whole, "int8"))
    assert ex.prompt_kernel == bindings.prompt_attention_fast()
    calls = []
    real = ops.prompt_attention

    def counted(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(ops, "prompt_attention", counted)
    ids = torch.randint(10, 500, (40,), generator=torch.Generator().manual_seed(3))
    got = ex.step([("a", StepInput(0, input_ids=ids))])[0].logits
    ex.prompt_kernel = False
    want = ex.step([("b", StepInput(0, input_ids=ids))])[0].logits
    if not bindings.prompt_attention_fast():
        assert calls == []
        return
    assert calls == [True] * ckpt.num_layers  # every layer's prompt attention, then none with it off
    # the tiny model (init std 0.3) is chaotic: small differences grow layer by layer; 1.3B: bench/NOTES.md
    assert cosine_similarity(got, want, dim=0) > 0.995
