"""EDGEINSPECT_CPU_ISA: a box runs the paths of a smaller CPU (its flags capped, our kernels built for that level)."""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest

from edgeinspect.models import cpu
from edgeinspect.models.kernels import bindings, build

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the levels are x86-64's")


@pytest.fixture
def isa(monkeypatch):
    """Sets the cap for one test; the cached level and flags are read afresh on both sides of it."""

    def cap(level: str | None) -> None:
        if level is None:
            monkeypatch.delenv(cpu.CPU_ISA_ENV, raising=False)
        else:
            monkeypatch.setenv(cpu.CPU_ISA_ENV, level)
        cpu.cpu_isa.cache_clear()
        cpu.cpu_flags.cache_clear()

    yield cap
    monkeypatch.undo()
    cpu.cpu_isa.cache_clear()
    cpu.cpu_flags.cache_clear()


def test_a_cap_hides_the_flags_above_its_level_and_keeps_the_rest(isa):
    isa(None)
    here = cpu.cpu_flags()
    assert cpu.cpu_isa() == "native" and build.arch_flags() == ("-march=native",)
    isa("AVX2")  # case and spaces as a person types them
    capped = cpu.cpu_flags()
    assert cpu.cpu_isa() == "avx2" and build.arch_flags() == ("-march=x86-64-v3",)
    assert not {f for f in capped if f.startswith(("avx512", "amx", "avx_vnni"))}
    assert {"avx2", "fma", "f16c"} & here == {"avx2", "fma", "f16c"} & capped
    assert not cpu.fast_bf16()  # a bf16 stage takes the fp16-packed path an AVX2 box takes
    isa("generic")
    assert not {f for f in cpu.cpu_flags() if f.startswith(("avx", "fma", "f16c"))}
    assert {"sse4_2"} & here <= cpu.cpu_flags()
    # fbgemm picks its kernel from the CPU itself, so what we know of it does not move with the cap
    assert cpu.fbgemm_vnni() == bool(here & {"avx512_vnni", "avx_vnni", "amx_int8"})


def test_an_unknown_level_says_which_levels_there_are(isa):
    isa("avx9000")
    with pytest.raises(ValueError, match=r"EDGEINSPECT_CPU_ISA='avx9000' .*native, avx2, generic"):
        cpu.cpu_flags()


@pytest.mark.skipif(build.compiler() is None or shutil.which("objdump") is None, reason="needs cc and objdump")
@pytest.mark.parametrize(("level", "register"), [("avx2", "%zmm"), ("generic", "%ymm")])
def test_a_capped_build_holds_no_instruction_above_its_level(isa, tmp_path, level, register):
    def disassembly(out):
        bindings.variant(build.Q8_SOURCE, out)  # binding it checks its ABI too
        return subprocess.run(["objdump", "-d", str(out)], capture_output=True, text=True, check=True).stdout

    isa(level)
    assert register not in disassembly(tmp_path / "capped.so")
    isa(None)
    wider = {"%zmm": "avx512f", "%ymm": "avx2"}[register]
    if wider in cpu.cpu_flags():  # the native build of this CPU does use them: the check above can fail
        assert register in disassembly(tmp_path / "native.so")
