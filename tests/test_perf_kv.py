"""The preallocated per-session KV buffer and the lean executor around it."""

from __future__ import annotations

import pytest
import torch

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kv import GROW_ALIGN, KVBuffer, dequantize_rows, quantize_rows
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


def test_buffer_grows_keeping_what_was_written():
    kv = KVBuffer(n_layers=2, kv_heads=3, head_dim=4, dtype=torch.float32)
    written = []
    for step in range(5):
        t = 50 if step == 0 else 1
        k, v = torch.randn(3, t, 4), torch.randn(3, t, 4)
        kv.reserve(kv.length + t)
        kv.write(1, k, v, kv.length)
        kv.length += t
        written.append((k, v))
    keys, values = kv.view(1, kv.length)
    assert torch.equal(keys, torch.cat([k for k, _ in written], dim=1))
    assert torch.equal(values, torch.cat([v for _, v in written], dim=1))
    assert kv.capacity % GROW_ALIGN == 0 and kv.capacity >= kv.length
    assert kv.nbytes == 2 * 2 * 3 * kv.capacity * 4 * 4


def test_growth_is_amortised():
    kv = KVBuffer(n_layers=1, kv_heads=1, head_dim=2, dtype=torch.float32)
    grows, cap = 0, kv.capacity
    for n in range(1, 2000):
        kv.reserve(n)
        grows += kv.capacity != cap
        cap = kv.capacity
    assert grows <= 12  # x1.5 per growth, not one copy per token


def test_a_prompt_in_chunks_equals_the_prompt_at_once(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers)))
    ids = torch.randint(10, 500, (37,), generator=torch.Generator().manual_seed(0))
    whole = ex.step([("a", StepInput(0, input_ids=ids))])[0].logits
    pos = 0
    for chunk in ids.split(10):  # 10, 10, 10, 7: continued with a causal mask over the cached part
        out = ex.step([("b", StepInput(pos, input_ids=chunk))])[0]
        pos = out.length
    assert pos == 37
    assert torch.allclose(out.logits, whole, atol=1e-4, rtol=1e-5)
    nxt = int(torch.argmax(whole))
    a = ex.step([("a", StepInput(37, input_ids=torch.tensor([nxt])))])[0].logits
    b = ex.step([("b", StepInput(37, input_ids=torch.tensor([nxt])))])[0].logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-5)


def test_kv_bytes_count_capacity_per_session(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    ex = StageExecutor(load_stage(ckpt, LayerRange(1, 3, ckpt.num_layers)))
    hidden = torch.zeros(5, ckpt.text_config.hidden_size)
    ex.step([("a", StepInput(0, hidden=hidden)), ("b", StepInput(0, hidden=hidden[:2]))])
    per_pos = ex.kv_bytes_per_position()
    assert ex.kv_bytes() == 2 * GROW_ALIGN * per_pos
    ex.release("a")
    assert ex.kv_bytes() == GROW_ALIGN * per_pos


def test_int8_rows_keep_each_value_within_half_a_step_of_its_row():
    x = torch.randn(3, 5, 64) * torch.logspace(-3, 2, 5)[None, :, None]  # rows of very different ranges
    x[1, 2] = 0.0  # a zero row: scale 0, dequantized exactly
    rows = quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (3, 5, 68)
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    back = dequantize_rows(rows)
    assert torch.all((back - x).abs() <= scale / 2 * (1 + 1e-5))
    assert torch.equal(back[1, 2], torch.zeros(64))
    kv = KVBuffer(n_layers=1, kv_heads=3, head_dim=64, dtype=torch.int8, capacity=5)
    kv.write(0, x, x, 0)
    assert kv.nbytes == 2 * 3 * kv.capacity * 68
    assert torch.equal(kv.view(0, 5)[0], back)
