"""What this CPU is and what it runs fast: its feature flags (capped by EDGEINSPECT_CPU_ISA), its name, and the
few flag questions path choices ask (bf16 matmul instructions, fbgemm's VNNI accumulation). Read once per process.
"""

from __future__ import annotations

import functools
import os

# EDGEINSPECT_CPU_ISA=avx2 makes this box choose and build as an AVX2-only CPU (x86-64-v3) would: the native kernels
# are compiled for that level and the flags above it are ignored wherever we pick a path by flags, so a box with
# AVX-512 runs the paths an AVX2-only box takes (tools/test.sh runs the kernel tests so; "generic", SSE4.2, runs the
# plain C loops an ARM box compiles). torch follows only its own variables (ATEN_CPU_CAPABILITY=avx2,
# ONEDNN_MAX_CPU_ISA=AVX2) and fbgemm none: it picks its kernels from the CPU itself (fbgemm_vnni).
CPU_ISA_ENV = "EDGEINSPECT_CPU_ISA"
CPU_ISA_LEVELS = {  # level -> (the compiler's -march, prefixes of the flags a CPU of that level lacks)
    "native": ("native", ()),
    "avx2": ("x86-64-v3", ("avx512", "avx10", "avx_vnni", "amx", "gfni", "vaes", "vpclmulqdq")),
    "generic": ("x86-64-v2", ("avx", "fma", "f16c", "amx", "gfni", "vaes", "vpclmulqdq")),
}


@functools.cache
def cpu_isa() -> str:
    """The instruction-set level paths are chosen and kernels built for: `native` unless EDGEINSPECT_CPU_ISA caps it."""
    level = os.environ.get(CPU_ISA_ENV, "").strip().lower() or "native"
    if level not in CPU_ISA_LEVELS:
        raise ValueError(f"{CPU_ISA_ENV}={level!r} is not a level edgeinspect knows: use {', '.join(CPU_ISA_LEVELS)}")
    return level


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, less those above EDGEINSPECT_CPU_ISA's level where it is set."""
    lacks = CPU_ISA_LEVELS[cpu_isa()][1]
    return frozenset(f for f in _cpu_flags_here() if not f.startswith(lacks)) if lacks else _cpu_flags_here()


@functools.cache
def _proc_cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where that does not exist)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


@functools.cache
def _cpu_flags_here() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it does not list them)."""
    for line in _proc_cpuinfo().splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


# The ARM cores edgeinspect's boxes have, by the "CPU part" their kernel reports (Arm Ltd, implementer 0x41).
ARM_CORES = {
    "0xd03": "Cortex-A53",  # Raspberry Pi 3
    "0xd05": "Cortex-A55",  # the little cores of an RK3588 box
    "0xd08": "Cortex-A72",  # Raspberry Pi 4
    "0xd0b": "Cortex-A76",  # Raspberry Pi 5, the big cores of an RK3588 box
    "0xd0c": "Neoverse-N1",
    "0xd40": "Neoverse-V1",
    "0xd41": "Cortex-A78",
    "0xd42": "Cortex-A78AE",  # Jetson Orin
    "0xd4f": "Neoverse-V2",
}


def cpu_model_from(cpuinfo: str) -> str:
    """The CPU's name from /proc/cpuinfo's text: x86's "model name"; on ARM, which has none, its cores by their
    "CPU part" (a big.LITTLE box lists both kinds), so benchmark records and per-CPU caches tell boxes apart."""
    parts: dict[str, int] = {}
    implementer = ""
    for line in cpuinfo.splitlines():
        key, _, value = (x.strip() for x in line.partition(":"))
        if key == "model name":
            return value
        if key == "CPU implementer":
            implementer = value
        elif key == "CPU part":
            name = ARM_CORES.get(value, f"part {value}") if implementer == "0x41" else f"{implementer}/{value}"
            parts[name] = parts.get(name, 0) + 1
    return " + ".join(f"{name} x{n}" for name, n in sorted(parts.items()))


def cpu_model() -> str:
    """This CPU's name ("" where /proc/cpuinfo does not say)."""
    return cpu_model_from(_proc_cpuinfo())


def fast_bf16() -> bool:
    """Whether this CPU has bf16 matmul instructions (AMX or AVX512-BF16); without them bf16 GEMM is emulated."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def fbgemm_vnni() -> bool:
    """Whether fbgemm's int8 kernel accumulates u8 x s8 pairs in int32 here (VNNI/AMX) rather than int16: the CPU's
    own flags, whatever EDGEINSPECT_CPU_ISA says, since fbgemm picks its kernels from the CPU itself."""
    return bool(_cpu_flags_here() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def int8_gemm_class() -> str:
    """Which int8 GEMM kernel family ONNX Runtime's MLAS (and fbgemm) pick on this CPU, by its own flags whatever
    EDGEINSPECT_CPU_ISA says (they read the CPU themselves): `x86-vnni` sums u8 x s8 in int32; `x86-avx2` (AVX2 or
    AVX-512 without VNNI) sums pairs into int16 first, which saturates with full-range 8-bit weights; `x86-sse`
    widens to 16-bit products; `arm-dotprod` / `arm-neon`; "" where the flags say nothing."""
    flags = _cpu_flags_here()
    if flags & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        return "x86-vnni"
    if flags & {"avx2", "avx512f"}:
        return "x86-avx2"
    if "sse4_1" in flags:
        return "x86-sse"
    if "asimd" in flags:
        return "arm-dotprod" if "asimddp" in flags else "arm-neon"
    return ""
