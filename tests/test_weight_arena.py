"""A stage's streamed weights in one mapping advised for huge pages: same values, same outputs, really huge pages
where the kernel's THP setting allows them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from edgeinspect.models.int4 import Int4Linear, available_kernels
from edgeinspect.models.quant import Int8Linear
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.models.weight_arena import HUGE_PAGE, huge_page_weights

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def linears(n_out: int, n_in: int, count: int) -> nn.Sequential:
    g = torch.Generator().manual_seed(count)
    layers = []
    for i in range(count):
        lin = nn.Linear(n_in, n_out, bias=False).requires_grad_(False)
        lin.weight.normal_(0, 0.02, generator=g)
        layers.append(Int4Linear(lin, kernel="ours") if i == count - 1 else Int8Linear.from_linear(lin, "vnni"))
    return nn.Sequential(*layers)


def anon_huge_kib(address: int) -> int:
    """AnonHugePages of the mapping holding `address`, from this process's smaps."""
    current = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            current = lo <= address < hi
        elif current and head == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_weights_move_into_one_aligned_mapping_with_their_values_and_outputs():
    model = linears(1024, 2048, 5)  # 4 x 2 MiB int8 + one int4: past the size worth moving
    x = torch.randn(3, 2048)
    before = [m(x) for m in model]  # each on its own (not a chain)
    values = [m.qweight.clone() for m in model[:-1]] + [model[-1].packed.clone()]
    moved = huge_page_weights(model)
    int4 = model[-1]
    # its int8 copy for prompt rows, where that is row-major (fbgemm, the default without the vnni kernel, keeps its
    # own packed copy, which the arena does not move)
    extra = [int4.prefill.qweight] if int4.prefill is not None and int4.prefill.qweight is not None else []
    assert moved == 4 * 1024 * 2048 + 1024 * 1024 + 1024 * 2048 * len(extra)
    tensors = [m.qweight for m in model[:-1]] + [int4.packed]
    for old, new in zip(values, tensors, strict=True):
        assert torch.equal(old, new)
    assert tensors[0].data_ptr() % HUGE_PAGE == 0  # the first starts on a huge-page boundary
    ends = {t.data_ptr() + t.numel() * t.element_size() for t in tensors + extra}
    starts = sorted(t.data_ptr() for t in tensors + extra)
    assert all(s in ends for s in starts[1:])  # back to back in one mapping
    after = [m(x) for m in model]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    if "[never]" not in (THP.read_text() if THP.exists() else "[never]"):
        assert anon_huge_kib(tensors[0].data_ptr()) >= 2048  # the kernel really gave 2 MiB pages


def test_int4_weights_in_torchs_layout_move_too(monkeypatch):
    # where torch's int4 kernel is the faster (default_kernel picks per CPU) the linear holds only torch's layout
    if "torch" not in available_kernels():
        pytest.skip("this torch build has no CPU int4 packed matmul")
    from edgeinspect.models import weight_arena

    monkeypatch.setattr(weight_arena, "MIN_BYTES", 0)
    lin = nn.Linear(1024, 512, bias=False)
    int4 = Int4Linear(lin, kernel="torch", prefill=False)
    assert int4.packed is None
    x = torch.randn(2, 1024)
    before = int4(x)
    assert huge_page_weights(nn.ModuleList([int4])) == int4.torch_packed.numel() * int4.torch_packed.element_size()
    assert int4.torch_packed.data_ptr() % HUGE_PAGE == 0 and torch.equal(int4(x), before)


def test_a_small_stage_is_left_where_it_is():
    model = linears(64, 64, 3)
    ptrs = [m.qweight.data_ptr() for m in model[:-1]]
    assert huge_page_weights(model) == 0
    assert [m.qweight.data_ptr() for m in model[:-1]] == ptrs


@pytest.mark.parametrize("weights", ["int8", "int6", "int4"])
def test_a_loaded_stage_decodes_the_same_tokens_from_its_arena(tiny_checkpoint, weights, monkeypatch):
    """load_stage moves the weights; a stage whose weights stayed put decodes the same logits, bit for bit."""
    from edgeinspect.models import checkpoint, weight_arena

    ckpt = checkpoint.open_checkpoint(tiny_checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    monkeypatch.setattr(weight_arena, "MIN_BYTES", 0)  # the tiny model's weights are far below the threshold
    moved = load_stage(ckpt, whole, weights)
    monkeypatch.setattr(weight_arena, "MIN_BYTES", 1 << 62)
    kept = load_stage(ckpt, whole, weights)
    ids = torch.arange(5, 25)
    runs = []
    for module in (moved, kept):
        ex = StageExecutor(module)
        out = [ex.step([("s", StepInput(0, input_ids=ids))])[0].logits]
        for i in range(4):
            out.append(ex.step([("s", StepInput(20 + i, input_ids=torch.tensor([7 + i])))])[0].logits)
        runs.append(torch.stack(out))
    assert torch.equal(runs[0], runs[1])
    # what the arena moves (weight_arena._streamed): int8 weights held row-major (not fbgemm's packed copy, the
    # default int8 kernel on a CPU without the vnni kernel) and int4/int6's packed weights
    quantized = [m for m in moved.modules() if isinstance(m, (Int8Linear, Int4Linear))]
    movable = [getattr(m, name) for m, name in weight_arena._streamed(moved)]
    assert movable or all(m.kernel == "fbgemm" for m in quantized)
    assert all(w.data_ptr() % HUGE_PAGE == 0 for w in movable[:1])  # it did move
