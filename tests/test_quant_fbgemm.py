"""The fbgemm int8 kernel: pair-bounded weights cannot saturate, per-row and two-pass activations are exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.cpu import fbgemm_vnni
from edgeinspect.models.quant import (
    TWO_PASS_LINEARS,
    Int8Linear,
    fbgemm_available,
    quantize_pair_bounded,
    quantize_per_channel,
)
from edgeinspect.models.stage import LayerRange, load_stage

pytestmark = [
    pytest.mark.cpu_paths,
    pytest.mark.skipif(not fbgemm_available(), reason="fbgemm kernel is not in this torch build"),
]


def _cos_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(1 - nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def _linear(n: int, k: int, std: float = 0.02) -> nn.Linear:
    lin = nn.Linear(k, n, bias=False).requires_grad_(False)
    nn.init.normal_(lin.weight, std=std)
    return lin


@pytest.mark.parametrize("k", [64, 65, 2048])
def test_pair_bounded_weights_keep_every_pair_sum_within_128_and_each_row_within_half_a_step(k):
    w = torch.randn(48, k) * torch.logspace(-3, 1, 48)[:, None]
    w[0, :2] = 10.0  # a pair at the row's absmax: the pair bound, not absmax / 127, sets this row's scale
    q, s = quantize_pair_bounded(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and s.shape == (48,)
    pairs = nn.functional.pad(q.int(), (0, k % 2)).view(48, -1, 2).abs().sum(-1)
    assert int(pairs.max()) <= 128
    err = (q.float() * s[:, None] - w).abs().amax(dim=1)
    assert torch.all(err <= s * 1.5)  # half a step, or one step where a rounded-up pair was pulled back
    assert torch.all(s <= w.abs().amax(dim=1) / 63)  # never coarser than the 7-bit weights it replaced


def test_fbgemm_does_not_saturate_where_activations_and_weights_peak_together():
    # Every weight equal: 8-bit absmax weights (127) with u8 activations at 255 overflow vpmaddubsw's int16 sums
    # on CPUs without VNNI (255 * 127 * 2 > 32767); pair-bounded weights (64 + 64) cannot.
    lin = _linear(16, 256)
    lin.weight.fill_(0.05)
    x = torch.ones(1, 256)
    x[0, 0] = -1.0  # range [-1, 1]: zero point ~128, the other inputs quantize to 255
    q8 = Int8Linear.from_linear(lin, "fbgemm")
    exact = x @ q8.dequantized().T  # [1, 16] what the int8 grid should give
    got = q8(x)
    assert torch.allclose(got, exact, rtol=1e-2), f"got {got[0, :3]}, exact {exact[0, :3]}"
    if not fbgemm_vnni():  # the weights' bound is what prevents it: plain 8-bit weights do saturate here
        plain = Int8Linear(*quantize_per_channel(lin.weight), None, "fbgemm")
        assert not torch.allclose(plain(x), x @ plain.dequantized().T, rtol=1e-2)


def test_two_pass_activations_match_the_int8_weights_exactly_on_heavy_tailed_inputs():
    torch.manual_seed(0)
    lin = _linear(512, 1408)
    one, two = Int8Linear.from_linear(lin, "fbgemm"), Int8Linear.from_linear(lin, "fbgemm", two_pass=True)
    for rows in (1, 5):
        x = nn.functional.silu(torch.randn(2, rows, 1408)) * torch.randn(2, rows, 1408)  # down_proj's input
        x[0, 0] *= 40  # one token far larger than the others
        exact = x @ two.dequantized().T  # weights' own error only
        got = two(x)
        assert got.shape == (2, rows, 512) and got.dtype == torch.float32
        assert _cos_err(got, exact) < 1e-6
        assert _cos_err(one(x), exact) > 20 * _cos_err(got, exact)  # one 8-bit pass loses far more


def test_multi_row_steps_quantize_each_row_on_its_own_scale():
    torch.manual_seed(1)
    q8 = Int8Linear.from_linear(_linear(256, 512), "fbgemm")
    small = torch.randn(1, 512)
    batch = torch.cat([small, 1000 * torch.randn(3, 512)])  # a quiet token beside loud ones
    exact = small @ q8.dequantized().T
    alone = _cos_err(q8(small), exact)
    # one scale for the whole tensor would leave the quiet row ~2 of 255 levels: its output would be noise
    assert _cos_err(q8(batch)[:1], exact) < max(2 * alone, 1e-4)


def test_one_sided_activations_fall_back_to_one_pass_and_stay_accurate():
    q8 = Int8Linear.from_linear(_linear(128, 256), "fbgemm", two_pass=True)
    x = torch.rand(3, 256)  # all positive: no room for a signed residual inside the range
    assert _cos_err(q8(x), x @ q8.dequantized().T) < 1e-3


def test_int8_stage_runs_two_pass_only_on_the_listed_projections(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    module = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8", "fbgemm")
    flags = {name.rsplit(".", 1)[-1]: m.two_pass for name, m in module.named_modules() if isinstance(m, Int8Linear)}
    assert flags["down_proj"] and flags["down_proj"] == ("down_proj" in TWO_PASS_LINEARS)
    assert not flags["o_proj"] and not flags["qkv_proj"] and not flags["lm_head"]


@pytest.mark.parametrize("two_pass", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 700])
def test_the_fused_activation_kernel_gives_what_the_torch_steps_give(monkeypatch, rows, two_pass):
    # models/kernels/int8_rows.c replaces ~12 torch ops around fbgemm (per-row scaling, the residual pass): the
    # same grid, so the same result up to float rounding; and as close to the float linear.
    from edgeinspect.models import quant
    from edgeinspect.models.kernels import bindings

    if bindings.rows_library() is None:
        pytest.skip("no C compiler here: Int8Linear runs the torch steps only")
    lin = _linear(96, 320)
    q8 = Int8Linear.from_linear(lin, "fbgemm", two_pass=two_pass)
    x = torch.randn(rows, 320) * torch.logspace(-2, 1, rows)[:, None]  # rows of very different scales
    x[:, :4] *= 30.0  # a heavy tail, as down_proj's inputs have
    native = q8(x)
    monkeypatch.setattr(quant, "native_rows", lambda: False)
    steps = q8(x)
    assert native.shape == steps.shape == (rows, 96)
    assert torch.allclose(native, steps, rtol=1e-4, atol=1e-4 * float(steps.abs().max()))
    exact = x.double() @ q8.dequantized().double().T

    def rel_err(y: torch.Tensor) -> float:  # in float64: fp32 cosines cannot resolve two-pass errors
        return float((y.double() - exact).norm() / exact.norm())

    assert rel_err(native) <= 1.05 * rel_err(steps) + 1e-7
    if two_pass:  # the residual rows really were used: one pass is measurably worse
        q1 = Int8Linear.from_linear(lin, "fbgemm", two_pass=False)
        assert rel_err(native) < 0.5 * rel_err(q1(x))


def test_a_long_prompt_in_row_blocks_gives_exactly_what_one_piece_gives(tiny_checkpoint):
    # Packed stages run a long prompt's linears and MLP in PROMPT_BLOCK-row blocks (intermediates stay small).
    # With rows scaled to absmax 1 each row's int8 grid is its own and fbgemm sums in int32: bit for bit the same.
    from edgeinspect.models.stage import PROMPT_BLOCK, StageExecutor, StepInput

    ckpt = open_checkpoint(tiny_checkpoint)
    ids = torch.randint(10, 400, (2 * PROMPT_BLOCK + 77,))
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers - 1, ckpt.num_layers), "int8"))
    seen: list[int] = []
    ex.module.layers[0].mlp.down_proj.register_forward_pre_hook(lambda _m, a: seen.append(a[0].shape[0]))

    def hidden(block: int) -> torch.Tensor:
        ex.prompt_block = block
        ex.open("s", capacity=len(ids))
        try:
            return ex.step([("s", StepInput(position=0, input_ids=ids, logits=False))])[0].hidden
        finally:
            ex.release("s")

    blocked = hidden(PROMPT_BLOCK)
    assert seen == [PROMPT_BLOCK, PROMPT_BLOCK, 77]  # the blocked path really ran
    seen.clear()
    one_piece = hidden(0)
    assert seen == [len(ids)]
    assert torch.equal(blocked, one_piece)
