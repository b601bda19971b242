"""int4 weights: the q4_0 grid and packing, the compiled kernel against the dequantized weights, the stage format,
and the accuracy of a whole int4 model against fp32."""

from __future__ import annotations

import pytest
import torch
from test_perf_int8 import MID, NEW_TOKENS, _case
from torch import nn

from edgeinspect.config import WeightsDtype
from edgeinspect.models.accuracy import compare
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.int4 import (
    DECODE_ROWS,
    Int4Linear,
    available_kernels,
    default_kernel,
    dequantize_q4,
    pack_q4,
    quantize_q4,
    unpack_q4,
)
from edgeinspect.models.kernels import bindings, ops
from edgeinspect.models.quant import Int8Linear
from edgeinspect.models.stage import LayerRange, load_stage
from edgeinspect.services.stage.settings import StageSettings

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


def test_q4_grid_keeps_each_group_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(16, 256) * torch.logspace(-3, 1, 16)[:, None]  # rows 4 decades apart
    q, d = quantize_q4(w)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and d.shape == (16, 8) and d.dtype == torch.float16
    deq = dequantize_q4(pack_q4(q), d)
    step = d.float().repeat_interleave(32, dim=1)  # [16, 256], signed
    err = (deq - w).abs()
    on_grid = (w / step >= -8) & (w / step <= 7)  # q4_0's grid is [-8, 7] steps: the far side clips at 7
    assert torch.all(err[on_grid] <= step.abs()[on_grid] / 2 * 1.01 + 1e-7)
    assert torch.all(err <= step.abs() * 1.01 + 1e-7)  # a clipped value is at most one step off
    # the largest magnitude of each group lands exactly on -8 * d (q4_0's choice of sign)
    groups = w.reshape(16, 8, 32)
    extreme = groups.gather(-1, groups.abs().argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.allclose(-8 * d.float(), extreme, rtol=1e-3)


def test_packing_round_trips_and_halves_the_bytes():
    q = torch.randint(0, 16, (8, 128), dtype=torch.uint8)
    packed = pack_q4(q)
    assert packed.shape == (8, 64)
    assert torch.equal(unpack_q4(packed), q)
    # one super-block and two plain blocks: the documented layout
    q = torch.randint(0, 16, (3, 640), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    packed = pack_q4(q)
    assert packed.shape == (3, 320) and torch.equal(unpack_q4(packed), q)
    byte = int(packed[1, 32 + 5])  # vector 1, V[5] and V[37]: lanes 1 and 9, each its group's element 4 + 1
    assert byte & 0x0F == int(q[1, 32 * 1 + 5]) and byte >> 4 == int(q[1, 32 * 9 + 5])
    byte = int(packed[1, 8 * 32 + 3])  # the first plain block: elements 512 + 3 and 544 + 3
    assert byte & 0x0F == int(q[1, 515]) and byte >> 4 == int(q[1, 547])


@pytest.mark.parametrize("kernel", ["ours", "torch", "dequant"])
@pytest.mark.parametrize("rows", [1, 3, DECODE_ROWS])
@pytest.mark.parametrize("out_features", [320, 330])  # 330: a task of 10 rows, four at a time leaves two
def test_each_kernel_matches_the_dequantized_weights(kernel, rows, out_features):
    if kernel != "dequant" and kernel not in available_kernels():
        pytest.skip(f"int4 kernel {kernel} is not available here")
    torch.manual_seed(1)
    lin = nn.Linear(512, out_features, bias=True)
    q4 = Int4Linear(lin, kernel=kernel)
    x = torch.randn(rows, 512)
    ref = x @ q4.dequantized().T + lin.bias
    got = q4(x)
    assert got.shape == (rows, out_features) and got.dtype == torch.float32
    if kernel == "torch" and out_features % 16:
        assert q4.kernel != "torch"  # its packing needs N divisible by 16: another kernel takes the linear
    # the only difference is the activations' rounding (int8 per group of 32, or bf16): about 1e-5 in cosine
    cos = nn.functional.cosine_similarity(got.flatten(), ref.detach().flatten(), dim=0)
    assert cos > 0.9999, cos
    # and strided rows (a column slice of a wider tensor) give the same result
    wide = torch.randn(rows, 1024)
    wide[:, :512] = x
    assert torch.allclose(q4(wide[:, :512]), got, atol=1e-5)


def test_prompt_chunks_run_the_int8_copy():
    torch.manual_seed(2)
    lin = nn.Linear(256, 128, bias=False)
    q4 = Int4Linear(lin, kernel="dequant")
    x = torch.randn(DECODE_ROWS + 5, 256)
    assert torch.equal(q4(x), q4.prefill(x))
    assert q4.weight_bytes() == 128 * 256 // 2 + 2 * 128 * 256 // 32  # what a decode step reads


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c rounded once: the product of two fp32 values is exact in fp64, so only the sum rounds there
    (a second rounding to fp32 differs from one only at an exact fp32 midpoint, about 2^-29 of cases)."""
    return (a.double() * b.double() + c.double()).float()


def _int4_in_the_kernels_order(x: torch.Tensor, q: torch.Tensor, d16: torch.Tensor, offset: int = 8) -> torch.Tensor:
    """int4_gemm.c's SIMD arithmetic in torch: activations to int8 per group of 32; 16 fp32 lanes per row, each
    super-block of 512 weights adding its 16 groups' whole int32 sums (less offset times the group's activation
    sum) one per lane, then each plain block (the last K % 512) adding four-product partial sums (less offset / 8
    times the sum), 8 lanes per group; one fp32 FMA per lane with the group's scale product, then the fixed 16-lane
    reduction (lo | hi halves, 128-bit halves, pairs)."""
    r, k = x.shape
    n, g = q.shape[0], k // 32
    xg = x.reshape(r, g, 32)
    d = xg.abs().amax(-1) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    xq = torch.round(xg * inv[..., None]).clamp(-127, 127).int()
    sums = xq.sum(-1)[:, None, :]  # [R, 1, G]
    lanes = (q.reshape(1, n, g, 8, 4).int() * xq.reshape(r, 1, g, 8, 4)).sum(-1)  # [R, N, G, 8]
    scale = d16.float()[None] * d[:, None, :]  # [R, N, G]: one fp32 product per group
    acc = torch.zeros(r, n, 16)
    supers = k // 512
    for s in range(supers):
        gs = slice(16 * s, 16 * s + 16)
        acc = _fma((lanes[:, :, gs].sum(-1) - offset * sums[:, :, gs]).float(), scale[:, :, gs], acc)
    for b in range(supers * 8, k // 64):
        gs = slice(2 * b, 2 * b + 2)
        part = (lanes[:, :, gs] - offset // 8 * sums[:, :, gs, None]).reshape(r, n, 16)
        acc = _fma(part.float(), scale[:, :, gs].repeat_interleave(8, -1), acc)
    t = acc[..., 8:] + acc[..., :8]
    u = t[..., 4:] + t[..., :4]
    u = u + u[..., [2, 3, 0, 1]]
    return u[..., 0] + u[..., 1]


@pytest.mark.parametrize("rows", [1, 2, 3, 5])  # each count of rows the kernel unrolls for, and a 4 + 1 split
def test_the_simd_int4_kernel_sums_in_its_documented_order_bit_for_bit(rows):
    # The AVX2 and VNNI loops promise the same bits (a stage moved between boxes decodes the same tokens); this pins
    # whichever this CPU builds to the one order, so a faster rearrangement cannot drift from the other silently.
    if not bindings.int4_fast():
        pytest.skip("this CPU builds only the plain-C int4 loop (no AVX2/F16C or VNNI)")
    g = torch.Generator().manual_seed(7)
    # tails of the 16-row tasks; K of plain blocks only, of super-blocks only, and both
    for n, k in ((40, 192), (17, 320), (33, 2048), (9, 640)):
        q, d16 = quantize_q4(torch.randn(n, k, generator=g))
        x = torch.randn(rows, k, generator=g) * torch.rand(rows, 1, generator=g) * 4
        x[0, :32] = 0.0  # a group of zeros: scale 0, its lanes add nothing
        got = ops.int4_gemm(x, pack_q4(q), d16)
        want = _int4_in_the_kernels_order(x, q, d16)
        assert torch.equal(got, want), (n, k, (got - want).abs().max())


def test_int4_stage_replaces_linears_and_falls_back_to_int8_where_width_does_not_fit(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    module = load_stage(ckpt, LayerRange(2, 5, ckpt.num_layers), "int4")
    assert module.weights == "int4"
    assert not [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    layer = module.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Int4Linear)  # width 64
    assert isinstance(layer.mlp.gate_up_proj, Int4Linear)
    assert isinstance(layer.mlp.down_proj, Int8Linear)  # INT8_LINEARS (and width 176 would not fit anyway)
    assert isinstance(module.lm_head, Int8Linear)  # its error lands on the logits directly
    cfg = StageSettings.load(None, checkpoint=tiny_checkpoint, layer_start=0, layer_end=1, weights="int4")
    assert cfg.weights is WeightsDtype.int4


@pytest.fixture(scope="module")
def mid_checkpoint(tmp_path_factory):
    from edgeinspect.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("ckpt") / "mid", MID)


@pytest.mark.slow  # a whole mid-size model twice (fp32 reference + int4 or int6): minutes on a loaded 2-core box
@pytest.mark.parametrize("weights", ["int4", "int6"])
def test_int4_and_int6_logits_stay_close_to_fp32_at_trained_scale(mid_checkpoint, part_images, weights):
    acc = compare(*_case(mid_checkpoint, part_images[1]), weights, NEW_TOKENS)
    print(f"mid-size {weights} vs fp32: {acc}")
    assert acc.min_cosine >= 0.99  # the bound perf_accuracy gates formats with


def test_the_default_kernel_is_one_that_runs_here():
    assert default_kernel() in (available_kernels() or ["dequant"])
