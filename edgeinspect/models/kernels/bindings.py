"""The compiled kernels loaded with ctypes: each library's function signatures, the ABI version its wrapper is
written against (a stale build raises), and the structs int8_vnni.c reads a decode layer from. Each library is
built on first use (build.py) and is None where it cannot be built here.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from edgeinspect.models.kernels.build import (
    BASE_FLAGS,
    INT4_SOURCE,
    PROMPT_SOURCE,
    Q8_SOURCE,
    ROWS_SOURCE,
    SOURCE,
    arch_flags,
    compile_source,
    compiler,
    load,
)

ABI_VERSION = 6  # ei_abi_version() of decode_attention.c this module is written against
INT4_ABI_VERSION = 3
ROWS_ABI_VERSION = 1
Q8_ABI_VERSION = 9
PROMPT_ABI_VERSION = 2


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


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled decode-attention kernel, built on first use; None where it cannot be built here (logged once).
    Without it decode attention runs torch's SDPA and the KV cache stays 32-bit."""
    return load(SOURCE, _bind, "decode attention")


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
    return load(INT4_SOURCE, _bind_int4, "int4 matmul")


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
    return load(ROWS_SOURCE, _bind_rows, "int8 activation")


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
    return load(Q8_SOURCE, _bind_q8, "int8 vnni linear")


def q8_fast() -> bool:
    """Whether the vnni linear runs a SIMD path here: AVX512-VNNI, AVX2 or NEON (elsewhere plain C: correct, slow)."""
    lib = q8_library()
    return lib is not None and bool(lib.ei_q8_simd())


def int4_fast() -> bool:
    """Whether the int4 kernel runs a SIMD loop here (AVX512-VNNI, AVX2 or NEON; elsewhere a correct but slow plain-C
    loop)."""
    lib = int4_library()
    return lib is not None and bool(lib.ei_int4_simd())


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
    return load(PROMPT_SOURCE, _bind_prompt, "prompt attention")


def prompt_attention_fast() -> bool:
    """Whether prompt chunks of packed stages attend in the kernel here: with bf16 dot products (AVX512-BF16) or in
    fp32 (AVX2 + FMA); prompt_attention_bf16() tells which."""
    lib = prompt_library()
    return lib is not None and bool(lib.ei_prompt_attention_simd())


def prompt_attention_bf16() -> bool:
    """Whether the kernel rounds q, k, v and the probabilities to bf16 here (else it is fp32 throughout)."""
    lib = prompt_library()
    return lib is not None and lib.ei_prompt_attention_simd() == 2


def available() -> bool:
    return library() is not None


def variant(source: Path, out: Path, *defines: str) -> ctypes.CDLL:
    """`source` built with extra -D macros (the project's flags otherwise) at `out`, uncached, and bound as the default
    build of that source is: the builds benchmarks and their tests compare with the default one (part clocks,
    prefetch distances, fixed-point attention). Raises RuntimeError where no compiler is installed."""
    bind = {SOURCE: _bind, Q8_SOURCE: _bind_q8, INT4_SOURCE: _bind_int4}[source]
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler here (set CC or install gcc)")
    compile_source(cc, (*BASE_FLAGS, *arch_flags(), *(f"-D{d}" for d in defines)), out, source)
    return bind(ctypes.CDLL(str(out)))
