"""Weight formats for decoder stages: int8 weights with per-output-channel scales; 16-bit weights on CPUs
without bf16 instructions.

An int8 stage keeps activations, norms, attention and the KV cache in fp32 and replaces every nn.Linear of its
layers (and the lm_head) by Int8Linear. The kernel is picked once per process by what this CPU runs fast:

- "vnni" (the default on CPUs with AVX512-VNNI, where the native kernels build): int8 weights kept row-major,
  activations quantized per row to int8 (TWO_PASS_LINEARS' weights and activations are rotated by block Hadamard,
  so their rows take one pass at about the error of two unrotated ones). Decode rows run our GEMV
  (models/kernels/int8_vnni.c): a 1.3B step's linears at 0.82x the speed of a plain read of the same bytes, where
  fbgemm's packed GEMV reaches 0.75x (1.1x faster); prompts run torch._int_mm (oneDNN) over the same bytes, 1.14x
  fbgemm's GEMM on a 256-row layer block. One copy of the weights serves both (bench/perf_int8_kernel.py).
  On AVX2 without VNNI it builds an AVX2 GEMV and its own exact int32 GEMM for prompts (torch._int_mm there is a
  reference loop): on a Zen 3 EPYC its 256-row GEMM runs at ~0.85-1.0x fbgemm's speed, and a whole 1.3B stage
  runs a report 0.89x fbgemm's time (the rotated down projection takes one pass; bench/perf_int8_stage.py), so it
  is the default there too. On arm64 it builds NEON forms of both (sdot where the CPU has dot products), the
  default there as well: the same exact int32 sums as on x86 (tests/test_kernels_arm64.py), measured on ARM only in
  instructions under emulation (bench/arm64_instructions.py), not in time.
- "fbgemm": torch's dynamic-quantized linear (int8 weights prepacked per channel, uint8 activations). Measured here
  (AVX2, no VNNI) it is ~3x faster than fp32 at one row and barely slower at 4 rows, where fp32 GEMM falls off a
  cliff. fbgemm quantizes activations per tensor; we give it rows scaled to absmax 1 (so the scale is per token)
  and, for the linears in TWO_PASS_LINEARS, a second row per token holding the first pass's rounding residual
  (see Int8Linear._fbgemm_two_pass). Weights: see quantize_pair_bounded.
- "int8pack": `aten._weight_int8pack_mm` (weight-only; bf16 activations): the fallback where fbgemm is missing.
  Here it is no faster than the fp16 packed kernel at one row (18 ms for the 1.3B lm_head, like fp16) and 2-4x
  slower than fbgemm.
- "dequant": int8 -> fp32 then F.linear, always available, only saves memory.

bf16 weights on a CPU without AMX/AVX512-BF16 (this one: AVX2) make torch emulate bf16 GEMM: as slow as fp32 at
one row and 4-5x slower at 4 rows. There Half16Linear keeps the weights 16-bit but in fbgemm's packed fp16 form
(F16C conversion + FMA in fp32): bf16 values convert to fp16 exactly unless tiny (< 6e-5, kept as fp16
subnormals) and activations stay fp32. A layer with a weight beyond fp16's range keeps the plain bf16 path.
"""

from __future__ import annotations

import functools
import logging
import warnings

import numpy as np
import torch
from torch import nn

from edgeinspect.models.cpu import fast_bf16, fbgemm_vnni
from edgeinspect.models.kernels import bindings, ops

log = logging.getLogger(__name__)

KERNELS = ("vnni", "fbgemm", "int8pack", "dequant")
# Linears whose activations get a second, residual pass with the fbgemm kernel. down_proj reads silu(gate) * up,
# heavy-tailed: one 8-bit pass there costs 4x the error of its int8 weights (1-cos 4e-4 vs 8e-5 per linear at
# 1.3B dims); elsewhere inputs are post-norm or attention outputs, where one pass costs about what the weights do.
# A second pass costs ~0.1 ms per linear at one row, so it is spent where the error is.
TWO_PASS_LINEARS = frozenset({"down_proj"})
# On the vnni kernel the same linears' activations are rotated by a block Hadamard matrix instead (weights stored
# rotated): the rotation spreads silu(gate) * up's tails, so their rows take one pass at about the error of two
# unrotated ones (first-token logits cosine vs fp32 0.9955, two passes unrotated 0.9952, one pass unrotated 0.9931;
# bench/NOTES.md, "Prefill: the down projection rotated"). Prompt rows: half the GEMM (~16% of a 974-token 1.3B
# prefill). Decode rows: with memory fast a whole 1.3B step takes ~1.4% less time against its read bound (median of
# 10 runs; two passes left this GEMV at 1.16x its bytes there), for perf_accuracy's 1.3B int8 min cosine 0.99621 ->
# 0.99605 (bench/README.md, "Decode: the down projection in one pass"). Widths with no block to rotate by keep two.
MAX_ROTATION_BLOCK = 512


def rotation_block(k: int) -> int:
    """The Hadamard block for width k: its largest power-of-two divisor up to MAX_ROTATION_BLOCK (5632 -> 512),
    or 0 (no rotation) below 16, the kernel's vector width."""
    block = min(k & -k, MAX_ROTATION_BLOCK)
    return block if block >= 16 else 0


def hadamard_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., K] times the orthogonal H_block / sqrt(block) along K, block by block (Sylvester order: the same
    transform int8_vnni.c applies to activation rows; it is its own inverse)."""
    shape = x.shape
    y = x.float().reshape(-1, shape[-1] // block, block)
    h = 1
    while h < block:
        y = y.reshape(*y.shape[:2], block // (2 * h), 2, h)
        y = torch.stack([y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]], dim=-2)
        h *= 2
    return (y.reshape(shape) / block**0.5).contiguous()


def quantize_per_channel(weight: torch.Tensor, qmax: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (int8 [N, K] in [-qmax, qmax], scales [N] float32), symmetric absmax per channel."""
    w = weight.float()
    scales = (w.abs().amax(dim=1) / qmax).clamp(min=1e-12)  # [N]; an all-zero row keeps a usable scale
    q = torch.round(w / scales[:, None]).clamp(-qmax, qmax).to(torch.int8)
    return q, scales


def quantize_pair_bounded(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], scales [N]) with |q[n, 2j]| + |q[n, 2j + 1]| <= 128 for every pair.

    Without VNNI, fbgemm multiplies u8 activations by s8 weights with vpmaddubsw, which adds the products of
    inputs 2j and 2j + 1 in int16 (saturating). With the pair bound, 255 * 128 = 32640 fits: no saturation for any
    activation. Each row's scale is the larger of (its largest pair sum) / 128 and absmax / 127: for Gaussian rows
    of width 2048 that is ~1.4x finer than 7-bit weights (absmax / 63, what saturation forced before).
    """
    w = weight.float()
    n, k = w.shape
    a = nn.functional.pad(w.abs(), (0, k % 2))  # [N, K'] even width: fbgemm pads K with zeros too
    pair_max = a.view(n, -1, 2).sum(-1).amax(dim=1)  # [N]
    scales = torch.maximum(pair_max / 128, a.amax(dim=1) / 127).clamp(min=1e-12)  # [N]
    q = torch.round(w / scales[:, None]).clamp(-127, 127)
    q = nn.functional.pad(q, (0, k % 2)).view(n, -1, 2)  # [N, K'/2, 2]
    # rounding both halves up can reach 129: take the excess (at most 1) off the larger magnitude
    excess = (q.abs().sum(-1) - 128).clamp(min=0)  # [N, K'/2]
    larger = nn.functional.one_hot(q.abs().argmax(-1), 2).bool()  # [N, K'/2, 2]
    q = q - torch.where(larger, excess[..., None] * q.sign(), torch.zeros_like(q))
    return q.view(n, -1)[:, :k].to(torch.int8), scales


def fbgemm_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fbgemm kernel's weights: full 8 bits where VNNI accumulates in int32, pair-bounded elsewhere."""
    return quantize_per_channel(weight) if fbgemm_vnni() else quantize_pair_bounded(weight)


@functools.cache
def fbgemm_available() -> bool:
    """Whether the dynamic-quantized linear runs here (x86 builds ship fbgemm; ARM builds may not)."""
    try:
        q, s = quantize_per_channel(torch.randn(8, 16))
        packed = _fbgemm_pack(q, s)
        torch.ops.quantized.linear_dynamic(torch.randn(2, 16), packed, True)
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@functools.cache
def int8pack_available() -> bool:
    try:
        q, s = quantize_per_channel(torch.randn(8, 64))
        torch.ops.aten._weight_int8pack_mm(torch.randn(1, 64, dtype=torch.bfloat16), q, s.bfloat16())
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def kernels_simd() -> int:
    """The vnni kernel's SIMD level here: 2 AVX512-VNNI, 1 AVX2 or NEON (our GEMM for prompts), 0 plain C or not
    built."""
    lib = bindings.q8_library()
    return lib.ei_q8_simd() if lib is not None else 0


@functools.cache
def vnni_available() -> bool:
    """Whether the vnni kernel runs a SIMD path here: AVX512-VNNI (prompts on torch._int_mm, which must run), or
    AVX2 or NEON (our GEMM for prompts too); a C compiler either way."""
    if not bindings.q8_fast():
        return False
    if kernels_simd() < 2:
        return True
    try:
        torch._int_mm(torch.ones(17, 64, dtype=torch.int8), torch.ones(64, 8, dtype=torch.int8))  # pyright: ignore[reportPrivateImportUsage]  # torch leaves it out of __all__
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def default_kernel() -> str:
    # On AVX2 without VNNI too: on a Zen 3 EPYC a whole 1.3B int8 stage ran the report's prompt and 80 tokens in
    # 0.89x fbgemm's time (prefill 12.5 vs 13.8 s, decode 67.5 vs 72.8 ms: the rotated down projection takes one
    # pass, fbgemm's two), first-token logits cosine vs fp32 0.9956 vs 0.9919, loaded in 43 vs 117 s
    # (bench/perf_int8_stage.py).
    if vnni_available():
        return "vnni"
    if fbgemm_available():
        return "fbgemm"
    if int8pack_available():
        return "int8pack"
    return "dequant"


def _fbgemm_pack(q: torch.Tensor, scales: torch.Tensor):
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensor creation is flagged deprecated, but still the fbgemm entry
        warnings.simplefilter("ignore")
        qw = torch._make_per_channel_quantized_tensor(q, scales.double(), zeros, 0)  # pyright: ignore[reportPrivateImportUsage]  # torch leaves it out of __all__
        return torch.ops.quantized.linear_prepack(qw, None)


class Int8Linear(nn.Module):
    """y = x @ (q * scale).T (+ bias): int8 weight [N, K] with fp32 scales [N]; fp32 in, fp32 out."""

    def __init__(
        self,
        q: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        kernel: str,
        two_pass: bool = False,
        rotate: int = 0,
    ):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"unknown int8 kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
        if rotate and kernel != "vnni":
            raise ValueError("only the vnni kernel rotates its activations")
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.kernel = kernel
        # the others keep activations in 16/32 bits; rotated rows take one pass (see TWO_PASS_LINEARS)
        self.two_pass = two_pass and kernel in ("fbgemm", "vnni") and not rotate
        self.rotate = rotate  # Hadamard block: q holds (W rotated) quantized, inputs are rotated alike (0: neither)
        self.gelu = False  # GELU (tanh form) applied to the output here: the vision MLP's fc1 (models/vision.py)
        self.bias = None if bias is None else bias.float().contiguous()
        self.scales = scales.float()  # [N]
        # Only the form the kernel reads is kept: fbgemm holds its own packed copy of the int8 weight.
        self.packed = _fbgemm_pack(q, self.scales) if kernel == "fbgemm" else None
        self.qweight = None if kernel == "fbgemm" else q.contiguous()
        self.scales_bf16 = self.scales.bfloat16() if kernel == "int8pack" else None
        # vnni reads activations as unsigned (q + 128): each output takes 128 * its weight row's sum off again
        self.row_sums = q.sum(dim=1, dtype=torch.int32) if kernel == "vnni" else None

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, kernel: str | None = None, two_pass: bool = False, rotate: bool = False
    ) -> Int8Linear:
        """`rotate`: rotate weights and activations by block Hadamard (vnni only; elsewhere ignored)."""
        kernel = kernel or default_kernel()
        w = linear.weight.detach()
        block = rotation_block(w.shape[1]) if rotate and kernel == "vnni" else 0
        if block:
            w = hadamard_blocks(w, block)
        q, s = fbgemm_quantize(w) if kernel == "fbgemm" else quantize_per_channel(w)
        return cls(q, s, None if linear.bias is None else linear.bias.detach(), kernel, two_pass, block)

    def weight_bytes(self) -> int:
        """What a step reads: N*K int8 + N scales."""
        return self.in_features * self.out_features + 4 * self.out_features

    def dequantized(self) -> torch.Tensor:
        """[N, K] float32 (tests and the dequant kernel)."""
        if self.packed is not None:
            w, _ = torch.ops.quantized.linear_unpack(self.packed)
            return w.dequantize()
        w = self.qweight.float() * self.scales[:, None]
        return hadamard_blocks(w, self.rotate) if self.rotate else w  # rotated back: H / sqrt(B) is involutory

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float()  # [R, K]
        if self.kernel == "vnni":
            y = ops.q8_linear(
                x2, self.qweight, self.scales, self.row_sums, self.two_pass, self.rotate, bias=self.bias, gelu=self.gelu
            )
            return y.reshape(*shape[:-1], self.out_features)  # bias (and GELU) applied in the kernel's scaling pass
        elif self.kernel == "fbgemm":
            y = self._fbgemm(x2)
        elif self.kernel == "int8pack":
            y = torch.ops.aten._weight_int8pack_mm(x2.bfloat16(), self.qweight, self.scales_bf16).float()
        else:
            y = nn.functional.linear(x2, self.dequantized())
        if self.bias is not None:
            y = y + self.bias
        if self.gelu:
            y = nn.functional.gelu(y, approximate="tanh")
        return y.reshape(*shape[:-1], self.out_features)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this fused gate/up projection's output [R, 2I] -> [R, I]: on the vnni kernel prompt
        rows go from the int32 GEMM straight to it (ops.q8_linear), never writing [R, 2I] in fp32."""
        x2 = x.reshape(-1, self.in_features)
        if self.kernel == "vnni" and self.bias is None and not self.two_pass and not self.rotate:
            y = ops.q8_linear(x2, self.qweight, self.scales, self.row_sums, False, gated=True)
        else:
            y = ops.silu_mul(self(x2))
        return y.reshape(*x.shape[:-1], self.out_features // 2)

    def _fbgemm(self, x: torch.Tensor) -> torch.Tensor:
        """[R, K] -> [R, N]. 8-bit activations (no reduce_range: the weights' pair bound prevents saturation)."""
        rows = x.shape[0]
        if (rows > 1 or self.two_pass) and native_rows():
            return self._fbgemm_native(x)
        norm = None
        if rows > 1:  # fbgemm's scale is per tensor: rows scaled to absmax 1 make it per row (token)
            norm = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)  # [R, 1]
            x = x / norm
        y = self._fbgemm_two_pass(x) if self.two_pass else None
        if y is None:
            y = torch.ops.quantized.linear_dynamic(x, self.packed, False)
        return y if norm is None else y * norm

    def _fbgemm_native(self, x: torch.Tensor) -> torch.Tensor:
        """The same steps as below in two fused passes (models/kernels/int8_rows.c): at prompt sizes the torch
        ops around the GEMM cost as much as the GEMM (a 974-row down_proj: 124 ms, of which fbgemm 67)."""
        rows, norm, gain = ops.int8_rows_prep(x, self.two_pass)
        y = torch.ops.quantized.linear_dynamic(rows, self.packed, False)
        return ops.int8_rows_finish(y, norm, gain)

    def _fbgemm_two_pass(self, x: torch.Tensor) -> torch.Tensor | None:
        """x @ W.T with activations in ~16 bits: fbgemm runs [x; residual * g] as one call ([2R, K]).

        fbgemm's uint8 grid is reproduced here (its ChooseQuantizationParams and nearbyint(x / scale + zp)), so the
        residual is exactly what the first pass lost. Scaled by g it stays inside the first rows' range, which
        therefore still sets the per-tensor grid. At one row a GEMV reads the weights once for both rows.
        None where the range is one-sided (no room to fit a signed residual): one pass then.
        """
        lo, hi = (float(v) for v in torch.aminmax(x))
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        room = min(-lo, hi) * 0.99
        scale = float(np.float32((hi - lo) / 255))
        if room <= 0 or scale < 1e-30:
            return None
        zero = float(min(max(round(-lo / scale), 0), 255))
        q = torch.clamp(torch.round(x * float(np.float32(1) / np.float32(scale)) + zero), 0, 255)  # [R, K]
        gain = room / (scale / 2)  # |residual| <= scale / 2
        resid = (x - (q - zero) * scale) * gain  # [R, K]
        y = torch.ops.quantized.linear_dynamic(torch.cat([x, resid]), self.packed, False)  # [2R, N]
        rows = x.shape[0]
        return y[:rows] + y[rows:] / gain

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features}, kernel={self.kernel}, two_pass={self.two_pass}, "
            f"rotate={self.rotate}, gelu={self.gelu}"
        )


@functools.cache
def native_rows() -> bool:
    """Whether the fused activation kernel (models/kernels/int8_rows.c) is built here (else torch ops do it)."""
    return bindings.rows_library() is not None


def quantize_linears(module: nn.Module, kernel: str | None = None) -> int:
    """Replaces every nn.Linear under `module` by an Int8Linear in place; returns how many were replaced."""
    kernel = kernel or default_kernel()
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            heavy = name in TWO_PASS_LINEARS
            setattr(module, name, Int8Linear.from_linear(child, kernel, two_pass=heavy, rotate=heavy))
            count += 1
        else:
            count += quantize_linears(child, kernel)
    return count


@functools.cache
def fbgemm_fp16_available() -> bool:
    try:
        packed = torch.ops.quantized.linear_prepack_fp16(torch.randn(8, 16), None)
        torch.ops.quantized.linear_dynamic_fp16(torch.randn(2, 16), packed)
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


FP16_MAX = 65504.0


class Half16Linear(nn.Module):
    """y = x @ W.T (+ bias) with W held as fbgemm-packed fp16 [N, K]; fp32 in, fp32 out."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)

    @property
    def weight(self) -> torch.Tensor:
        """[N, K] bf16: the values held (unpacked on each access: for inspection, not for compute)."""
        return torch.ops.quantized.linear_unpack_fp16(self.packed)[0].bfloat16()

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        return bool(weight.abs().max() <= FP16_MAX)

    def weight_bytes(self) -> int:
        return 2 * self.in_features * self.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, self.in_features).float(), self.packed)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def half16_linears(module: nn.Module) -> int:
    """Replaces every nn.Linear under `module` whose weight fits fp16 by a Half16Linear; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and Half16Linear.fits(child.weight):
            setattr(module, name, Half16Linear(child.weight.detach(), child.bias))
            count += 1
        elif not isinstance(child, nn.Linear):
            count += half16_linears(child)
    return count


def use_half16(weights: str) -> bool:
    """bf16 weights on a CPU that would emulate bf16 GEMM, where the fbgemm fp16 kernel exists."""
    return weights == "bf16" and not fast_bf16() and fbgemm_fp16_available()


def resolve_weights(name: str) -> str:
    """The format a stage actually runs. load_stage resolves `auto` by measurement first (models/autoformat.py);
    here `auto` is only a guess from CPU flags (bf16 where the CPU has bf16 instructions, else fp32) for callers
    without a checkpoint to measure. It is often wrong: see autoformat's docstring."""
    if name == "auto":
        chosen = "bf16" if fast_bf16() else "fp32"
        log.info("weights auto -> %s (fast bf16 on this CPU: %s)", chosen, fast_bf16())
        return chosen
    if name == "bf16" and not fast_bf16():
        log.info("bf16 weights on a CPU without AMX/AVX512-BF16: linears run fbgemm's fp16 kernel (fp32 activations)")
    return name


def fuse_projections(layer: nn.Module) -> None:
    """q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj` (weights stacked by output rows).

    A decode step is a read of every weight: two large GEMMs read the same bytes as five small ones with fewer
    kernel launches and thread barriers (measured 10-15% faster per layer with fbgemm's fp16 kernel, one thread).
    Each output row keeps its own weights and per-row scales, so results equal the separate projections' up to
    summation order. fp32 stages keep them separate: only then do batched steps match generate() bit for bit.
    """
    attn, mlp = layer.self_attn, layer.mlp
    for name, parts in (
        ("qkv_proj", (attn, "q_proj", "k_proj", "v_proj")),
        ("gate_up_proj", (mlp, "gate_proj", "up_proj")),
    ):
        owner, *names = parts
        linears = [getattr(owner, n) for n in names]
        fused = nn.Linear(
            linears[0].in_features, sum(x.out_features for x in linears), bias=linears[0].bias is not None
        )
        fused.weight = nn.Parameter(torch.cat([x.weight for x in linears]), requires_grad=False)
        if fused.bias is not None:
            fused.bias = nn.Parameter(torch.cat([x.bias for x in linears]), requires_grad=False)
        setattr(owner, name, fused)
        for n in names:
            delattr(owner, n)
