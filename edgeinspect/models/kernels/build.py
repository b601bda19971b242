"""Each source is compiled with the system C compiler (`$CC`, else `cc`) at -O3 -march=native -fopenmp (or the level
EDGEINSPECT_CPU_ISA names: models/cpu.py) into a cache folder ($EDGEINSPECT_KERNEL_DIR, default
~/.cache/edgeinspect/kernels), under a name keyed by the source, the flags, the compiler and this CPU's flags, so a
shared folder never hands one CPU another's build. The library links libgomp by soname, so it joins the copy torch
has loaded and shares its threads. With no compiler (or EDGEINSPECT_NATIVE_KERNELS=0) `library()` is None and
stages keep torch's kernels; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from edgeinspect.models.cpu import CPU_ISA_LEVELS, cpu_flags, cpu_isa

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
INT4_SOURCE = Path(__file__).with_name("int4_gemm.c")
ROWS_SOURCE = Path(__file__).with_name("int8_rows.c")
Q8_SOURCE = Path(__file__).with_name("int8_vnni.c")
PROMPT_SOURCE = Path(__file__).with_name("prompt_attention.c")
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
COMPILE_TIMEOUT_S = 120


def arch_flags() -> tuple[str, ...]:
    """-march=native, or the level EDGEINSPECT_CPU_ISA caps this box at (models/cpu.py)."""
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


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def compile_source(cc: str, flags: tuple[str, ...], out: Path, source: Path = SOURCE) -> None:
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


def library_path(cc: str, flags: tuple[str, ...], source: Path = SOURCE) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256()
    for part in (source.read_bytes(), " ".join(flags).encode(), version.encode(), platform.machine().encode()):
        key.update(part)
    for header in headers():  # a shared header's edit rebuilds every library, not only the one that changed
        key.update(header.read_bytes())
    key.update(" ".join(sorted(cpu_flags())).encode())
    return kernel_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"


def load(source: Path, bind: Callable[[ctypes.CDLL], ctypes.CDLL], what: str) -> ctypes.CDLL | None:
    """`source` compiled for this CPU (cached) and bound; None where it cannot be built here (logged)."""
    if os.environ.get("EDGEINSPECT_NATIVE_KERNELS", "1").lower() in ("0", "false", "off", "no"):
        log.info("native kernels off (EDGEINSPECT_NATIVE_KERNELS): %s runs torch's kernels", what)
        return None
    cc = compiler()
    if cc is None:
        log.warning("no C compiler (set CC or install gcc): %s runs torch's kernels", what)
        return None
    errors = []
    for flags in (BASE_FLAGS + arch_flags(), BASE_FLAGS):  # some compilers/CPUs refuse -march
        try:
            path = library_path(cc, flags, source)
            if not path.exists():
                log.info("compiling native %s kernels for this CPU -> %s", what, path)
                compile_source(cc, flags, path, source)
            return bind(ctypes.CDLL(str(path)))
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            errors.append(f"{' '.join(flags)}: {detail.strip()[-400:]}")
    log.warning("native %s kernels could not be built (%s): torch's kernels are used", what, " | ".join(errors))
    return None
