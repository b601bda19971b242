"""The device-generic stage code on the CPU: the static KV cache, the "device" layer path's decode step (what CUDA
graphs capture on a GPU), the device weight formats' grids, device resolution and the device-memory KV budget.
The CUDA runs of the same code are tests/test_gpu.py (marked `gpu`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeinspect.errors import InvalidInput
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.device import HostCopy, resolve_device
from edgeinspect.models.int4 import dequantize_q4, pack_q4, quantize_q4, torch_int4_available
from edgeinspect.models.kv import KVBuffer, KVCapacityError
from edgeinspect.models.pipeline import LocalPipeline, Request, even_split, load_local_stages
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.models.stage.device import Int4PackLinear, Int8PackLinear, format_refusal
from edgeinspect.models.stage.layers import choose_layer_path
from edgeinspect.services.stage.admission import kv_budget_bytes

NEW_TOKENS = 16
CPU = torch.device("cpu")


def _prompts(ckpt, n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab, image = ckpt.text_config.vocab_size, ckpt.config.image_token_id
    out = []
    for length in (11, 7)[:n]:
        ids = torch.randint(0, vocab, (length,), generator=g)
        out.append([int(i) if i != image else 1 for i in ids])
    return out


def _generate(ckpt, path: str | None, static: bool, stages: int = 2, weights: str = "fp32"):
    executors = load_local_stages(ckpt, even_split(ckpt.num_layers, stages), weights)
    for ex in executors:
        ex.static_kv = static
        if path:
            ex.use_path(path)
    pipe = LocalPipeline(executors, preallocate=True)
    reqs = {f"s{i}": Request(ids, max_new_tokens=NEW_TOKENS) for i, ids in enumerate(_prompts(ckpt))}
    return pipe.generate(reqs, keep_logits=True)


def test_static_kv_cache_gives_the_growing_caches_logits_bit_for_bit(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    grow, static = _generate(ckpt, None, False), _generate(ckpt, None, True)
    for sid in grow:
        assert static[sid].tokens == grow[sid].tokens
        for a, b in zip(static[sid].logits, grow[sid].logits, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("stages", [1, 2])
def test_device_path_static_decode_matches_the_torch_path_on_cpu(tiny_checkpoint, stages):
    """decode_static (masked attention over the whole static cache, index_copy writes: what a CUDA graph
    captures) against the executor's own torch path, two sessions of different lengths stepped together."""
    ckpt = open_checkpoint(tiny_checkpoint)
    ref = _generate(ckpt, "torch", False, stages)
    got = _generate(ckpt, "device", True, stages)
    for sid in ref:
        assert got[sid].tokens == ref[sid].tokens
        diff = max((a - b).abs().max().item() for a, b in zip(got[sid].logits, ref[sid].logits, strict=True))
        scale = max(lg.abs().max().item() for lg in ref[sid].logits)
        # fp32 rounding only: a masked SDPA over the whole capacity sums in another order than one over the past
        assert diff <= 5e-6 * scale, f"{sid}: logits differ by {diff} (scale {scale})"


@pytest.mark.parametrize("weights", ["bf16", "int8", "int4"])
def test_device_formats_run_the_device_path_on_cpu(tiny_checkpoint, weights):
    """The CUDA formats' layers (bf16; weight-only int8 and q4_0 int4 with bf16 activations) through the static
    decode step give the torch path's logits on the same weights; bf16 and int8 stay close to fp32 (accuracy
    proper is gated by the existing records at real sizes, not by the tiny checkpoint's amplifying weights)."""
    from edgeinspect.models.stage.device import to_device_format

    if weights == "int4" and not torch_int4_available():
        pytest.skip("this torch has no CPU _weight_int4pack_mm_for_cpu")
    ckpt = open_checkpoint(tiny_checkpoint)
    r = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    ids = _prompts(ckpt, 1)[0]
    runs = {}
    for name in ("device", "torch", "fp32"):
        module = load_stage(ckpt, r)
        ex = StageExecutor(module) if name == "fp32" else StageExecutor(to_device_format(module, weights, CPU))
        if name != "fp32":
            ex.static_kv = True
            ex.use_path(name)
        ex.open("s", capacity=len(ids) + 4)
        first = ex.step([("s", StepInput(0, input_ids=torch.tensor(ids)))])[0].logits
        second = ex.step([("s", StepInput(len(ids), input_ids=torch.tensor([5])))])[0].logits
        runs[name] = (first, second)
    assert ex.sessions["s"].kv.data.dtype == torch.float32
    for d, t, f in zip(runs["device"], runs["torch"], runs["fp32"], strict=True):
        assert nn.functional.cosine_similarity(d, t, dim=0).item() > 0.999  # bf16 sums in another order
        if weights != "int4":  # q4_0 everywhere on std-0.3 weights is far off fp32 (its grid: the unit test above)
            assert nn.functional.cosine_similarity(d, f, dim=0).item() > 0.9


def test_a_static_cache_refuses_to_grow_past_its_admitted_capacity():
    kv = KVBuffer(2, 2, 8, torch.float32, capacity=10, static=True)
    assert kv.capacity == 64 and not kv.data.any()  # zeros: masked positions must not hold NaN
    kv.reserve(64)
    with pytest.raises(KVCapacityError, match="allocated for 64 at admission"):
        kv.reserve(65)


def test_int4pack_linear_is_the_q4_0_grid():
    torch.manual_seed(0)
    if not torch_int4_available():
        pytest.skip("this torch has no CPU _weight_int4pack_mm_for_cpu")
    lin = nn.Linear(128, 32, bias=False)
    q, scales = quantize_q4(lin.weight.detach())
    ref = dequantize_q4(pack_q4(q), scales.bfloat16().half())  # the same bf16-rounded scales tinygemm reads
    x = torch.randn(3, 128)
    want = x.bfloat16().float() @ ref.T
    got = Int4PackLinear(lin, torch.device("cpu"))(x).float()
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()


def test_int8pack_linear_is_per_channel_int8():
    torch.manual_seed(0)
    lin = nn.Linear(64, 16, bias=False)
    packed = Int8PackLinear(lin, torch.bfloat16, torch.device("cpu"))
    deq = packed.weight.float() * packed.scales.float()[:, None]
    x = torch.randn(2, 64).bfloat16()
    assert torch.allclose(packed(x).float(), x.float() @ deq.T, atol=5e-2, rtol=2e-2)


def test_formats_the_device_cannot_run_are_refused_with_the_reason():
    cpu = torch.device("cpu")
    assert format_refusal("bf16", cpu) is None
    assert "int6" in format_refusal("int6", cpu) and "choose one of" in format_refusal("int6", cpu)


def test_device_settings_resolve_and_refuse_cuda_without_a_device():
    assert resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(InvalidInput, match="cpu, cuda, cuda:N or auto"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInput, match="sees no CUDA device"):
            resolve_device("cuda:0")


def test_cpu_stages_choose_their_old_paths_and_cuda_the_device_path(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    m = load_stage(ckpt, LayerRange(0, 1, ckpt.num_layers))
    assert choose_layer_path(False, "silu", "fp32", m.layers, torch.device("cpu")) == "torch"
    assert choose_layer_path(False, "silu", "bf16", m.layers, torch.device("cuda", 0)) == "device"


def test_host_copy_on_the_cpu_returns_the_same_tensors():
    t = torch.ones(2)
    assert HostCopy(torch.device("cpu"))([t, None])[0] is t


def test_kv_budget_takes_the_smaller_of_the_setting_and_the_free_device_memory():
    assert kv_budget_bytes(2 << 30, None, 0.9) == 2 << 30  # CPU: the setting
    assert kv_budget_bytes(2 << 30, 1 << 30, 0.5) == 1 << 29
    assert kv_budget_bytes(1 << 20, 8 << 30, 0.9) == 1 << 20


def test_stage_settings_take_a_device():
    from pydantic import ValidationError

    from edgeinspect.services.stage.settings import StageSettings
    from edgeinspect.services.vision.settings import VisionSettings

    s = StageSettings(checkpoint="x", layer_start=0, layer_end=1, device="cuda:1")
    assert s.device == "cuda:1" and VisionSettings(checkpoint="x", device="auto").device == "auto"
    with pytest.raises(ValidationError):
        StageSettings(checkpoint="x", layer_start=0, layer_end=1, device="tpu")
