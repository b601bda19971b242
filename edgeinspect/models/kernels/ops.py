"""The torch-facing functions of the native kernels: tensors in, tensors out, each a call into a library of
bindings.py. The linears (models/quant.py, models/int4.py), the stage's native layer path (models/stage) and the
vision tower call these; none of them is called where bindings.py's library is None (callers check first).
"""

from __future__ import annotations

import ctypes

import torch

from edgeinspect.models.kernels import bindings
from edgeinspect.models.kernels.bindings import LayerOps, Q8Layer, Q8Weight
from edgeinspect.models.kv import KVBuffer

# Activation rows (both passes counted) up to which the vnni linear runs its own GEMV; above, the int32 GEMM
# (q8_int_mm), which is the faster at prompt sizes but reads weights at half of memory speed for a single row.
Q8_GEMV_ROWS = 16
# Most bytes of int32 output one q8_int_mm call of a prompt makes. Past 32 MiB (glibc's top mmap threshold) each
# call faults a fresh buffer in, but oneDNN gains more from the rows than that costs: a 974-token 1.3B int6 prefill
# (gate_up's output 43 MB) took 3.35 s whole against 3.42 s in two blocks under 32 MiB (Zen 4, 8 interleaved rounds).
Q8_OUTPUT_BYTES = 64 << 20


def int8_rows_prep(x: torch.Tensor, two_pass: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """x [R, K] fp32 (rows may be strided) -> (rows [R or 2R, K] for fbgemm, norm [R], gain or 0: one pass)."""
    lib = bindings.rows_library()
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    r, k = x.shape
    out = torch.empty(2 * r if two_pass else r, k)
    norm = torch.empty(r)
    threads = torch.get_num_threads()
    gain = lib.ei_rows_prep(r, k, x.data_ptr(), x.stride(0), out.data_ptr(), norm.data_ptr(), int(two_pass), threads)
    return (out if gain else out[:r]), norm, gain


def int8_rows_finish(y: torch.Tensor, norm: torch.Tensor, gain: float) -> torch.Tensor:
    """fbgemm's output [R or 2R, N] -> [R, N]: the residual rows folded back in, each row scaled by its norm."""
    lib = bindings.rows_library()
    r, n = norm.shape[0], y.shape[1]
    if not y.is_contiguous():
        y = y.contiguous()
    out = y[:r]  # in place: row r is read (with row R + r) before it is written; a fresh [R, N] would page-fault
    lib.ei_rows_finish(
        r, n, y.data_ptr(), y.stride(0), out.data_ptr(), norm.data_ptr(), 1.0 / gain if gain else 0.0,
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def q8_int_mm(xq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """xq [R, K] int8 @ weight [N, K] int8 .T -> [R, N] int32, exact: torch._int_mm (oneDNN) where the kernel has
    its VNNI path; elsewhere oneDNN falls back to a reference loop (~170x slower than fbgemm on AVX2), and our
    AVX2 or NEON GEMM (ei_q8_mm) gives the same int32 sums."""
    lib = bindings.q8_library()
    if lib.ei_q8_simd() == 2:
        return torch._int_mm(xq, weight.t())  # pyright: ignore[reportPrivateImportUsage]  # torch leaves it out of __all__
    acc = torch.empty(xq.shape[0], weight.shape[0], dtype=torch.int32)
    rc = lib.ei_q8_mm(
        xq.shape[0], weight.shape[0], xq.shape[1], xq.data_ptr(), weight.data_ptr(), acc.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("int8 prompt GEMM could not allocate its widened activations or weight panels")
    return acc


def q8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    row_sums: torch.Tensor,
    two_pass: bool,
    rotate: int = 0,
    gated: bool = False,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
) -> torch.Tensor:
    """x [R, K] fp32 (rows may be strided) @ (weight [N, K] int8 * scales [N]).T -> [R, N] fp32, activations
    quantized per row to int8 (two passes: + the residual). Few rows: our GEMV; more: q8_int_mm.

    `rotate` B: rows are rotated by block Hadamard before quantizing (the weight is stored rotated: Int8Linear, which
    then asks for one pass: the rotation brings one pass's error near the residual pass's; models/quant.py).

    `gated`: the linear is a fused gate/up projection and the result is silu(gate) * up [R, N/2] (one pass);
    prompt rows go from q8_int_mm's int32 straight to it (ei_silu_mul_q8), the same bits as silu_mul(y).

    `bias` [N] fp32 (ungated only): added as prompt rows are scaled (ei_q8_finish), after the GEMV for decode rows;
    `gelu`: then GELU in its tanh form (the vision MLP's first linear), by the same C code on either path."""
    lib = bindings.q8_library()
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    (r, k), n = x.shape, weight.shape[0]
    passes = 2 if two_pass else 1
    threads = torch.get_num_threads()
    if gated and (two_pass or rotate or bias is not None or gelu):
        raise ValueError("a gated linear takes one pass, unrotated, without bias or GELU")
    if passes * r <= Q8_GEMV_ROWS and gated:
        return silu_mul(q8_linear(x, weight, scales, row_sums, False))
    y = torch.empty(r, n // 2 if gated else n)
    if passes * r <= Q8_GEMV_ROWS:  # one call: quantize + GEMV (each torch op or ctypes call here costs ~1% of it)
        rc = lib.ei_q8_gemv_rows(
            r, n, k, int(two_pass), rotate, x.data_ptr(), x.stride(0), weight.data_ptr(), scales.data_ptr(),
            row_sums.data_ptr(), y.data_ptr(), threads,
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("int8 linear could not allocate its activation buffer")
        if bias is not None:
            y.add_(bias)
        if gelu:
            lib.ei_gelu_tanh(y.numel(), y.data_ptr())
        return y
    block = max(Q8_GEMV_ROWS, Q8_OUTPUT_BYTES // (4 * n * passes))  # rows of int32 output per GEMM call
    for r0 in range(0, r, block):
        rows = min(block, r - r0)
        xq = torch.empty(passes * rows, k, dtype=torch.int8)
        xs = torch.empty(passes * rows)
        xr = x[r0 : r0 + rows]
        rc = lib.ei_q8_prep(
            rows, k, xr.data_ptr(), x.stride(0), int(two_pass), rotate, xq.data_ptr(), xs.data_ptr(), threads
        )
        if rc != 0:
            raise MemoryError("int8 linear could not allocate its rotation buffers")
        acc = q8_int_mm(xq, weight)  # [passes * rows, N] int32
        out = y[r0 : r0 + rows]
        if gated:
            bindings.library().ei_silu_mul_q8(
                rows, n // 2, acc.data_ptr(), xs.data_ptr(), scales.data_ptr(), out.data_ptr()
            )
            continue
        lib.ei_q8_finish(
            rows, n, int(two_pass), acc.data_ptr(), xs.data_ptr(), scales.data_ptr(),
            None if bias is None else bias.data_ptr(), int(gelu), out.data_ptr(), threads,
        )  # fmt: skip
    return y


def int4_gemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """x [R, K] fp32 (rows may be strided) @ the int4 weight (packed [N, K/2] uint8, scales [N, K/32] fp16).T
    -> [R, N] fp32; bits 6: the q6 weight (packed [N, K * 3/4], models/int4.py)."""
    lib = bindings.int4_library()
    n, k = scales.shape[0], x.shape[1]
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    y = torch.empty(x.shape[0], n)
    rc = (lib.ei_int6_gemm if bits == 6 else lib.ei_int4_gemm)(
        x.shape[0], n, k, x.data_ptr(), x.stride(0), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), n,
        torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise (
            MemoryError("int4 matmul could not allocate its activation buffers")
            if rc == -1
            else ValueError(f"int4 matmul needs K divisible by 64, got {k}")
        )
    return y


def prompt_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, scale: float, causal: bool = True
):
    """Causal attention of a prompt chunk: q [H, t, hd] (query i at position past + i) over keys/values
    [H_kv, past + t, hd] (`causal=False`: every query over all of them, as the vision tower's patches attend), all
    fp32 with each head's hd floats contiguous -> [t, H * hd] fp32, with bf16 dot
    products and an fp32 softmax (AVX512-BF16) or in fp32 (AVX2), prompt_attention.c. None where the kernel does
    not take the call (neither instruction set, or a head_dim that is not a multiple of 16): the caller then runs
    SDPA."""
    lib = bindings.prompt_library()
    heads, t, hd = q.shape
    kv_heads, length = keys.shape[0], keys.shape[1]
    if (
        lib is None
        or length != past + t
        or any(x.dtype != torch.float32 or x.stride(-1) != 1 for x in (q, keys, values))
    ):
        return None
    out = torch.empty(t, heads * hd)
    rc = lib.ei_prompt_attention(
        t, past, heads, kv_heads, hd, q.data_ptr(), q.stride(1), q.stride(0), keys.data_ptr(), keys.stride(1),
        keys.stride(0), values.data_ptr(), values.stride(1), values.stride(0), out.data_ptr(), out.stride(0), scale,
        int(causal), torch.get_num_threads(),
    )  # fmt: skip
    if rc == -1:
        raise MemoryError("prompt attention could not allocate its buffers")
    return out if rc == 0 else None


# The elementwise steps of a decode layer (decode_attention.c), for a few fp32 rows whose last dim is contiguous.


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, add: torch.Tensor | None = None):
    """LlamaRMSNorm(x) [R, D] in fp32; with `add`, (x + add, its norm) with no torch op in between."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    if add is not None and add.stride(-1) != 1:
        add = add.contiguous()
    r, d = x.shape
    out = torch.empty(r, d)
    total = torch.empty(r, d) if add is not None else None
    bindings.library().ei_add_rmsnorm(
        r, d, x.data_ptr(), x.stride(0), None if add is None else add.data_ptr(), 0 if add is None else add.stride(0),
        None if total is None else total.data_ptr(), weight.data_ptr(), eps, out.data_ptr(),
    )  # fmt: skip
    return out if add is None else (total, out)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """apply_rotary_pos_emb in place: q [R, H, hd], k [R, H_kv, hd] (heads contiguous), cos/sin [R, hd]."""
    r, heads, hd = q.shape
    bindings.library().ei_rope(
        r, heads, k.shape[1], hd, q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), cos.data_ptr(), sin.data_ptr()
    )


def store_rows_q8(kv: KVBuffer, layer: int, keys: torch.Tensor, values: torch.Tensor, at: int) -> None:
    """KVBuffer.write for an int8 buffer, natively: keys/values [T, H_kv, hd] fp32 (heads contiguous, rows may be
    strided) into positions [at, at + T) of `layer`, the same bytes as quantize_rows."""
    lib = bindings.library()
    t, kv_heads, head_dim = keys.shape
    if lib is None or not kv.quantized or not kv.data.is_contiguous() or at + t > kv.capacity:
        raise ValueError("store_rows_q8 needs the native kernels and a contiguous int8 KV buffer with room")
    for which, rows in enumerate((keys, values)):
        if rows.dtype != torch.float32 or rows.shape != (t, *kv.shape[2:]) or rows.stride()[1:] != (head_dim, 1):
            raise ValueError(f"store_rows_q8: want [{t}, {kv.shape[2]}, {kv.shape[3]}] fp32 rows, got {rows.shape}")
        lib.ei_store_rows_q8(
            t, layer, which, rows.data_ptr(), rows.stride(0), kv.data.data_ptr(), kv.capacity, at, kv_heads,
            head_dim, torch.get_num_threads(),
        )  # fmt: skip


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[R, 2I] (gate | up) -> silu(gate) * up [R, I] (rows may be strided; the last dim contiguous)."""
    r, width = gate_up.shape
    out = torch.empty(r, width // 2)
    bindings.library().ei_silu_mul(r, width // 2, gate_up.data_ptr(), gate_up.stride(0), out.data_ptr())
    return out


class DecodeLayers:
    """A stage's decode layers in one native call (int8_vnni.c ei_q8_decode_layers), for stages whose four
    projections per layer are fused vnni Int8Linears or Int4Linears on our kernel (int4 stages: down_proj int8):
    the same steps and functions as NativeLayers.decode_layer (models/stage/layers.py),
    so the same bits, without its ~20 Python calls per layer. Rows: one per session, at most MAX_ROWS (beyond
    that q8_linear's own GEMV/_int_mm choice applies, and the Python path runs)."""

    MAX_ROWS = Q8_GEMV_ROWS // 2  # a down_proj too narrow to rotate takes two passes (models/quant.py)

    def __init__(self, layers, heads: int, kv_heads: int, head_dim: int):
        from edgeinspect.models.int4 import Int4Linear  # it imports this module

        self.lib, attention = bindings.q8_library(), bindings.library()
        self.keep = list(layers)  # the structs point into these modules' tensors
        self.layers = (Q8Layer * len(self.keep))()
        int4 = bindings.int4_library()
        gemms = (
            {b: ctypes.cast(getattr(int4, f"ei_int{b}_gemm"), ctypes.c_void_p).value for b in (4, 6)} if int4 else {}
        )
        for j, layer in enumerate(self.keep):
            attn, mlp = layer.self_attn, layer.mlp
            parts = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj, "down": mlp.down_proj}
            for name, lin in parts.items():
                shape = (lin.out_features, lin.in_features)
                if isinstance(lin, Int4Linear):  # its decode rows: ei_int4_gemm (int6: ei_int6_gemm), as its forward
                    gemm = gemms.get(lin.bits)
                    weight = Q8Weight(lin.packed.data_ptr(), lin.scales.data_ptr(), None, *shape, 0, 0, gemm)
                else:
                    tensors = (lin.qweight.data_ptr(), lin.scales.data_ptr(), lin.row_sums.data_ptr())
                    weight = Q8Weight(*tensors, *shape, int(lin.two_pass), lin.rotate)
                setattr(self.layers[j], name, weight)
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            self.layers[j].norm1, self.layers[j].norm2 = n1.weight.data_ptr(), n2.weight.data_ptr()
            self.layers[j].eps1, self.layers[j].eps2 = n1.variance_epsilon, n2.variance_epsilon
            self.layers[j].scale = attn.scaling
            self.layers[j].layer, self.layers[j].heads, self.layers[j].kv_heads = j, heads, kv_heads
            self.layers[j].head_dim = head_dim

        self.use_attention(attention)

    def use_attention(self, lib: ctypes.CDLL) -> None:
        """Takes the layers' norms, rotary, attention and silu * up from `lib`: decode_attention.c built and bound as
        bindings.library() is (the default; a benchmark swaps in a variant build, see variant())."""

        def ops(fn) -> LayerOps:
            names = (fn, lib.ei_add_rmsnorm, lib.ei_rope, lib.ei_silu_mul)
            return LayerOps(*(ctypes.cast(f, ctypes.c_void_p).value for f in names))

        self.attention_lib = lib  # the pointers below point into it
        self.ops = {torch.int8: ops(lib.ei_decode_attention_q8), torch.float16: ops(lib.ei_decode_attention_f16)}

    @staticmethod
    def fits(layers) -> bool:
        """Whether every layer's projections are fused and bias-free, each a vnni Int8Linear or an Int4Linear on
        our int4 kernel (what the C layer reads)."""
        from edgeinspect.models.int4 import Int4Linear  # both import this module
        from edgeinspect.models.quant import Int8Linear

        def readable(m) -> bool:
            if isinstance(m, Int4Linear):
                return m.kernel == "ours" and m.bias is None and bindings.int4_library() is not None
            return isinstance(m, Int8Linear) and m.kernel == "vnni" and m.bias is None

        if bindings.q8_library() is None or bindings.library() is None:
            return False
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            lins = [getattr(attn, "qkv_proj", None), attn.o_proj, getattr(mlp, "gate_up_proj", None), mlp.down_proj]
            if not all(readable(m) for m in lins):
                return False
        return True

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: DecodeAttention):
        """x [R, D] fp32 (R = the attention's sessions) through every layer -> a new [R, D]."""
        r = x.shape[0]
        if r != attention.n or r > self.MAX_ROWS:
            raise ValueError(f"native decode layers take 1..{self.MAX_ROWS} rows, one per session; got {r}")
        x = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)  # updated in place by every layer
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        scratch = torch.empty(self.lib.ei_q8_layer_scratch(self.layers[0], r))
        ops, threads = ctypes.byref(self.ops[attention.dtype]), torch.get_num_threads()
        args = (x.data_ptr(), cos.data_ptr(), sin.data_ptr(), attention.caches, attention.capacities)
        rc = self.lib.ei_q8_decode_layers(
            self.layers, len(self.keep), ops, r, *args, attention.pasts, scratch.data_ptr(), threads
        )  # every layer in one call
        if rc != 0:
            raise MemoryError("a native decode layer could not allocate its buffers")
        return x


class DecodeAttention:
    """One step's decode attention for sessions that each add one row, built once per step and called per layer.

    The caches must hold room for the new row (KVBuffer.reserve) and stay where they are for the whole step.
    """

    def __init__(self, buffers: list[KVBuffer], pasts: list[int]):
        lib = bindings.library()
        if lib is None:
            raise RuntimeError("native kernels are not available here")
        dtype = buffers[0].dtype
        for kv, past in zip(buffers, pasts, strict=True):
            if kv.dtype != dtype or dtype not in (torch.float16, torch.int8):
                raise ValueError("decode attention needs KV buffers all fp16 or all int8 rows")
            if not kv.data.is_contiguous() or past >= kv.capacity:
                raise ValueError("decode attention needs contiguous KV buffers with room for one more row")
        n = len(buffers)
        self.dtype = dtype
        self.fn = lib.ei_decode_attention_q8 if dtype == torch.int8 else lib.ei_decode_attention_f16
        self.n, self.kv_heads, self.head_dim = n, buffers[0].shape[2], buffers[0].shape[3]
        self.caches = (ctypes.c_void_p * n)(*(kv.data.data_ptr() for kv in buffers))
        self.capacities = (ctypes.c_int64 * n)(*(kv.capacity for kv in buffers))
        self.pasts = (ctypes.c_int * n)(*pasts)
        self.keep = buffers  # the pointers above are only valid while these live

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B, H, hd], k/v [B, H_kv, hd] fp32 (rows may be strided, heads contiguous) -> [B, H * hd] fp32."""
        b, heads, head_dim = q.shape
        for t, h in ((q, heads), (k, self.kv_heads), (v, self.kv_heads)):
            if t.dtype != torch.float32 or t.shape != (self.n, h, self.head_dim) or t.stride()[1:] != (head_dim, 1):
                raise ValueError(f"decode attention: want [{self.n}, {h}, {self.head_dim}] fp32 rows, got {t.shape}")
        if heads % self.kv_heads:
            raise ValueError(f"{heads} query heads do not group over {self.kv_heads} kv heads")
        out = torch.empty(b, heads * head_dim)
        rc = self.fn(
            self.n, layer, q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
            self.caches, self.capacities, self.pasts, out.data_ptr(),
            heads, self.kv_heads, head_dim, scale, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise MemoryError("decode attention could not allocate its score buffers")
        return out
