"""Native CPU kernels for decode, compiled for this machine on first use and loaded with ctypes.

Decode attention reads one session's whole KV cache for a single query row. torch's SDPA runs that through a
blocked flash kernel built for many rows: at 1.3B dimensions it reads the cache at about half of memory speed,
and over a 16-bit cache it is slower still (no fast fp16 path on AVX2). decode_attention.c is one plain pass over
keys then values, fp16 rows converted in registers (F16C), so a 16-bit KV cache halves the bytes read instead of
costing more; one call per layer stores the new row of every session in the step and attends for all of them
(measured at 1.3B, 24 layers, one query: SDPA over fp32 18 ms, this kernel over fp16 7.5 ms at 600 positions).
Keys are scored four at a time, exp is vectorized and the weighted values stay in registers: at the report's 974
positions that took the 196 MB pass from 12.5 to 11.4 ms (~17 GB/s, this box's read speed; min of 20 interleaved
rounds against the previous build).
The same pass over int8 rows (models/kv.py: int8 values + a per-row fp32 scale, the default `kv_cache` of packed
stages) reads 0.52x the bytes; with AVX-512 loads and software prefetch it took the 974-position pass from ~15
to ~6.5-9.5 ms (fp16 rows then int8 rows, same process, min of 10; the spread is this box's memory speed).
With several concurrent sessions this attention is what bounds batching (bench/README.md, perf_batching).

int4_gemm.c is the int4-weight (and int6-weight) x int8-activation matmul of models/int4.py (q4_0 and q6 grids,
VNNI dot products, or AVX2 ones with the same sums in the same order; a plain-C path where the CPU has neither,
correct but slow, which `weights: auto` then measures as such).

int8_rows.c is the activation side of the fbgemm int8 linear (models/quant.py) fused into one pass in and one
out: per-row scaling and the residual second pass, which as torch ops cost a prompt as much as the GEMM itself.

int8_vnni.c is the "vnni" int8 linear (models/quant.py): per-row int8 activations and our VNNI GEMV for decode
rows over row-major int8 weights (torch._int_mm runs prompts over the same weights). Where the CPU has AVX2 but no
VNNI it builds an AVX2 GEMV and its own exact int32 GEMM for prompts (ei_q8_mm: torch._int_mm there is oneDNN's
reference loop, ~170x slower than fbgemm). decode_attention.c also holds
the elementwise steps of a native decode layer (RMSNorm with its residual add, rotary embedding, silu * up), so a
decode step does not pay ~40 torch op dispatches per layer; on vnni int8 (and int4) stages int8_vnni.c's
ei_q8_decode_layer runs a whole layer in one call, and ei_q8_decode_layers every layer of the stage (DecodeLayers:
the same functions in the same order, so the same bits), taking the other libraries' functions as pointers (1.3B,
depth 974, a Zen 5 EPYC, interleaved: an int8 step 40.0 vs 43.1 ms with a Python call per step of the layer; int4
37.5 vs 43.1).

prompt_attention.c is the causal attention of prompt chunks in packed stages, with bf16 dot products (AVX512-BF16)
and an fp32 softmax: q, k, v and the probabilities rounded to bf16 are finer than the int8 KV rows decode attends
over later (974 positions x 16 heads x 128 on a Zen 5 EPYC: 8.9 ms a layer against SDPA fp32's 34-48 ms; a
974-token 1.3B prefill 3.43 -> 2.69 s; first-token logits cosine vs fp32 0.9946 with SDPA, 0.9943 with it). Where
the CPU has AVX2 and FMA but no AVX512-BF16 it runs in fp32, blocked for the caches (an AVX2 Zen 3 EPYC: 29.3 ms a
layer against SDPA's 38.7; a 974-token prefill's attention 0.98 -> 0.70 s); elsewhere it declines and SDPA runs.

Each source is compiled with the system C compiler (`$CC`, else `cc`) at -O3 -march=native -fopenmp (or the level
EDGEINSPECT_CPU_ISA names: models/quant.py) into a cache folder ($EDGEINSPECT_KERNEL_DIR, default
~/.cache/edgeinspect/kernels), under a name keyed by the source, the flags, the compiler and this CPU's flags, so a
shared folder never hands one CPU another's build. The library links libgomp by soname, so it joins the copy torch
has loaded and shares its threads. With no compiler (or EDGEINSPECT_NATIVE_KERNELS=0) `library()` is None and
stages keep torch's kernels; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from edgeinspect.models.kv import KVBuffer
from edgeinspect.models.quant import CPU_ISA_LEVELS, cpu_flags, cpu_isa

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
ABI_VERSION = 6  # ei_abi_version() of the source this wrapper is written against
INT4_SOURCE = Path(__file__).with_name("int4_gemm.c")
INT4_ABI_VERSION = 3
ROWS_SOURCE = Path(__file__).with_name("int8_rows.c")
ROWS_ABI_VERSION = 1
Q8_SOURCE = Path(__file__).with_name("int8_vnni.c")
Q8_ABI_VERSION = 9
PROMPT_SOURCE = Path(__file__).with_name("prompt_attention.c")
PROMPT_ABI_VERSION = 2
# Activation rows (both passes counted) up to which the vnni linear runs its own GEMV; above, the int32 GEMM
# (q8_int_mm), which is the faster at prompt sizes but reads weights at half of memory speed for a single row.
Q8_GEMV_ROWS = 16
# Most bytes of int32 output one q8_int_mm call of a prompt makes. Past 32 MiB (glibc's top mmap threshold) each
# call faults a fresh buffer in, but oneDNN gains more from the rows than that costs: a 974-token 1.3B int6 prefill
# (gate_up's output 43 MB) took 3.35 s whole against 3.42 s in two blocks under 32 MiB (Zen 4, 8 interleaved rounds).
Q8_OUTPUT_BYTES = 64 << 20
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
COMPILE_TIMEOUT_S = 120


def arch_flags() -> tuple[str, ...]:
    """-march=native, or the level EDGEINSPECT_CPU_ISA caps this box at (models/quant.py)."""
    return (f"-march={CPU_ISA_LEVELS[cpu_isa()][0]}",)


def headers() -> list[Path]:
    """The headers the sources include (#include "..."), in a fixed order: part of every build's key."""
    return sorted(SOURCE.parent.glob("*.h"))


def sources_digest() -> str:
    """A digest of every kernel source: what a measurement of their speed (models/autoformat.py) was made with."""
    h = hashlib.sha256()
    for source in (SOURCE, INT4_SOURCE, ROWS_SOURCE, Q8_SOURCE, PROMPT_SOURCE, *headers()):
        h.update(source.read_bytes())
    return h.hexdigest()[:16]


def kernel_dir() -> Path:
    return Path(os.environ.get("EDGEINSPECT_KERNEL_DIR") or Path.home() / ".cache" / "edgeinspect" / "kernels")


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _build(cc: str, flags: tuple[str, ...], out: Path, source: Path = SOURCE) -> None:
    """Compiles `source` to `out` atomically (stages starting together may build at once; the last rename wins)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run(
            [cc, *flags, str(source), "-o", tmp, "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def variant(source: Path, out: Path, *defines: str) -> ctypes.CDLL:
    """`source` built with extra -D macros (the project's flags otherwise) at `out`, uncached, and bound as the default
    build of that source is: the builds benchmarks and their tests compare with the default one (part clocks,
    prefetch distances, fixed-point attention). Raises RuntimeError where no compiler is installed."""
    bind = {SOURCE: _bind, Q8_SOURCE: _bind_q8, INT4_SOURCE: _bind_int4}[source]
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler here (set CC or install gcc)")
    _build(cc, (*BASE_FLAGS, *arch_flags(), *(f"-D{d}" for d in defines)), out, source)
    return bind(ctypes.CDLL(str(out)))


def _library_path(cc: str, flags: tuple[str, ...], source: Path = SOURCE) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256()
    for part in (source.read_bytes(), " ".join(flags).encode(), version.encode(), platform.machine().encode()):
        key.update(part)
    for header in headers():  # a shared header's edit rebuilds every library, not only the one that changed
        key.update(header.read_bytes())
    key.update(" ".join(sorted(cpu_flags())).encode())
    return kernel_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"


def _abi_checked(lib: ctypes.CDLL, version_fn: str, expected: int, what: str) -> ctypes.CDLL:
    """`lib` if its version function reports the ABI this wrapper is written against (a stale build raises)."""
    fn = getattr(lib, version_fn)
    fn.restype = ctypes.c_int
    if fn() != expected:
        raise OSError(f"{what} ABI {fn()} != {expected}")
    return lib


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    i32, i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    for fn in (lib.ei_decode_attention_f16, lib.ei_decode_attention_q8):
        fn.argtypes = [i32, i32, ptr, i64, ptr, i64, ptr, i64, ptr, ptr, ptr, ptr, i32, i32, i32, ctypes.c_float, i32]
        fn.restype = i32
    lib.ei_add_rmsnorm.argtypes = [i32, i32, ptr, i64, ptr, i64, ptr, ptr, ctypes.c_float, ptr]
    lib.ei_rope.argtypes = [i32, i32, i32, i32, ptr, i64, ptr, i64, ptr, ptr]
    lib.ei_silu_mul.argtypes = [i32, i32, ptr, i64, ptr]
    lib.ei_silu_mul_q8.argtypes = [i32, i32, ptr, ptr, ptr, ptr]
    lib.ei_store_rows_q8.argtypes = [i32, i32, i32, ptr, i64, ptr, i64, i32, i32, i32, i32]
    lib.ei_store_rows_q8.restype = None
    for fn in (lib.ei_add_rmsnorm, lib.ei_rope, lib.ei_silu_mul, lib.ei_silu_mul_q8):
        fn.restype = None
    return _abi_checked(lib, "ei_abi_version", ABI_VERSION, "kernel")


def _load(source: Path, bind, what: str) -> ctypes.CDLL | None:
    """`source` compiled for this CPU (cached) and bound; None where it cannot be built here (logged)."""
    if os.environ.get("EDGEINSPECT_NATIVE_KERNELS", "1").lower() in ("0", "false", "off", "no"):
        log.info("native kernels off (EDGEINSPECT_NATIVE_KERNELS): %s runs torch's kernels", what)
        return None
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler (set CC or install gcc): %s runs torch's kernels", what)
        return None
    errors = []
    for flags in (BASE_FLAGS + arch_flags(), BASE_FLAGS):  # some compilers/CPUs refuse -march
        try:
            path = _library_path(cc, flags, source)
            if not path.exists():
                log.info("compiling native %s kernels for this CPU -> %s", what, path)
                _build(cc, flags, path, source)
            return bind(ctypes.CDLL(str(path)))
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            errors.append(f"{' '.join(flags)}: {detail.strip()[-400:]}")
    log.warning("native %s kernels could not be built (%s): torch's kernels are used", what, " | ".join(errors))
    return None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled decode-attention kernel, built on first use; None where it cannot be built here (logged once).
    Without it decode attention runs torch's SDPA and the KV cache stays 32-bit."""
    return _load(SOURCE, _bind, "decode attention")


def _bind_int4(lib: ctypes.CDLL) -> ctypes.CDLL:
    i32, i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.ei_int4_gemm.argtypes = [i32, i32, i32, ptr, i64, ptr, ptr, ptr, i64, i32]
    lib.ei_int4_gemm.restype = i32
    lib.ei_int6_gemm.argtypes = lib.ei_int4_gemm.argtypes
    lib.ei_int6_gemm.restype = i32
    lib.ei_int4_simd.restype = i32
    return _abi_checked(lib, "ei_int4_abi_version", INT4_ABI_VERSION, "int4 kernel")


@functools.cache
def int4_library() -> ctypes.CDLL | None:
    """The compiled int4 x int8 matmul (models/int4.py); None where it cannot be built (int4 then dequantizes)."""
    return _load(INT4_SOURCE, _bind_int4, "int4 matmul")


def _bind_rows(lib: ctypes.CDLL) -> ctypes.CDLL:
    i32, i64, ptr, f32 = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.ei_rows_prep.argtypes = [i32, i32, ptr, i64, ptr, ptr, i32, i32]
    lib.ei_rows_prep.restype = ctypes.c_double
    lib.ei_rows_finish.argtypes = [i32, i32, ptr, i64, ptr, ptr, f32, i32]
    lib.ei_rows_finish.restype = None
    return _abi_checked(lib, "ei_rows_abi_version", ROWS_ABI_VERSION, "int8 rows kernel")


@functools.cache
def rows_library() -> ctypes.CDLL | None:
    """The fused activation prep/finish of the fbgemm int8 linear (int8_rows.c); None where it cannot be built
    (Int8Linear then runs the same steps as torch ops)."""
    return _load(ROWS_SOURCE, _bind_rows, "int8 activation")


def int8_rows_prep(x: torch.Tensor, two_pass: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """x [R, K] fp32 (rows may be strided) -> (rows [R or 2R, K] for fbgemm, norm [R], gain or 0: one pass)."""
    lib = rows_library()
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
    lib = rows_library()
    r, n = norm.shape[0], y.shape[1]
    if not y.is_contiguous():
        y = y.contiguous()
    out = y[:r]  # in place: row r is read (with row R + r) before it is written; a fresh [R, N] would page-fault
    lib.ei_rows_finish(
        r, n, y.data_ptr(), y.stride(0), out.data_ptr(), norm.data_ptr(), 1.0 / gain if gain else 0.0,
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def _bind_q8(lib: ctypes.CDLL) -> ctypes.CDLL:
    i32, i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    lib.ei_q8_prep.argtypes = [i32, i32, ptr, i64, i32, i32, ptr, ptr, i32]
    lib.ei_q8_prep.restype = i32
    lib.ei_q8_gemv_rows.argtypes = [i32, i32, i32, i32, i32, ptr, i64, ptr, ptr, ptr, ptr, i32]
    lib.ei_q8_gemv_rows.restype = i32
    lib.ei_q8_finish.argtypes = [i32, i32, i32, ptr, ptr, ptr, ptr, i32, ptr, i32]
    lib.ei_q8_finish.restype = None
    lib.ei_gelu_tanh.argtypes = [i64, ptr]
    lib.ei_gelu_tanh.restype = None
    lib.ei_q8_mm.argtypes = [i32, i32, i32, ptr, ptr, ptr, i32]
    lib.ei_q8_mm.restype = i32
    lib.ei_q8_simd.restype = i32
    lib.ei_q8_layer_scratch.argtypes = [ctypes.POINTER(Q8Layer), i32]
    lib.ei_q8_layer_scratch.restype = i64
    lib.ei_q8_decode_layer.argtypes = [
        ctypes.POINTER(Q8Layer), ctypes.POINTER(LayerOps), i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32
    ]  # fmt: skip
    lib.ei_q8_decode_layer.restype = i32
    lib.ei_q8_decode_layers.argtypes = [
        ctypes.POINTER(Q8Layer), i32, ctypes.POINTER(LayerOps), i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32
    ]  # fmt: skip
    lib.ei_q8_decode_layers.restype = i32
    lib.ei_q8_part_times.argtypes = [ptr]  # clocks exist only in a -DEI_PART_TIMES build (bench/decode_parts.py)
    lib.ei_q8_part_times.restype = i32
    return _abi_checked(lib, "ei_q8_abi_version", Q8_ABI_VERSION, "int8 vnni kernel")


@functools.cache
def q8_library() -> ctypes.CDLL | None:
    """The compiled int8 x int8 linear of the "vnni" kernel (int8_vnni.c); None where it cannot be built."""
    return _load(Q8_SOURCE, _bind_q8, "int8 vnni linear")


def q8_fast() -> bool:
    """Whether the vnni linear runs a SIMD path here: AVX512-VNNI, AVX2 or NEON (elsewhere plain C: correct, slow)."""
    lib = q8_library()
    return lib is not None and bool(lib.ei_q8_simd())


def q8_int_mm(xq: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """xq [R, K] int8 @ weight [N, K] int8 .T -> [R, N] int32, exact: torch._int_mm (oneDNN) where the kernel has
    its VNNI path; elsewhere oneDNN falls back to a reference loop (~170x slower than fbgemm on AVX2), and our
    AVX2 or NEON GEMM (ei_q8_mm) gives the same int32 sums."""
    lib = q8_library()
    if lib.ei_q8_simd() == 2:
        return torch._int_mm(xq, weight.t())
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
    lib = q8_library()
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
            library().ei_silu_mul_q8(rows, n // 2, acc.data_ptr(), xs.data_ptr(), scales.data_ptr(), out.data_ptr())
            continue
        lib.ei_q8_finish(
            rows, n, int(two_pass), acc.data_ptr(), xs.data_ptr(), scales.data_ptr(),
            None if bias is None else bias.data_ptr(), int(gelu), out.data_ptr(), threads,
        )  # fmt: skip
    return y


def int4_fast() -> bool:
    """Whether the int4 kernel runs a SIMD loop here (AVX512-VNNI, AVX2 or NEON; elsewhere a correct but slow plain-C
    loop)."""
    lib = int4_library()
    return lib is not None and bool(lib.ei_int4_simd())


def int4_gemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """x [R, K] fp32 (rows may be strided) @ the int4 weight (packed [N, K/2] uint8, scales [N, K/32] fp16).T
    -> [R, N] fp32; bits 6: the q6 weight (packed [N, K * 3/4], models/int4.py)."""
    lib = int4_library()
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


def _bind_prompt(lib: ctypes.CDLL) -> ctypes.CDLL:
    i32, i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    f32 = ctypes.c_float
    lib.ei_prompt_attention.argtypes = [i32, i32, i32, i32, i32, *(ptr, i64, i64) * 3, ptr, i64, f32, i32, i32]
    lib.ei_prompt_attention.restype = i32
    lib.ei_prompt_attention_simd.restype = i32
    return _abi_checked(lib, "ei_prompt_attention_abi_version", PROMPT_ABI_VERSION, "prompt attention kernel")


@functools.cache
def prompt_library() -> ctypes.CDLL | None:
    """The compiled prompt attention (prompt_attention.c); None where it cannot be built."""
    return _load(PROMPT_SOURCE, _bind_prompt, "prompt attention")


def prompt_attention_fast() -> bool:
    """Whether prompt chunks of packed stages attend in the kernel here: with bf16 dot products (AVX512-BF16) or in
    fp32 (AVX2 + FMA); prompt_attention_bf16() tells which."""
    lib = prompt_library()
    return lib is not None and bool(lib.ei_prompt_attention_simd())


def prompt_attention_bf16() -> bool:
    """Whether the kernel rounds q, k, v and the probabilities to bf16 here (else it is fp32 throughout)."""
    lib = prompt_library()
    return lib is not None and lib.ei_prompt_attention_simd() == 2


def prompt_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, scale: float, causal: bool = True
):
    """Causal attention of a prompt chunk: q [H, t, hd] (query i at position past + i) over keys/values
    [H_kv, past + t, hd] (`causal=False`: every query over all of them, as the vision tower's patches attend), all
    fp32 with each head's hd floats contiguous -> [t, H * hd] fp32, with bf16 dot
    products and an fp32 softmax (AVX512-BF16) or in fp32 (AVX2), prompt_attention.c. None where the kernel does
    not take the call (neither instruction set, or a head_dim that is not a multiple of 16): the caller then runs
    SDPA."""
    lib = prompt_library()
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


def available() -> bool:
    return library() is not None


# The elementwise steps of a decode layer (decode_attention.c), for a few fp32 rows whose last dim is contiguous.


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, add: torch.Tensor | None = None):
    """LlamaRMSNorm(x) [R, D] in fp32; with `add`, (x + add, its norm) with no torch op in between."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    if add is not None and add.stride(-1) != 1:
        add = add.contiguous()
    r, d = x.shape
    out = torch.empty(r, d)
    total = torch.empty(r, d) if add is not None else None
    library().ei_add_rmsnorm(
        r, d, x.data_ptr(), x.stride(0), None if add is None else add.data_ptr(), 0 if add is None else add.stride(0),
        None if total is None else total.data_ptr(), weight.data_ptr(), eps, out.data_ptr(),
    )  # fmt: skip
    return out if add is None else (total, out)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """apply_rotary_pos_emb in place: q [R, H, hd], k [R, H_kv, hd] (heads contiguous), cos/sin [R, hd]."""
    r, heads, hd = q.shape
    library().ei_rope(
        r, heads, k.shape[1], hd, q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), cos.data_ptr(), sin.data_ptr()
    )


def store_rows_q8(kv: KVBuffer, layer: int, keys: torch.Tensor, values: torch.Tensor, at: int) -> None:
    """KVBuffer.write for an int8 buffer, natively: keys/values [T, H_kv, hd] fp32 (heads contiguous, rows may be
    strided) into positions [at, at + T) of `layer`, the same bytes as quantize_rows."""
    lib = library()
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
    library().ei_silu_mul(r, width // 2, gate_up.data_ptr(), gate_up.stride(0), out.data_ptr())
    return out


class Q8Weight(ctypes.Structure):
    """int8_vnni.c's ei_q8_weight: one vnni Int8Linear's tensors, or an Int4Linear's with `int4` the address of
    int4_gemm.c's ei_int4_gemm."""

    _fields_ = [
        ("w", ctypes.c_void_p), ("ws", ctypes.c_void_p), ("wsum", ctypes.c_void_p),
        ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("two_pass", ctypes.c_int32), ("rotate", ctypes.c_int32),
        ("int4", ctypes.c_void_p),
    ]  # fmt: skip


class LayerOps(ctypes.Structure):
    """int8_vnni.c's ei_layer_ops: decode_attention.c's functions, as pointers."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("attention", "add_rmsnorm", "rope", "silu_mul")]


class Q8Layer(ctypes.Structure):
    """int8_vnni.c's ei_q8_layer: a decode layer's weights and shape."""

    _fields_ = [
        ("qkv", Q8Weight), ("o", Q8Weight), ("gate_up", Q8Weight), ("down", Q8Weight),
        ("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p),
        ("eps1", ctypes.c_float), ("eps2", ctypes.c_float), ("scale", ctypes.c_float),
        ("layer", ctypes.c_int32), ("heads", ctypes.c_int32), ("kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
    ]  # fmt: skip


class DecodeLayers:
    """A stage's decode layers in one native call (int8_vnni.c ei_q8_decode_layers), for stages whose four
    projections per layer are fused vnni Int8Linears or Int4Linears on our kernel (int4 stages: down_proj int8):
    the same steps and functions as StageExecutor._decode_layer,
    so the same bits, without its ~20 Python calls per layer. Rows: one per session, at most MAX_ROWS (beyond
    that q8_linear's own GEMV/_int_mm choice applies, and the Python path runs)."""

    MAX_ROWS = Q8_GEMV_ROWS // 2  # a down_proj too narrow to rotate takes two passes (models/quant.py)

    def __init__(self, layers, heads: int, kv_heads: int, head_dim: int):
        from edgeinspect.models.int4 import Int4Linear  # it imports this module

        self.lib, attention = q8_library(), library()
        self.keep = list(layers)  # the structs point into these modules' tensors
        self.layers = (Q8Layer * len(self.keep))()
        int4 = int4_library()
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
        library() is (the default; a benchmark swaps in a variant build, see variant())."""

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
                return m.kernel == "ours" and m.bias is None and int4_library() is not None
            return isinstance(m, Int8Linear) and m.kernel == "vnni" and m.bias is None

        if q8_library() is None or library() is None:
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
        lib = library()
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
