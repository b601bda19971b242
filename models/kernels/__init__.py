"""Native CPU kernels for decode, compiled for this machine on first use and loaded with ctypes.

Decode attention reads one session's whole KV cache for a single query row. torch's SDPA runs that through a
blocked flash kernel built for many rows: at 1.3B dimensions it reads the cache at about half of memory speed,
and over a 16-bit cache it is slower still (it has no fast fp16 path on AVX2). decode_attention.c is one plain
pass over keys then values, with fp16 rows converted in registers (F16C), so a 16-bit KV cache halves the bytes
read instead of costing more. At 4 concurrent sessions this attention is what bounds batching (bench/README.md).

The source is compiled with the system C compiler (`$CC`, else `cc`) at -O3 -march=native -fopenmp into a cache
folder ($EDGEINSPECT_KERNEL_DIR, default ~/.cache/edgeinspect/kernels), under a name keyed by the source, the
flags, the compiler and this CPU's flags, so a shared folder never hands one CPU another's build. The library
links libgomp by soname, so it joins the copy torch has loaded and shares its threads. With no compiler (or
EDGEINSPECT_NATIVE_KERNELS=0) `library()` is None and stages keep torch's kernels; the reason is logged once.
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

from edgeinspect.models.quant import cpu_flags

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
ABI_VERSION = 1  # ei_abi_version() of the source this wrapper is written against
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
ARCH_FLAGS = ("-march=native",)
COMPILE_TIMEOUT_S = 120


def kernel_dir() -> Path:
    return Path(os.environ.get("EDGEINSPECT_KERNEL_DIR") or Path.home() / ".cache" / "edgeinspect" / "kernels")


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _build(cc: str, flags: tuple[str, ...], out: Path) -> None:
    """Compiles SOURCE to `out` atomically (stages starting together may build at once; the last rename wins)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run(
            [cc, *flags, str(SOURCE), "-o", tmp, "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _library_path(cc: str, flags: tuple[str, ...]) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(flags).encode(), version.encode(), platform.machine().encode()):
        key.update(part)
    key.update(" ".join(sorted(cpu_flags())).encode())
    return kernel_dir() / f"decode_attention-{key.hexdigest()[:16]}.so"


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    args = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + [ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_int]
    for fn in (lib.ei_decode_attention_f32, lib.ei_decode_attention_f16):
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.ei_abi_version.restype = ctypes.c_int
    if lib.ei_abi_version() != ABI_VERSION:
        raise OSError(f"kernel ABI {lib.ei_abi_version()} != {ABI_VERSION}")
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they cannot be built here (logged once)."""
    if os.environ.get("EDGEINSPECT_NATIVE_KERNELS", "1").lower() in ("0", "false", "off", "no"):
        log.info("native kernels off (EDGEINSPECT_NATIVE_KERNELS): decode attention runs torch's SDPA")
        return None
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler (set CC or install gcc): decode attention runs torch's SDPA, KV cache stays 32-bit")
        return None
    errors = []
    for flags in (BASE_FLAGS + ARCH_FLAGS, BASE_FLAGS):  # some compilers/CPUs refuse -march=native
        try:
            path = _library_path(cc, flags)
            if not path.exists():
                log.info("compiling native decode kernels for this CPU -> %s", path)
                _build(cc, flags, path)
            return _bind(ctypes.CDLL(str(path)))
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            errors.append(f"{' '.join(flags)}: {detail.strip()[-400:]}")
    log.warning("native decode kernels could not be built (%s): torch's SDPA is used", " | ".join(errors))
    return None


def available() -> bool:
    return library() is not None


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query row per head: q [H, hd] fp32; keys/values [H_kv, L, hd] (fp32 or fp16,
    rows contiguous, heads `stride` rows apart as in a KVBuffer view) -> [H, hd] fp32."""
    lib = library()
    if lib is None:
        raise RuntimeError("native kernels are not available here")
    heads, head_dim = q.shape
    kv_heads, length, _ = keys.shape
    same_layout = keys.dtype == values.dtype and keys.stride() == values.stride()
    if not same_layout or keys.stride(2) != 1 or keys.stride(1) != head_dim:
        raise ValueError("keys and values must share one layout with contiguous rows")
    if heads % kv_heads or keys.stride(0) % head_dim:
        raise ValueError(f"{heads} query heads over {kv_heads} kv heads / stride {keys.stride(0)} do not fit")
    fn = {torch.float32: lib.ei_decode_attention_f32, torch.float16: lib.ei_decode_attention_f16}.get(keys.dtype)
    if fn is None:
        raise ValueError(f"decode attention reads fp32 or fp16 caches, not {keys.dtype}")
    q = q.contiguous().float()
    out = torch.empty(heads, head_dim)
    rc = fn(
        _ptr(q),
        _ptr(keys),
        _ptr(values),
        _ptr(out),
        heads,
        kv_heads,
        length,
        keys.stride(0) // head_dim,
        head_dim,
        scale,
        torch.get_num_threads(),
    )
    if rc != 0:
        raise MemoryError(f"decode attention could not allocate {length} scores")
    return out
