"""The vnni int8 linear: our GEMV for decode rows and torch._int_mm for prompts compute the same int8 arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeinspect.models import kernels
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.quant import Int8Linear, default_kernel, fbgemm_available, vnni_available
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

pytestmark = pytest.mark.skipif(kernels.q8_library() is None, reason="no C compiler here to build the native kernels")


def reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, two_pass: bool) -> torch.Tensor:
    """The kernel's arithmetic: rows quantized to int8 in fp32 as it does (x * 1/s, s = absmax / 127; a residual
    pass 254x finer), the sums in float64."""
    x = x.float()
    s1 = x.abs().amax(dim=1, keepdim=True) / 127
    q1 = torch.round(x * torch.where(s1 > 0, 1 / s1, 0)).clamp(-127, 127)
    y = (q1.double() @ q.double().T) * s1.double()
    if two_pass:
        s2 = s1 / 254
        q2 = torch.round((x - q1 * s1) * torch.where(s2 > 0, 1 / s2, 0)).clamp(-127, 127)
        y = y + (q2.double() @ q.double().T) * s2.double()
    return (y * scales.double()).float()


@pytest.mark.parametrize("two_pass", [False, True])
@pytest.mark.parametrize(("n", "k"), [(330, 2048), (7, 100), (64, 5632)])  # a partial last block, a tail of K
@pytest.mark.parametrize("rows", [1, 3, 9, 40])  # 1-8 rows (x2 passes <= 16): our GEMV; 40: torch._int_mm
def test_decode_rows_and_prompt_rows_compute_the_same_int8_arithmetic(n, k, rows, two_pass):
    g = torch.Generator().manual_seed(n + k + rows)
    lin = nn.Linear(k, n, bias=False).requires_grad_(False)
    nn.init.normal_(lin.weight, std=0.02, generator=g)
    layer = Int8Linear.from_linear(lin, "vnni", two_pass=two_pass)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-2, 1, rows)[:, None]  # rows of different ranges
    x[0, :3] = 0.0
    got = layer(x)
    want = reference(x, layer.qweight, layer.scales, two_pass)
    # float32 accumulation of the scales (and an FMA in the residual) against float64: rounding only
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    # against the same int8 weights in float: the activations' error alone, which the residual pass takes away
    exact = (x.double() @ layer.dequantized().double().T).float()
    err = float(1 - nn.functional.cosine_similarity(got.double().flatten(), exact.double().flatten(), dim=0))
    assert err < (1e-7 if two_pass else 1e-4)


@pytest.mark.parametrize("two_pass", [False, True])
def test_a_prompt_whose_output_would_leave_the_heap_runs_in_row_blocks_with_the_same_bits(two_pass, monkeypatch):
    g = torch.Generator().manual_seed(7)
    lin = nn.Linear(256, 96, bias=False).requires_grad_(False)
    nn.init.normal_(lin.weight, std=0.02, generator=g)
    layer = Int8Linear.from_linear(lin, "vnni", two_pass=two_pass)
    x = torch.randn(300, 512, generator=g)[:, ::2]  # strided rows: each block reads them in place
    whole = layer(x)
    calls = []
    int_mm = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: calls.append(a.shape[0]) or int_mm(a, b))
    monkeypatch.setattr(kernels, "Q8_OUTPUT_BYTES", 96 * 4 * 64)  # 64 rows of int32 output (two passes: 32 rows)
    blocked = layer(x)
    rows = 32 if two_pass else 64
    passes = 2 if two_pass else 1
    assert calls == [passes * rows] * (300 // rows) + [passes * (300 % rows)]
    assert torch.equal(blocked, whole)  # per-row quantization and exact int32 sums: blocks change nothing


def test_a_zero_row_gives_zero_and_strided_rows_are_read_in_place():
    lin = nn.Linear(128, 16, bias=False).requires_grad_(False)
    layer = Int8Linear.from_linear(lin, "vnni", two_pass=True)
    x = torch.randn(4, 256)[:, ::2]  # a strided view
    x[1] = 0.0
    got = layer(x)
    assert torch.equal(got[1], torch.zeros(16))
    torch.testing.assert_close(got, reference(x, layer.qweight, layer.scales, True), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not vnni_available(), reason="this CPU has no AVX512-VNNI: the fbgemm kernel is the default")
def test_vnni_is_the_default_where_the_cpu_has_it():
    assert default_kernel() == "vnni" and kernels.q8_fast()


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm kernel is not in this torch build")
def test_an_int8_stage_on_vnni_decodes_as_the_fbgemm_one_does(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    ids = torch.randint(10, 500, (30,), generator=torch.Generator().manual_seed(5))
    logits = {}
    for kernel in ("vnni", "fbgemm"):
        ex = StageExecutor(load_stage(ckpt, whole, "int8", int8_kernel=kernel), kv_cache="fp16")
        rows = [ex.step([("a", StepInput(0, input_ids=ids))])[0].logits]
        for pos, token in zip(range(30, 34), (17, 230, 4, 99), strict=True):  # the same tokens into both
            rows.append(ex.step([("a", StepInput(pos, input_ids=torch.tensor([token])))])[0].logits)
        logits[kernel] = torch.stack(rows)
    # two int8 grids of the same weights (fbgemm's activations are asymmetric uint8): close, not equal
    assert not torch.equal(logits["vnni"], logits["fbgemm"])
    assert nn.functional.cosine_similarity(logits["vnni"], logits["fbgemm"], dim=-1).min() > 0.99
