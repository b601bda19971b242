"""The llama.cpp anchor skips with a clear message (exit 0) where it cannot build llama.cpp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "anchor_llamacpp.py"


def test_without_a_toolchain_the_anchor_skips_and_says_why(tiny_checkpoint, tmp_path):
    env = {"PATH": str(tmp_path), "EDGEINSPECT_LLAMACPP_DIR": str(tmp_path / "llamacpp"), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "a.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "SKIPPED anchor_llamacpp.py: no cmake or cc or c++ on this machine" in done.stdout
    assert not (tmp_path / "a.json").exists()


def test_a_crashed_llama_bench_is_reported_by_its_signal(tmp_path, monkeypatch):
    # Seen on an AMX Xeon: llama-bench died of SIGSEGV with nothing on stderr, and the skip message said nothing.
    import pytest

    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # bench scripts import their common module
    import anchor_llamacpp as anchor

    crashing = tmp_path / "llama-bench"
    crashing.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crashing.chmod(0o755)
    with pytest.raises(anchor.Unavailable, match=r"llama-bench failed \(killed by SIGSEGV\)"):
        anchor.llama_bench(crashing, tmp_path / "m.gguf", ["-p", "16"])


def test_on_an_amx_cpu_the_anchor_builds_avx512_without_amx_and_says_which_build_ran(monkeypatch):
    # On an AMX Xeon llama.cpp's native build dies in its AMX path; the old `--repack 0` fallback ran it ~1.5x slower
    # (26.3 s vs 17.4 s for the q4_0 text): the anchor builds AVX-512 without AMX instead, never a crippled run.
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import anchor_llamacpp as anchor

    amx = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "fma", "f16c"}
    assert anchor.build_flavour(amx) == "avx512-noamx"
    assert anchor.build_flavour(amx - {"amx_tile", "amx_int8", "amx_bf16"}) == "native"
    assert anchor.build_flavour({"avx2", "fma", "f16c"}) == "native"
    flags = anchor.FLAVOUR_FLAGS["avx512-noamx"]
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AVX512=ON" in flags and "-DGGML_AVX512_BF16=ON" in flags
    assert {f for f in flags if "AMX" in f} == {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"}


def test_a_crashed_llama_bench_is_not_rerun_with_its_weight_layouts_off(tmp_path, monkeypatch):
    # A `--repack 0` rerun is a slower llama.cpp than a user gets: a crash is reported, not hidden behind one.
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import anchor_llamacpp as anchor
    import pytest

    calls = tmp_path / "calls"
    fake = tmp_path / "llama-bench"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nkill -SEGV $$\n')
    fake.chmod(0o755)
    with pytest.raises(anchor.Unavailable, match=r"killed by SIGSEGV"):
        anchor.llama_bench(fake, tmp_path / "m.gguf", ["-p", "16"])
    assert calls.read_text().splitlines() == [f"-m {tmp_path / 'm.gguf'} -o json -p 16"]
