"""int4 weights for decode: group-wise scales on llama.cpp's q4_0 grid, half of int8's bytes per step.

A decode step reads every weight once, so its time is the weight bytes over memory bandwidth: 4-bit weights
with one fp16 scale per 32 (18 bytes per 32 weights, 0.56 bytes per weight vs int8's 1.0) cut that read almost in
half. Two matmul kernels read it: our own (models/kernels/int4_gemm.c: activations quantized per group of 32 to
int8, VNNI dot products, one FMA per group) and torch's `_weight_int4pack_mm_for_cpu` (bf16 activations; the
same grid with zero points 0). Which is faster depends on the CPU (on an AVX512-BF16 Xeon, 1.3B shapes, 2
threads, min over interleaved rounds: ours 2.00 ms per layer's linears, torch's ~10% slower, fbgemm int8 2.69,
with decode rows reading four weight rows side by side; on a Zen 5 EPYC that order read at 0.69x of a plain sum's
speed and one row after another, what the kernel does now, at 0.79-0.84x; bench/perf_int4_kernel.py), so
default_kernel() times both once per process and takes the faster.

Prompt chunks are compute-bound, not read-bound: there 4 bits buy nothing and our kernel has no GEMM blocking, so
each Int4Linear also keeps the fbgemm int8 form of the same weight (models/quant.py, quantized from the original
weights) for steps of more than DECODE_ROWS rows. A stage thus holds 1.56 bytes per weight (int8's 1.0 + 0.56);
a decode step reads only the 0.56.

Grid (q4_0): per group of 32, d = v / -8 where v is the value of largest magnitude (sign kept), q = round(w / d)
+ 8 clamped to [0, 15], w ~ (q - 8) * d; the extreme value lands exactly on -8 * d.
Packing (what the kernel reads): per row, vectors V of 64 weights in 32 bytes, byte j holding V[j] (low nibble)
and V[j + 32] (high nibble). In each full super-block of 512 weights (16 groups) vector v's 4-byte lane g holds
group g's elements 4v..4v+3 (vector_order), so each of the kernel's dot-product lanes sums one group and its scales
are applied once per 512 weights, not per 64 (on the Zen 4, 1.3B decode shapes with memory at 38-60 GB/s: int6
1.17x -> 1.10x the time of a sum of as many bytes, int4 1.43x -> 1.10x); the last K % 512 weights are plain
blocks, V = 64 consecutive elements.

int6 (Int6Linear, `weights: int6`): the same scheme on a 64-step grid, d = v / -32, q in [0, 63] for (q - 32) * d,
26 bytes per 32 weights (0.81 of int8's bytes). int4 cannot meet the logits-cosine target on the random 1.3B
checkpoint (0.93; bench/perf_int4_bound.py: it needs >= 4.85 bits per weight there); q6's relative weight error
is a quarter of q4_0's (0.021 vs 0.086), and with every linear at 6 bits, down_proj and the lm_head too, the 1.3B
logits kept min cosine 0.992 (int8 0.996; bench/results/perf_accuracy.json).
Packing: the int4 vector's 32 bytes of low nibbles, then 16 bytes of top bit pairs, byte k holding bits 4-5 of
V[k], V[k + 16], V[k + 32], V[k + 48] in its pairs 0-1, 2-3, 4-5, 6-7 (models/kernels/int4_gemm.c unpacks them with
one broadcast load and per-lane shifts).
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import torch
from torch import nn

from edgeinspect.models.kernels import bindings, ops
from edgeinspect.models.quant import TWO_PASS_LINEARS, Int8Linear

log = logging.getLogger(__name__)

GROUP = 32
KERNEL_TRIAL_ROUNDS = 15
BLOCK = 64  # the kernel's unit: one vector of 64 weights in one 32-byte load (int6: 48)
SUPER = 512  # 16 groups whose lanes share each vector (see the module docstring)
DECODE_ROWS = 8  # steps of at most this many rows (decode, batched decode) read the int4 weights
# Linears an int4 stage keeps in int8 (as llama.cpp's Q4_K_M keeps some tensors at higher precision): down_proj
# reads the heavy-tailed silu(gate) * up and its error is what int4 adds most to; the lm_head's error lands on the
# logits directly. Measured on the mid-size checkpoint (std 0.02, teacher-forced decode steps): every linear int4
# min cosine 0.985, lm_head int8 0.988, lm_head + down_proj int8 0.9905. load_stage keeps the lm_head int8.
INT8_LINEARS = frozenset({"down_proj"})


def fits(linear: nn.Linear) -> bool:
    """Whether a linear's input width suits the kernel's 64-wide blocks."""
    return linear.in_features % BLOCK == 0


def quantize_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (K % 64 == 0) -> (q [N, K] uint8 in [0, 15], scales [N, K/32] fp16) on the q4_0 grid."""
    n, k = weight.shape
    w = weight.float().reshape(n, k // GROUP, GROUP)  # [N, G, 32]
    idx = w.abs().argmax(dim=-1, keepdim=True)
    d = (w.gather(-1, idx) / -8).squeeze(-1)  # [N, G], signed like q4_0
    d16 = d.half()
    inv = torch.where(d16 != 0, 1 / d16.float(), torch.zeros_like(d))  # divide by the scale actually stored
    q = torch.clamp(torch.round(w * inv[..., None]) + 8, 0, 15).to(torch.uint8)
    return q.reshape(n, k), d16


def vector_order(k: int) -> torch.Tensor:
    """[K] int64: the natural element index at each position of the kernel's vectors (see the module docstring):
    in each full super-block of 512, vector v's 4-byte lane g holds group g's elements 4v..4v+3; the last K % 512
    stay in order."""
    head = k // SUPER * SUPER
    lanes = torch.arange(head).reshape(-1, SUPER // GROUP, GROUP // 4, 4).transpose(1, 2)  # [S, v, g, 4]
    return torch.cat([lanes.reshape(-1), torch.arange(head, k)])


def _pack_nibbles(v: torch.Tensor) -> torch.Tensor:
    """[N, K] values < 16 in vector order -> [N, K/2]: per vector of 64, byte j = V[j] | V[j + 32] << 4."""
    n, k = v.shape
    blocks = v.reshape(n, k // BLOCK, 2, 32)  # [N, B, half, 32]
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    n, half = packed.shape
    blocks = packed.reshape(n, half // 32, 32)
    return torch.stack([blocks & 0x0F, blocks >> 4], dim=2).reshape(n, half * 2)


def _natural(v: torch.Tensor) -> torch.Tensor:
    """[N, K] in vector order -> natural order."""
    q = torch.empty_like(v)
    q[:, vector_order(v.shape[1])] = v
    return q


def pack_q4(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] uint8 in [0, 15] -> [N, K/2] uint8 in the kernel's layout (see the module docstring)."""
    return _pack_nibbles(q[:, vector_order(q.shape[1])])


def unpack_q4(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] -> q [N, K] uint8 (the inverse of pack_q4)."""
    return _natural(_unpack_nibbles(packed))


def dequantize_q4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[N, K] float32: (q - 8) * d per group."""
    q = unpack_q4(packed).float() - 8
    n, k = q.shape
    return (q.reshape(n, k // GROUP, GROUP) * scales.float()[..., None]).reshape(n, k)


def quantize_q6(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (K % 64 == 0) -> (q [N, K] uint8 in [0, 63], scales [N, K/32] fp16): q4_0's rule on 64 steps."""
    n, k = weight.shape
    w = weight.float().reshape(n, k // GROUP, GROUP)
    idx = w.abs().argmax(dim=-1, keepdim=True)
    d16 = (w.gather(-1, idx) / -32).squeeze(-1).half()
    inv = torch.where(d16 != 0, 1 / d16.float(), torch.zeros_like(d16, dtype=torch.float32))
    q = torch.clamp(torch.round(w * inv[..., None]) + 32, 0, 63).to(torch.uint8)
    return q.reshape(n, k), d16


def pack_q6(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] uint8 in [0, 63] -> [N, K * 3/4] uint8: per vector of 64, the low nibbles as pack_q4 lays them, then
    16 bytes of top bit pairs (see the module docstring)."""
    n, k = q.shape
    v = q[:, vector_order(k)]
    nibbles = _pack_nibbles(v & 0x0F).reshape(n, k // BLOCK, 32)
    top = (v >> 4).reshape(n, k // BLOCK, 4, 16)  # [N, B, quarter, 16]: V[16 * quarter + j]
    pairs = top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)
    return torch.cat([nibbles, pairs], dim=2).reshape(n, k // BLOCK * 48).contiguous()


def unpack_q6(packed: torch.Tensor) -> torch.Tensor:
    """[N, K * 3/4] -> q [N, K] uint8 (the inverse of pack_q6)."""
    n = packed.shape[0]
    blocks = packed.reshape(n, -1, 48)
    low = _unpack_nibbles(blocks[:, :, :32].reshape(n, -1))  # [N, K] in vector order
    pairs = blocks[:, :, 32:]  # [N, B, 16]
    top = torch.stack([(pairs >> (2 * i)) & 0x03 for i in range(4)], dim=2)  # [N, B, 4, 16]
    return _natural(low | (top.reshape(n, -1) << 4))


def dequantize_q6(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[N, K] float32: (q - 32) * d per group."""
    q = unpack_q6(packed).float() - 32
    n, k = q.shape
    return (q.reshape(n, k // GROUP, GROUP) * scales.float()[..., None]).reshape(n, k)


@functools.cache
def torch_int4_available() -> bool:
    """Whether this torch build has the CPU int4 packed matmul (`_weight_int4pack_mm_for_cpu`)."""
    try:
        q = torch.randint(0, 16, (64, 64), dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.zeros(2, 64, 2, dtype=torch.bfloat16)
        torch.ops.aten._weight_int4pack_mm_for_cpu(torch.randn(1, 64, dtype=torch.bfloat16), packed, GROUP, sz)
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def available_kernels() -> list[str]:
    out = ["ours"] if bindings.int4_library() is not None else []
    return out + (["torch"] if torch_int4_available() else [])


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (Linux sysfs), or 32 MiB where it cannot be read."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * unit)
        except ValueError:
            continue
    return max(sizes, default=32 << 20)


@functools.cache
def default_kernel() -> str:
    """The faster int4 kernel on this CPU, timed once per process at one row (min over interleaved rounds: robust
    to other jobs preempting us); "dequant" where neither exists. The trial weight (K 2048) holds as many int4
    bytes as the last-level cache, and the two kernels' copies alternate, so each call reads its weight from
    memory as a decode step does: an 8 MB weight stayed in a 32 MB L3 and picked torch's kernel on a Zen 5 EPYC
    where ours reads the 1.3B layers from memory 1.2x faster (bench/perf_int4_kernel.py)."""
    names = available_kernels()
    if len(names) < 2:
        return names[0] if names else "dequant"
    g = torch.Generator().manual_seed(0)
    rows = min(max(4096, last_level_cache_bytes() // 1024), 65536) // 64 * 64  # K / 2 bytes per row
    lin = nn.Linear(2048, rows, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02, generator=g)
    subjects = {k: Int4Linear(lin, prefill=False, kernel=k) for k in names}
    del lin
    x = torch.randn(1, 2048, generator=g)
    best = {k: float("inf") for k in names}
    for _ in range(KERNEL_TRIAL_ROUNDS):
        for k, lin4 in subjects.items():
            t0 = time.perf_counter()
            lin4(x)
            best[k] = min(best[k], time.perf_counter() - t0)
    chosen = min(best, key=lambda k: best[k])
    log.info(
        "int4 kernel -> %s (%s; a [%d, 2048] weight)",
        chosen, ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in best.items()), rows,
    )  # fmt: skip
    return chosen


class Int4Linear(nn.Module):
    """y = x @ W.T (+ bias) with W on the q4_0 grid for decode rows and fbgemm int8 for prompt chunks.

    Kernels: "ours" (models/kernels/int4_gemm.c, int8 activations), "torch" (`_weight_int4pack_mm_for_cpu`, bf16
    activations; the same grid with zero points 0, scales rounded to bf16), "dequant" (fp32 F.linear)."""

    bits = 4

    def __init__(self, linear: nn.Linear, two_pass: bool = False, prefill: bool = True, kernel: str | None = None):
        super().__init__()
        w = linear.weight.detach()
        self.out_features, self.in_features = w.shape
        if not fits(linear):
            raise ValueError(f"int{self.bits} needs an input width divisible by {BLOCK}, got {self.in_features}")
        self.torch_packed = self.torch_scales = None
        self._quantize(w, kernel)
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        # The prompt path: int8 from the original weights (not from the int4 values). None: prompts dequantize.
        self.prefill = Int8Linear.from_linear(linear, two_pass=two_pass, rotate=two_pass) if prefill else None

    def _quantize(self, w: torch.Tensor, kernel: str | None) -> None:
        self.kernel = kernel or default_kernel()
        if self.kernel == "torch" and self.out_features % 16:  # torch's packing wants N divisible by 16
            self.kernel = "ours" if "ours" in available_kernels() else "dequant"
        q, self.scales = quantize_q4(w)  # scales [N, K/32] fp16
        self.packed = pack_q4(q)  # [N, K/2] uint8 (ours; also what dequantized() reads)
        if self.kernel == "torch":
            self.torch_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
            zeros = torch.zeros_like(self.scales)
            # [K/32, N, 2]: w = (q - 8) * scale + zero
            self.torch_scales = torch.stack([self.scales, zeros], -1).transpose(0, 1).contiguous().bfloat16()
            self.packed = None

    def weight_bytes(self) -> int:
        """What a decode step reads: K/2 bytes + K/32 scales (fp16; torch's kernel: bf16 scale + zero) per row."""
        if self.kernel == "torch":
            return self.torch_packed.numel() + 2 * self.torch_scales.numel()
        return self.out_features * self.in_features // 2 + 2 * self.scales.numel()

    def dequantized(self) -> torch.Tensor:
        """[N, K] float32 (tests, the dequant kernel)."""
        if self.packed is None:  # torch's packed layout: read it back through its own matmul on the identity
            eye = torch.eye(self.in_features, dtype=torch.bfloat16)
            return self._torch_mm(eye).T.contiguous()
        return dequantize_q4(self.packed, self.scales)

    def _torch_mm(self, x: torch.Tensor) -> torch.Tensor:
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu
        return mm(x.bfloat16(), self.torch_packed, GROUP, self.torch_scales).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)  # [R, K]
        if x2.shape[0] > DECODE_ROWS and self.prefill is not None:
            return self.prefill(x)
        if self.kernel == "torch":
            y = self._torch_mm(x2)
        elif self.kernel == "ours" and bindings.int4_library() is not None:
            y = ops.int4_gemm(x2, self.packed, self.scales, self.bits)  # [R, N]
        else:
            y = nn.functional.linear(x2.float(), self.dequantized())
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this fused gate/up projection's output [R, 2I] -> [R, I]: prompt chunks through the
        int8 copy's fused form (Int8Linear.silu_mul: on the vnni kernel the [R, 2I] fp32 output is never written,
        ~2 GB of memory traffic over a 974-token 1.3B prefill), decode rows through this linear and
        ops.silu_mul."""
        rows = x.reshape(-1, self.in_features).shape[0]
        if rows > DECODE_ROWS and self.prefill is not None:
            return self.prefill.silu_mul(x)
        y = ops.silu_mul(self(x).reshape(rows, self.out_features))
        return y.reshape(*x.shape[:-1], self.out_features // 2)

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features}, bits={self.bits}, group={GROUP}, kernel={self.kernel},"
            " prefill=int8"
        )


class Int6Linear(Int4Linear):
    """Int4Linear's scheme on the q6 grid (26 bytes per 32 weights, see the module docstring): decode rows on our
    kernel (torch has no 6-bit matmul), prompt chunks on the int8 copy."""

    bits = 6

    def _quantize(self, w: torch.Tensor, kernel: str | None) -> None:
        if kernel not in (None, "ours", "dequant"):
            raise ValueError(f"int6 runs on our kernel or dequantizes, not {kernel!r}")
        self.kernel = kernel or default_kernel()  # int4's pick on this CPU, our kernel where that is torch's
        if self.kernel == "torch":
            self.kernel = "ours" if bindings.int4_library() is not None else "dequant"
        q, self.scales = quantize_q6(w)  # scales [N, K/32] fp16
        self.packed = pack_q6(q)  # [N, K * 3/4] uint8

    def weight_bytes(self) -> int:
        """What a decode step reads: 3K/4 bytes + K/32 fp16 scales per row."""
        return self.out_features * self.in_features * 3 // 4 + 2 * self.scales.numel()

    def dequantized(self) -> torch.Tensor:
        return dequantize_q6(self.packed, self.scales)


def int4_linears(module: nn.Module, bits: int = 4) -> tuple[int, int]:
    """Replaces every nn.Linear under `module` by an Int4Linear (bits 4; Int6Linear: 6) where its width fits the
    kernel and, at 4 bits, it is not in INT8_LINEARS (6 bits keep every linear), else by an Int8Linear; returns
    (int4/int6 count, int8 count)."""
    cls, keep_int8 = (Int6Linear, frozenset()) if bits == 6 else (Int4Linear, INT8_LINEARS)
    n4 = n8 = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            two_pass = name in TWO_PASS_LINEARS
            if fits(child) and name not in keep_int8:
                setattr(module, name, cls(child, two_pass=two_pass))
                n4 += 1
            else:
                setattr(module, name, Int8Linear.from_linear(child, two_pass=two_pass, rotate=two_pass))
                n8 += 1
        else:
            a, b = int4_linears(child, bits)
            n4, n8 = n4 + a, n8 + b
    return n4, n8
