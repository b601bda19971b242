"""The compiled decode-attention kernel and the compact (int8 rows or fp16) KV cache of packed-weight stages."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.nn.functional import cosine_similarity, scaled_dot_product_attention

from edgeinspect.models import cpu, int4, quant
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kernels import bindings, build, ops
from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.quant import use_half16
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped

needs_kernels = pytest.mark.skipif(not bindings.available(), reason="no C compiler here to build the native kernels")


def sdpa_one_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """q [H, hd] over [H_kv, L, hd] -> [H * hd], as the executor calls SDPA (fp32)."""
    out = scaled_dot_product_attention(
        q[None, :, None], keys.float()[None], values.float()[None], scale=scale, enable_gqa=True
    )
    return out[0, :, 0].reshape(-1)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 4, 32), (8, 2, 24), (16, 16, 128)])
def test_one_call_stores_each_sessions_row_and_attends_as_sdpa(heads, kv_heads, head_dim, dtype):
    g = torch.Generator().manual_seed(head_dim)
    pasts = [0, 36, 299]  # a first row, odd lengths, sessions of different capacity in one call
    buffers = [KVBuffer(3, kv_heads, head_dim, dtype, capacity=p + 1) for p in pasts]
    for kv, past in zip(buffers, pasts, strict=True):
        kv.data.zero_()  # capacity is uninitialised memory: NaN patterns there would defeat the equality below
        kv.write(2, *(torch.randn(kv_heads, past, head_dim, generator=g) for _ in range(2)), 0)
    expected = [KVBuffer(3, kv_heads, head_dim, dtype, capacity=p + 1) for p in pasts]
    for kv, ref in zip(buffers, expected, strict=True):
        ref.data.copy_(kv.data)
    q = torch.randn(3, heads, head_dim, generator=g)
    qkv = torch.randn(3, 2 * kv_heads * head_dim, generator=g)  # k and v as strided views of one fused output
    k, v = (x.reshape(3, kv_heads, head_dim) for x in qkv.split(kv_heads * head_dim, dim=-1))
    got = ops.DecodeAttention(buffers, pasts)(2, q, k, v, head_dim**-0.5)
    assert got.shape == (3, heads * head_dim)
    for b, (ref, past) in enumerate(zip(expected, pasts, strict=True)):
        # torch's own fp16 rounding, or quantize_rows: the kernel stores the new row exactly as KVBuffer.write does
        ref.write(2, k[b : b + 1].transpose(0, 1), v[b : b + 1].transpose(0, 1), past)
        assert torch.equal(buffers[b].data, ref.data)  # the new row, bit for bit, and nothing else touched
        want = sdpa_one_row(q[b], *ref.view(2, past + 1), head_dim**-0.5)  # over the same stored (rounded) rows
        torch.testing.assert_close(got[b], want, atol=2e-5, rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
def test_int8_heads_attended_two_at_a_time_give_each_heads_own_bits(heads, kv_heads):
    # head_dim 128 and an even head count take the paired loops on AVX-512; one head per call takes the single loop
    hd, past, g = 128, 203, torch.Generator().manual_seed(7)
    kv = KVBuffer(2, kv_heads, hd, torch.int8, capacity=past + 1)
    kv.data.zero_()
    kv.write(1, *(torch.randn(kv_heads, past, hd, generator=g) for _ in range(2)), 0)
    q, k, v = torch.randn(1, heads, hd, generator=g), *(torch.randn(1, kv_heads, hd, generator=g) for _ in range(2))
    single = [KVBuffer(2, 1, hd, torch.int8, capacity=past + 1) for _ in range(kv_heads)]
    for j, one in enumerate(single):
        one.data.copy_(kv.data[:, :, j : j + 1])
    together = ops.DecodeAttention([kv], [past])(1, q, k, v, hd**-0.5)
    group = heads // kv_heads
    for h in range(heads):
        j = h // group
        one_head = q[:, h : h + 1], k[:, j : j + 1], v[:, j : j + 1]
        alone = ops.DecodeAttention([single[j]], [past])(1, *one_head, hd**-0.5)
        assert torch.equal(together[0, h * hd : (h + 1) * hd], alone[0])


@needs_kernels
def test_decode_attention_refuses_what_it_cannot_read():
    kv = KVBuffer(1, 2, 8, torch.float16, capacity=4)
    with pytest.raises(ValueError, match="all fp16 or all int8"):
        ops.DecodeAttention([KVBuffer(1, 2, 8, torch.float32, capacity=4)], [0])
    with pytest.raises(ValueError, match="all fp16 or all int8"):
        ops.DecodeAttention([kv, KVBuffer(1, 2, 8, torch.int8, capacity=4)], [0, 0])
    with pytest.raises(ValueError, match="room for one more row"):
        ops.DecodeAttention([kv], [kv.capacity])
    step = ops.DecodeAttention([kv], [0])
    with pytest.raises(ValueError, match=r"want \[1, 4, 8\] fp32 rows"):
        step(0, torch.randn(1, 4, 8).half(), torch.randn(1, 2, 8), torch.randn(1, 2, 8), 1.0)
    with pytest.raises(ValueError, match="do not group"):
        step(0, torch.randn(1, 3, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8), 1.0)


@needs_kernels
@pytest.mark.parametrize(("weights", "kv_cache"), [("bf16", "fp16"), ("int8", "fp16"), ("int8", "int8")])
def test_packed_stages_decode_over_a_compact_cache_as_sdpa_does(tiny_checkpoint, weights, kv_cache, monkeypatch):
    # int8 weights through float linears (the "dequant" kernel): only the cache's rounding differs then; an 8-bit
    # activation grid would add chance flips that this chaotic tiny model amplifies (see the test below)
    monkeypatch.setattr(quant, "default_kernel", lambda: "dequant")
    ckpt = open_checkpoint(tiny_checkpoint)
    whole = LayerRange(0, ckpt.num_layers, ckpt.num_layers)
    native = StageExecutor(load_stage(ckpt, whole, weights), kv_cache=kv_cache)
    native.prompt_kernel = False  # the cache's rounding only: bf16 prompt attention has its own test file
    plain = StageExecutor(load_stage(ckpt, whole, weights), native=False)
    if weights == "bf16" and not use_half16("bf16"):
        # This CPU has bf16 instructions (AVX512-BF16 or AMX): bf16 stages run real bf16 GEMMs with a bf16 cache
        # and SDPA; the fp16 cache and the native kernel belong to packed fp32-activation stages only.
        assert not native.native and native.kv_dtype == plain.kv_dtype == torch.bfloat16
        assert native.kv_bytes_per_position() == plain.kv_bytes_per_position()
        return
    hd = native.head_dim
    assert native.native and plain.kv_dtype == torch.float32
    if kv_cache == "fp16":
        assert native.kv_dtype == torch.float16 and 2 * native.kv_bytes_per_position() == plain.kv_bytes_per_position()
    else:  # hd int8 values + a 4-byte scale per row, against 4 * hd bytes
        assert native.kv_dtype == torch.int8
        assert native.kv_bytes_per_position() * 4 * hd == plain.kv_bytes_per_position() * (hd + 4)
    ids = torch.randint(10, 500, (40,), generator=torch.Generator().manual_seed(3))
    fed = [41, 300, 7, 123, 480, 66]  # the same tokens into both: a chaotic tiny model's greedy chain is no test
    logits = {}
    for name, ex in (("native", native), ("plain", plain)):
        rows = [ex.step([("a", StepInput(0, input_ids=ids))])[0].logits]
        b_lengths = []
        for i, token in enumerate(fed):
            # a second session in the same passes; the first is a mixed step: a decodes (native) while b's
            # 17-token prompt attends with SDPA over the compact cache; then both decode in one native call
            b = StepInput(0, input_ids=ids[:17]) if i == 0 else StepInput(16 + i, input_ids=torch.tensor([7]))
            outs = ex.step([("a", StepInput(40 + i, input_ids=torch.tensor([token]))), ("b", b)])
            rows.append(outs[0].logits)
            b_lengths.append(outs[1].length)
        assert b_lengths == [17, 18, 19, 20, 21, 22]
        logits[name] = torch.stack(rows)
    # rounding of keys/values only: fp16 rows lose ~1e-5 of cosine; int8 rows of 16 values in this chaotic tiny
    # model (init std 0.3) 0.995-0.999 over 8 prompts (AVX2 EPYC), as in the chunked-prompt test below (1.3B
    # figures: bench/perf_accuracy.py)
    bar = 0.9999 if kv_cache == "fp16" else 0.99
    assert cosine_similarity(logits["native"], logits["plain"], dim=-1).min() > bar


def test_fp32_stages_keep_sdpa_and_a_32_bit_cache(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers)))
    assert not ex.native and ex.kv_dtype == torch.float32  # bit-exact with generate() needs SDPA's order


def test_a_failing_compiler_leaves_torch_kernels_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("EDGEINSPECT_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # found on PATH, exits 1: a broken toolchain
    bindings.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="edgeinspect.models.kernels.build"):
            assert bindings.library() is None
        assert "could not be built" in caplog.text
        assert not list(tmp_path.glob("*.so"))
    finally:
        monkeypatch.undo()
        bindings.library.cache_clear()


@needs_kernels
def test_kernels_build_into_the_configured_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINSPECT_KERNEL_DIR", str(tmp_path))
    bindings.library.cache_clear()
    try:
        assert bindings.library() is not None
        (built,) = tmp_path.glob("decode_attention-*.so")
        assert built.stat().st_size > 0
        bindings.library.cache_clear()
        assert bindings.library() is not None and list(tmp_path.glob("*.so")) == [built]  # reused, not rebuilt
    finally:
        monkeypatch.undo()
        bindings.library.cache_clear()


def test_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("EDGEINSPECT_NATIVE_KERNELS", "0")
    bindings.library.cache_clear()
    try:
        assert bindings.library() is None
    finally:
        monkeypatch.undo()
        bindings.library.cache_clear()


@needs_kernels
@pytest.mark.parametrize(("kv_heads", "head_dim", "t", "at"), [(2, 24, 37, 0), (16, 128, 65, 300)])
def test_prompt_rows_are_stored_natively_as_kvbuffer_write_stores_them(kv_heads, head_dim, t, at):
    g = torch.Generator().manual_seed(t)
    qkv = torch.randn(t, 3 * kv_heads * head_dim, generator=g) * 3  # k and v as strided views of one fused output
    qkv[5] = 0  # a zero row: scale 0, values 0
    qkv[6, : kv_heads * head_dim] = torch.arange(kv_heads * head_dim) % 7 - 3.5  # values on .5: round half to even
    _, k, v = (x.reshape(t, kv_heads, head_dim) for x in qkv.split(kv_heads * head_dim, dim=-1))
    ours, ref = (KVBuffer(3, kv_heads, head_dim, torch.int8, capacity=at + t + 5) for _ in range(2))
    ours.data.zero_()
    ref.data.zero_()
    ops.store_rows_q8(ours, 1, k, v, at)
    ref.write(1, k.transpose(0, 1), v.transpose(0, 1), at)
    assert torch.equal(ours.data, ref.data)  # the same bytes, and nothing else touched
    with pytest.raises(ValueError, match="room"):
        ops.store_rows_q8(ours, 1, k, v, ours.capacity - t + 1)
    with pytest.raises(ValueError, match="fp32 rows"):
        ops.store_rows_q8(ours, 1, k.half(), v, at)


@needs_kernels
def test_an_int8_stages_prompt_chunks_store_their_rows_natively(tiny_checkpoint, monkeypatch):
    ckpt = open_checkpoint(tiny_checkpoint)
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8"))
    ids = torch.randint(10, 500, (23,), generator=torch.Generator().manual_seed(3))
    calls = []
    store = ops.store_rows_q8
    monkeypatch.setattr(ops, "store_rows_q8", lambda kv, j, k, v, at: calls.append(j) or store(kv, j, k, v, at))
    native = ex.step([("a", StepInput(0, input_ids=ids))])[0].logits
    assert calls == list(range(ckpt.num_layers))  # every layer's prompt rows, one call each

    def torch_write(kv, j, k, v, at):  # what the stage did before: KVBuffer.write's torch ops
        kv.write(j, k.transpose(0, 1), v.transpose(0, 1), at)

    monkeypatch.setattr(ops, "store_rows_q8", torch_write)
    written = ex.step([("b", StepInput(0, input_ids=ids))])[0].logits
    assert torch.equal(ex.sessions["a"].kv.data[:, :, :, :23], ex.sessions["b"].kv.data[:, :, :, :23])
    assert torch.equal(native, written)


@needs_kernels
def test_an_int8_cache_prompt_in_chunks_attends_over_the_stored_past(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8"))
    assert ex.kv_dtype == torch.int8  # the default compact cache of a packed stage
    cosines = []
    for seed in range(1, 5):
        ids = torch.randint(10, 500, (37,), generator=torch.Generator().manual_seed(seed))
        whole = ex.step([(f"a{seed}", StepInput(0, input_ids=ids))])[0].logits
        pos = 0
        for chunk in ids.split(10):  # later chunks read the earlier ones back from int8 rows
            out = ex.step([(f"b{seed}", StepInput(pos, input_ids=chunk))])[0]
            pos = out.length
        assert pos == 37 and not torch.equal(out.logits, whole)  # the stored past really was read back
        cosines.append(cosine_similarity(out.logits, whole, dim=0).item())
    # 16-value rows in this tiny chaotic model (fp16 rows: 0.9997); 1.3B figures: bench/perf_accuracy.py. One
    # prompt's figure moves by ~1e-3 with the rounding of any sum (seed 1: 0.9905 -> 0.9897 when the RMS norm's sum
    # of squares went from one running sum to 16): each prompt within 0.985, their mean within 0.99.
    assert min(cosines) > 0.985 and sum(cosines) / len(cosines) > 0.99, cosines


@needs_kernels
@pytest.mark.parametrize("weights", ["int8", "int6", "int4"])
def test_native_decode_layers_compute_what_the_torch_ops_do(tiny_checkpoint, weights, monkeypatch):
    # Float linears (the real "dequant" kernels): the native elementwise steps round differently from torch's ops
    # (SIMD sum orders, compiled per ISA), and an 8-bit activation grid (vnni, fbgemm, our int4) turns a rounding
    # apart into a whole grid step now and then, which this chaotic tiny model amplifies to ~0.1 in the logits:
    # 3 of 8 prompts on vnni and on fbgemm alike (AVX2 EPYC). The quantized kernels' own paths have their own
    # bit tests (tests/test_quant_vnni.py, tests/test_perf_int4.py and the whole-layer test below).
    monkeypatch.setattr(quant, "default_kernel", lambda: "dequant")
    monkeypatch.setattr(int4, "default_kernel", lambda: "dequant")
    calls = []
    rope = ops.rope_
    monkeypatch.setattr(ops, "rope_", lambda *a: calls.append(1) or rope(*a))
    ckpt = open_checkpoint(tiny_checkpoint)
    module = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), weights)
    fused, plain = StageExecutor(module), StageExecutor(module)
    plain.use_path("torch")  # the same stage with norms, rotary, silu * up and adds as torch ops (prompts too)
    fused.use_path("native")  # the per-layer Python path (whole C layers: the test below)
    if bindings.prompt_attention_bf16():
        # bf16 dot products are a grid too (3 of 6 prompts apart by 2e-4 to 5e-3 on an AVX512-BF16 EPYC); the fp32
        # SDPA for both prompts here, that kernel's own bound in tests/test_prompt_attention.py
        fused.prompt_kernel = plain.prompt_kernel = False
    ids = torch.randint(10, 500, (20,), generator=torch.Generator().manual_seed(2))
    outs = {}
    for name, ex in (("fused", fused), ("ops", plain)):
        rows = [ex.step([("a", StepInput(0, input_ids=ids)), ("b", StepInput(0, input_ids=ids[:5]))])[0].logits]
        for pos, token in enumerate((3, 77, 410), start=20):  # two sessions decoding in one pass
            a, _ = ex.step(
                [
                    ("a", StepInput(pos, input_ids=torch.tensor([token]))),
                    ("b", StepInput(pos - 15, input_ids=torch.tensor([token]))),
                ]
            )
            rows.append(a.logits)
        outs[name] = torch.stack(rows)
    # the prompt step and each decode step rotate natively once per layer, for fused only
    assert len(calls) == 4 * ckpt.num_layers
    torch.testing.assert_close(outs["fused"], outs["ops"], rtol=1e-4, atol=1e-4)


@needs_kernels
@pytest.mark.parametrize(("weights", "kv_cache"), [("int8", "int8"), ("int8", "fp16"), ("int4", "int8")])
def test_whole_native_decode_layers_give_the_python_paths_bits(tiny_checkpoint, weights, kv_cache, monkeypatch):
    if not quant.vnni_available():
        pytest.skip("the vnni int8 kernel has no SIMD path on this CPU (neither AVX512-VNNI nor AVX2)")
    # vnni where it runs, also where fbgemm is the default (AVX2 without VNNI): what the C layer reads
    monkeypatch.setattr(quant, "default_kernel", lambda: "vnni")
    monkeypatch.setattr(int4, "default_kernel", lambda: "ours")  # the int4 kernel the C layer calls (not torch's)
    ckpt = open_checkpoint(tiny_checkpoint)
    module = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), weights)
    whole, python = StageExecutor(module, kv_cache=kv_cache), StageExecutor(module, kv_cache=kv_cache)
    assert whole.decode_layers is not None
    python.use_path("native")
    calls = []
    layers = whole.decode_layers
    whole.path.decode_layers = lambda *a: calls.append(a[0].shape[0]) or layers(*a)
    ids = torch.randint(10, 500, (20,), generator=torch.Generator().manual_seed(3))
    many = ops.DecodeLayers.MAX_ROWS + 1  # a step of more sessions than the C layer takes runs the Python path
    outs = {}
    for name, ex in (("whole", whole), ("python", python)):
        rows = []
        for n in (2, many):
            sids = [f"{name}{n}-{i}" for i in range(n)]
            ex.step([(sid, StepInput(0, input_ids=ids[: 5 + i])) for i, sid in enumerate(sids)])
            for token in (3, 77, 410):
                steps = [(sid, StepInput(ex.sessions[sid].length, input_ids=torch.tensor([token]))) for sid in sids]
                rows += [out.logits for out in ex.step(steps)]
        outs[name] = torch.stack(rows)
    assert calls == [2, 2, 2]  # the two-session steps ran as whole native layers, the wider ones did not
    assert torch.equal(outs["whole"], outs["python"])  # the same functions in the same order: the same bits


@needs_kernels
def test_part_clocks_build_gives_the_same_bits_and_times_every_part(tiny_checkpoint, tmp_path, monkeypatch):
    """bench/decode_parts.py runs decode steps on the int8 kernel built with -DEI_PART_TIMES: the clocks must not
    change a bit of the step, and every part of the layer must have been timed; the plain build has no clocks."""
    if not quant.vnni_available():
        pytest.skip("the vnni int8 kernel has no SIMD path on this CPU (neither AVX512-VNNI nor AVX2)")
    import ctypes

    monkeypatch.setattr(quant, "default_kernel", lambda: "vnni")
    timed = bindings.variant(build.Q8_SOURCE, tmp_path / "timed.so", "EI_PART_TIMES")  # as the bench builds it
    ckpt = open_checkpoint(tiny_checkpoint)
    module = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8")
    plain, clocked = StageExecutor(module), StageExecutor(module)
    clocked.decode_layers.lib = timed
    clocks = (ctypes.c_double * 6)()
    assert bindings.q8_library().ei_q8_part_times(ctypes.addressof(clocks)) == 0
    logits = {}
    for name, ex in (("plain", plain), ("clocked", clocked)):
        ex.step([("s", StepInput(0, input_ids=torch.arange(10, 17)))])
        timed.ei_q8_part_times(ctypes.addressof(clocks))  # the prompt ran no decode layer; clears in any case
        logits[name] = [ex.step([("s", StepInput(7 + i, input_ids=torch.tensor([t])))])[0].logits for i, t in
                        enumerate((3, 77, 410))]  # fmt: skip
        if name == "clocked":
            assert timed.ei_q8_part_times(ctypes.addressof(clocks)) == 6
            assert all(c > 0 for c in clocks), list(clocks)  # elementwise, qkv, attention, o, gate_up, down
    assert all(torch.equal(a, b) for a, b in zip(logits["plain"], logits["clocked"], strict=True))


@needs_kernels
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(16, 16, 128), (3, 3, 128), (4, 2, 256)])
def test_fixed_point_int8_attention_stays_within_its_rounding_and_gives_each_heads_bits(
    heads, kv_heads, head_dim, tmp_path, monkeypatch
):
    """bench/perf_decode_attention.py times decode_attention.c built with -DEI_FIXED_ATTENTION (int8 heads in 16-bit
    fixed point, off by default): its output stays within the rounding it documents (~7e-5 relative) of fp32 SDPA over
    the stored rows, and a head attended beside another (paired) gets the bits it gets alone."""
    if "avx512_vnni" not in cpu.cpu_flags():
        pytest.skip("the fixed-point loops need AVX512-VNNI")

    fixed = bindings.variant(build.SOURCE, tmp_path / "fixed.so", "EI_FIXED_ATTENTION")  # as the bench builds it
    plain = bindings.library()
    g, past, scale = torch.Generator().manual_seed(head_dim + heads), 300, head_dim**-0.5
    kv = KVBuffer(1, kv_heads, head_dim, torch.int8, capacity=past + 1)
    kv.data.zero_()
    kv.write(0, *(torch.randn(kv_heads, past, head_dim, generator=g) for _ in range(2)), 0)
    q = torch.randn(1, heads, head_dim, generator=g) * 3  # sharper softmax than randn alone: weights far apart
    k, v = (torch.randn(1, kv_heads, head_dim, generator=g) for _ in range(2))
    got, data = {}, kv.data.clone()
    for name, lib in (("fixed", fixed), ("float", plain)):
        monkeypatch.setattr(bindings, "library", lambda lib=lib: lib)
        kv.data.copy_(data)  # the same rows for each build; each stores the same new row at `past`
        got[name] = ops.DecodeAttention([kv], [past])(0, q, k, v, scale)[0]
        if name == "fixed":
            alone = []
            group = heads // kv_heads
            for h in range(heads):
                one = KVBuffer(1, 1, head_dim, torch.int8, capacity=past + 1)
                one.data.copy_(kv.data[:, :, h // group : h // group + 1])
                j = h // group
                step = ops.DecodeAttention([one], [past])
                alone.append(step(0, q[:, h : h + 1], k[:, j : j + 1], v[:, j : j + 1], scale)[0])
            assert torch.equal(got[name], torch.cat(alone))  # paired or alone, the same arithmetic per head
    want = sdpa_one_row(q[0], *kv.view(0, past + 1), scale)
    error = ((got["fixed"] - want).norm() / want.norm()).item()
    assert 1e-6 < error < 3e-4  # really the fixed-point loops (the float ones are ~5e-7 off), within their rounding
    torch.testing.assert_close(got["float"], want, atol=2e-5, rtol=1e-4)


@needs_kernels
def test_decode_layers_take_their_attention_from_the_build_they_are_given(tmp_path, monkeypatch):
    """bench/perf_decode_attention.py times whole decode steps with each attention build (use_attention): the
    fixed-point build must really run inside the native layers (other logits, close to the default's), and going
    back to the default build must give the default's bits again."""
    if "avx512_vnni" not in cpu.cpu_flags():
        pytest.skip("the fixed-point loops and the native int8 layers need AVX512-VNNI")
    from edgeinspect.models.tiny import TinySpec, make_tiny

    monkeypatch.setattr(quant, "default_kernel", lambda: "vnni")
    spec = TinySpec(layers=2, hidden=256, heads=2, kv_heads=2, intermediate=256)  # head_dim 128: the fixed loops run
    ckpt = open_checkpoint(make_tiny(tmp_path / "hd128", spec))
    ex = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "int8"))
    assert ex.decode_layers is not None and ex.head_dim == 128
    fixed = bindings.variant(build.SOURCE, tmp_path / "fixed.so", "EI_FIXED_ATTENTION")  # as the bench builds it
    logits = {}
    for name, lib in (("default", bindings.library()), ("fixed", fixed), ("back", bindings.library())):
        ex.decode_layers.use_attention(lib)
        ex.step([(name, StepInput(0, input_ids=torch.arange(10, 60)))])  # the prompt: its own path, not the layers'
        logits[name] = torch.stack([ex.step([(name, StepInput(50 + i, input_ids=torch.tensor([t])))])[0].logits
                                    for i, t in enumerate((3, 77, 41))])  # fmt: skip
    assert torch.equal(logits["back"], logits["default"])
    assert not torch.equal(logits["fixed"], logits["default"])  # the fixed loops ran in the layers
    assert cosine_similarity(logits["fixed"], logits["default"], dim=-1).min() > 0.9999  # 1.7e-5 off here
