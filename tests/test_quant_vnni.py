"""The vnni int8 linear: our GEMV for decode rows and the int32 GEMM for prompts (torch._int_mm on VNNI CPUs, ours
on AVX2) compute the same int8 arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kernels import bindings, ops
from edgeinspect.models.quant import (
    Int8Linear,
    default_kernel,
    fbgemm_available,
    hadamard_blocks,
    kernels_simd,
    rotation_block,
    vnni_available,
)
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

pytestmark = [
    pytest.mark.cpu_paths,
    pytest.mark.skipif(bindings.q8_library() is None, reason="no C compiler here to build the native kernels"),
]


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
@pytest.mark.parametrize("rows", [1, 3, 9, 40])  # 1-8 rows (x2 passes <= 16): our GEMV; 40: the int32 GEMM
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


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("rows", [2, 577])  # a GEMV (bias added after it) and a prompt (added as rows are scaled)
def test_a_bias_and_a_gelu_are_applied_on_decode_and_prompt_rows_alike(rows, gelu):
    g = torch.Generator().manual_seed(rows)
    lin = nn.Linear(1024, 300).requires_grad_(False)  # SigLIP's linears carry a bias; its fc1 a GELU after
    nn.init.normal_(lin.weight, std=0.05, generator=g)
    nn.init.normal_(lin.bias, std=1.0, generator=g)
    layer = Int8Linear.from_linear(lin, "vnni")
    layer.gelu = gelu
    x = torch.randn(rows, 1024, generator=g)
    want = reference(x, layer.qweight, layer.scales, False) + lin.bias
    assert float(want.min()) < -4 and float(want.max()) > 4  # both tails of the GELU are crossed
    if gelu:
        want = nn.functional.gelu(want, approximate="tanh")
    torch.testing.assert_close(layer(x), want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    with pytest.raises(ValueError, match="without bias"):
        ops.q8_linear(x, layer.qweight, layer.scales, layer.row_sums, False, gated=True, bias=layer.bias)


@pytest.mark.parametrize("two_pass", [False, True])
def test_a_prompt_whose_output_would_leave_the_heap_runs_in_row_blocks_with_the_same_bits(two_pass, monkeypatch):
    g = torch.Generator().manual_seed(7)
    lin = nn.Linear(256, 96, bias=False).requires_grad_(False)
    nn.init.normal_(lin.weight, std=0.02, generator=g)
    layer = Int8Linear.from_linear(lin, "vnni", two_pass=two_pass)
    x = torch.randn(300, 512, generator=g)[:, ::2]  # strided rows: each block reads them in place
    whole = layer(x)
    calls = []
    int_mm = ops.q8_int_mm
    monkeypatch.setattr(ops, "q8_int_mm", lambda a, b: calls.append(a.shape[0]) or int_mm(a, b))
    monkeypatch.setattr(ops, "Q8_OUTPUT_BYTES", 96 * 4 * 64)  # 64 rows of int32 output (two passes: 32 rows)
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


@pytest.mark.parametrize(("k", "block"), [(5632, 512), (176, 16), (100, 0)])  # 1.3B's and tiny's down_proj
def test_a_rotated_linear_computes_the_same_product_in_one_pass_near_two_unrotated(k, block):
    g = torch.Generator().manual_seed(k)
    lin = nn.Linear(k, 96, bias=False).requires_grad_(False)
    nn.init.normal_(lin.weight, std=0.02, generator=g)
    rotated = Int8Linear.from_linear(lin, "vnni", two_pass=True, rotate=True)
    plain = Int8Linear.from_linear(lin, "vnni", two_pass=True)
    assert rotated.rotate == block == rotation_block(k)
    # the rotation is its own inverse: the stored weights rotated back are the linear's, to int8 rounding
    torch.testing.assert_close(rotated.dequantized(), lin.weight, rtol=0, atol=float(rotated.scales.max()) * 2)
    x = nn.functional.silu(torch.randn(40, k, generator=g)) * torch.randn(40, k, generator=g)  # heavy-tailed
    exact = x.double() @ lin.weight.double().T

    def err(y: torch.Tensor) -> float:
        return float(1 - nn.functional.cosine_similarity(y.double().flatten(), exact.flatten(), dim=0))

    decode = torch.cat([rotated(x[i : i + 4]) for i in range(0, 40, 4)])  # 4 rows: the GEMV
    prompt = rotated(x)  # 40 rows: the int32 GEMM
    if not block:  # a width with no block to rotate by: the plain linear's bits, two passes everywhere
        assert rotated.two_pass
        assert torch.equal(prompt, plain(x))
        assert torch.equal(decode, torch.cat([plain(x[i : i + 4]) for i in range(0, 40, 4)]))
        return
    # one pass on every row: the GEMV's rows are the GEMM's arithmetic (per-row scales, exact int32 sums)
    assert not rotated.two_pass
    torch.testing.assert_close(decode, prompt, rtol=1e-5, atol=1e-6)
    # within 2.5x of two unrotated passes' error and far below one unrotated pass's
    one_pass = Int8Linear.from_linear(lin, "vnni")(x)
    for y in (decode, prompt):
        assert err(y) < 2.5 * err(plain(x))
        assert err(y) < 0.5 * err(one_pass)


@pytest.mark.parametrize(("k", "n", "rows"), [(64, 352, 40), (64, 350, 40), (64, 352, 5), (128, 1024, 300)])
def test_a_gated_projection_goes_from_int32_to_silu_times_up_with_the_bits_of_the_two_steps(k, n, rows, monkeypatch):
    g = torch.Generator().manual_seed(n + rows)
    lin = nn.Linear(k, n, bias=False).requires_grad_(False)
    nn.init.normal_(lin.weight, std=0.05, generator=g)
    gate_up = Int8Linear.from_linear(lin, "vnni")
    x = torch.randn(rows, k, generator=g)
    monkeypatch.setattr(ops, "Q8_OUTPUT_BYTES", 4 * n * 64)  # 300 rows: blocks of 64 (each its own finish)
    got = gate_up.silu_mul(x)  # [R, n / 2], never [R, n] in fp32 for prompt rows
    assert got.shape == (rows, n // 2)
    assert torch.equal(got, ops.silu_mul(gate_up(x)))
    y = x.double() @ gate_up.dequantized().double().T
    exact = nn.functional.silu(y[:, : n // 2]) * y[:, n // 2 : 2 * (n // 2)]
    torch.testing.assert_close(got.double(), exact, rtol=0, atol=0.02 * float(exact.abs().max()))


def test_rotation_blocks_are_the_widest_power_of_two_that_divides_the_width():
    assert [rotation_block(k) for k in (5632, 2048, 176, 100, 24)] == [512, 512, 16, 0, 0]
    x = torch.randn(3, 1024)
    torch.testing.assert_close(hadamard_blocks(hadamard_blocks(x, 512), 512), x)  # orthogonal and involutory
    torch.testing.assert_close(hadamard_blocks(x, 16).norm(dim=1), x.norm(dim=1))


@pytest.mark.parametrize(("k", "block"), [(2048, 0), (100, 0), (33, 16), (5632, 256), (320, 64)])
@pytest.mark.parametrize("two_pass", [False, True])
def test_activation_rows_quantize_to_the_documented_bits_on_this_cpus_simd_path(k, block, two_pass):
    """ei_q8_prep (AVX-512, AVX2 or plain C, whichever this CPU builds) against its arithmetic in torch, bit for bit:
    the unnormalized block rotation, s = absmax / 127, round half to even of x * (1/s), clamped; the residual pass
    x - q s as one rounding (a fused multiply-add: exact in float64, then rounded once) on a grid 254x finer. Blocks
    whose sqrt is a power of two, so the reference can undo hadamard_blocks' normalization exactly."""
    g = torch.Generator().manual_seed(k + block)
    x = torch.randn(6, k, generator=g) * 3
    x[1] = torch.randint(-300, 300, (k,), generator=g).float() * 0.5  # halfway cases for the rounding
    x[2] = 0  # a zero row: zero scales, zero codes
    x[3, ::3] = 0
    passes = 2 if two_pass else 1
    xq = torch.full((passes * 6, k), 99, dtype=torch.int8)
    xs = torch.full((passes * 6,), -1.0)
    rc = bindings.q8_library().ei_q8_prep(6, k, x.data_ptr(), k, int(two_pass), block, xq.data_ptr(), xs.data_ptr(), 2)
    assert rc == 0
    norm = block**-0.5 if block else 1.0
    rows = x
    if block:
        whole = k // block * block  # a tail past the last whole block stays as it is
        rows = torch.cat([hadamard_blocks(x[:, :whole], block) * block**0.5, x[:, whole:]], dim=1)
    s1 = rows.abs().amax(dim=1, keepdim=True) / 127
    q1 = torch.round(rows * torch.where(s1 > 0, 1 / s1, 0)).clamp(-127, 127)
    assert torch.equal(xq[:6], q1.to(torch.int8))
    assert torch.equal(xs[:6], (s1 * norm).squeeze(1))
    if two_pass:
        s2 = s1 / 254
        residual = (rows.double() - q1.double() * s1.double()).float()
        q2 = torch.round(residual * torch.where(s2 > 0, 1 / s2, 0)).clamp(-127, 127)
        assert torch.equal(xq[6:], q2.to(torch.int8))
        assert torch.equal(xs[6:], (s2 * norm).squeeze(1))
    assert not xq[2].any() and not xq[2 + (6 if two_pass else 0)].any()


@pytest.mark.parametrize(("rows", "n", "k"), [(1, 1, 1), (3, 4, 0), (7, 5, 100), (64, 33, 2048), (131, 96, 5632 + 31)])
def test_the_prompt_gemm_gives_the_exact_int32_product_whatever_the_tile_remainders(rows, n, k):
    g = torch.Generator().manual_seed(rows + n + k)
    xq = torch.randint(-127, 128, (rows, k), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    xq[0, : min(k, 40)] = 127  # saturating pairs for vpmaddubsw if the sign trick were wrong
    w[0, : min(k, 40)] = -127
    got = ops.q8_int_mm(xq, w)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), xq.long() @ w.long().T)
    acc = torch.empty(rows, n, dtype=torch.int32)  # our GEMM itself, also where the VNNI build uses torch._int_mm
    bindings.q8_library().ei_q8_mm(rows, n, k, xq.data_ptr(), w.data_ptr(), acc.data_ptr(), 2)
    assert torch.equal(acc, got)


@pytest.mark.skipif(
    not vnni_available(), reason="no SIMD vnni kernel here (no AVX2 or no compiler): fbgemm is the default"
)
def test_vnni_is_the_default_wherever_its_simd_path_builds_avx2_or_vnni():
    assert bindings.q8_fast()
    assert kernels_simd() in (1, 2)  # AVX2 or NEON, or AVX512-VNNI: SIMD for decode rows and prompt rows alike
    assert default_kernel() == "vnni"


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm kernel is not in this torch build")
def test_an_int8_stage_on_vnni_decodes_as_the_fbgemm_one_does(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    ids = torch.randint(10, 500, (30,), generator=torch.Generator().manual_seed(5))
    logits = {}
    for weights, kernel in (("fp32", None), ("int8", "vnni"), ("int8", "fbgemm")):
        ex = StageExecutor(load_stage(ckpt, whole, weights, int8_kernel=kernel), kv_cache="fp16")
        rows = [ex.step([("a", StepInput(0, input_ids=ids))])[0].logits]
        for pos, token in zip(range(30, 34), (17, 230, 4, 99), strict=True):  # the same tokens into each
            rows.append(ex.step([("a", StepInput(pos, input_ids=torch.tensor([token])))])[0].logits)
        logits[kernel or weights] = torch.stack(rows)
    # two int8 grids of the same weights (fbgemm's activations are asymmetric uint8, vnni's down projection is
    # rotated): not equal, each close to fp32 (tiny dims: hidden 64, rotation blocks of 16); vnni the closer
    assert not torch.equal(logits["vnni"], logits["fbgemm"])
    cos = {k: nn.functional.cosine_similarity(logits[k], logits["fp32"], dim=-1).min() for k in ("vnni", "fbgemm")}
    assert cos["fbgemm"] > 0.975
    assert cos["vnni"] > 0.99
