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


def test_a_llama_bench_that_crashes_at_its_default_runs_again_without_extra_layouts_and_says_so(tmp_path, monkeypatch):
    # llama.cpp issue 20824: ggml_backend_amx_mul_mat segfaults on some AMX Xeons; --repack 0 turns that buffer off.
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import anchor_llamacpp as anchor

    calls = tmp_path / "calls"
    fake = tmp_path / "llama-bench"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'case "$*" in *"--repack 0"*) echo \'[{"n_prompt": 16, "repack": false}]\' ;; *) kill -SEGV $$ ;; esac\n'
    )
    fake.chmod(0o755)
    records = anchor.llama_bench(fake, tmp_path / "m.gguf", ["-p", "16"])
    assert records == [{"n_prompt": 16, "repack": False, "retried_after": "llama-bench failed (killed by SIGSEGV): "}]
    assert calls.read_text().splitlines() == [
        f"-m {tmp_path / 'm.gguf'} -o json -p 16",
        f"-m {tmp_path / 'm.gguf'} -o json -p 16 --repack 0",
    ]
