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
