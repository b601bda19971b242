"""llama.cpp as a same-run baseline: built from a pinned source, fed the checkpoint's language model as GGUF.

What a user would run instead of us on a CPU box is llama.cpp, so the report benchmark measures it beside us. The
source is the llama.cpp tree that the `llama-cpp-python` sdist vendors (PyPI serves it; pinned below): downloaded
with pip, unpacked and built with cmake once (CPU only, Release, `-j2`) into a cache folder
($EDGEINSPECT_LLAMACPP_DIR, default ~/.cache/edgeinspect/llamacpp/<version>), of which only `llama-bench` and
`llama-quantize` are built. Nothing of it lives in the repository.

Which build runs is chosen by the CPU (build_flavour): `native` (GGML_NATIVE, -march=native: the same CPU features
our kernels get) everywhere except where the CPU has AMX: there llama.cpp's AMX path dies with SIGILL/SIGSEGV on
these VMs (llama.cpp issue 20824), so the anchor builds `avx512-noamx` (GGML_NATIVE off, AVX-512 F/BW/VL, VNNI and
BF16 on, every AMX option off): llama.cpp at its best without AMX, 17.4 s for the q4_0 text where the `--repack 0`
workaround it once fell back to gave 26.3 s. A llama-bench that still crashes is reported, never rerun crippled:
a ratio against a crippled baseline is not a result. Every record names the build that ran.

The checkpoint's language model is LLaMA-shaped (DeepSeek-VL's LM is LlamaForCausalLM), so it is written straight
to an f16 GGUF with the gguf-py package from the same tree (arch "llama"; q/k rows permuted as llama.cpp's own
converter does; the tokenizer's BPE vocab and merges, padded to the model's vocab size), then quantized to q8_0
and q4_0 with llama-quantize. GGUF files are cached by checkpoint fingerprint.

llama.cpp has no DeepSeek-VL vision path: its figures are text only (the same prompt length, no image encoder).
`llama-bench` runs with our report's shape: `-pg P,N` (a P-token prompt then N generated tokens, timed together:
"time to a complete report"), `-p P` (prefill tok/s), `-n N` at depth 0 and at depth P (decode at the report's
context), all with the same threads.

    .venv/bin/python bench/anchor_llamacpp.py [--checkpoint PATH] [--prompt-tokens 974] [--tokens 80]
        [--threads 2] [--reps 1] [--quants q8_0,q4_0]   # -> bench/results/anchor_llamacpp.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from common import cpu_flags, load_average, machine_info, require_checkpoint, skip, write_json

LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp we build
BUILD_TARGETS = ("llama-bench", "llama-quantize")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
# The instruction-set flags of each build flavour (build_flavour picks one by the CPU's flags).
FLAVOUR_FLAGS = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx512-noamx": (
        "-DGGML_NATIVE=OFF",
        *(f"-DGGML_{x}=ON" for x in ("AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512", "AVX512_VNNI", "AVX512_BF16")),
        *(f"-DGGML_AMX_{x}=OFF" for x in ("TILE", "INT8", "BF16")),
    ),
}
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CKPT = ROOT / "var" / "checkpoints" / "deepseek-vl-1.3b"


# A decoder layer's tensors: checkpoint name (under the layer's prefix) -> GGUF name (under "blk.<i>.").
LAYER_TENSORS = {
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "ffn_norm",
}
# The tensors whose rows llama.cpp keeps in its own rotary order, and the config field that gives their head count.
ROTARY_HEADS = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}


class Unavailable(Exception):
    """llama.cpp cannot be built or run here (no compiler, no cmake, no source); the message says why."""


def cache_dir() -> Path:
    base = os.environ.get("EDGEINSPECT_LLAMACPP_DIR")
    return Path(base) if base else Path.home() / ".cache" / "edgeinspect" / "llamacpp" / LLAMA_CPP_PYTHON


def source_dir() -> Path:
    """The vendored llama.cpp tree, unpacked from the pinned sdist on first use."""
    src = cache_dir() / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    src.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=src.parent) as tmp:
        print(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON} (sdist) for its llama.cpp tree", flush=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", tmp]
        done = subprocess.run(
            [*pip, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], capture_output=True, text=True, errors="replace"
        )
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            raise Unavailable(f"pip could not download the llama-cpp-python sdist: {done.stderr.strip()[-300:]}")
        prefix = f"{sdists[0].name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name.removeprefix(prefix)
            tar.extractall(Path(tmp) / "llama.cpp", members=[m for m in members if m.name], filter="data")
        os.replace(Path(tmp) / "llama.cpp", src)
    return src


def build_flavour(flags: set[str] | None = None) -> str:
    """`avx512-noamx` on a CPU with AMX (llama.cpp's AMX path crashes on these VMs), else `native`."""
    flags = set(cpu_flags()) if flags is None else flags
    return "avx512-noamx" if any(f.startswith("amx") for f in flags) and "avx512f" in flags else "native"


def binaries(flavour: str) -> dict[str, Path]:
    """llama-bench and llama-quantize of one build flavour, built on first use (minutes on 2 cores); Unavailable
    without a toolchain."""
    build = cache_dir() / f"build-{flavour}"
    found = {t: build / "bin" / t for t in BUILD_TARGETS}
    if all(p.is_file() for p in found.values()):
        return found
    missing = [tool for tool in ("cmake", "cc", "c++") if shutil.which(tool) is None]
    if missing:
        raise Unavailable(f"no {' or '.join(missing)} on this machine to build llama.cpp (apt-get install cmake g++)")
    src = source_dir()
    log = cache_dir() / f"build-{flavour}.log"
    t0 = time.perf_counter()
    print(f"building llama.cpp {flavour} ({', '.join(BUILD_TARGETS)}) in {build}; log: {log}", flush=True)
    with log.open("w") as out:
        for cmd in (
            ["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS, *FLAVOUR_FLAGS[flavour]],
            ["cmake", "--build", str(build), "-j2", "--target", *BUILD_TARGETS],
        ):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise Unavailable(f"the llama.cpp build failed ({' '.join(cmd[:3])}...); see {log}")
    print(f"built llama.cpp in {time.perf_counter() - t0:.0f} s", flush=True)
    return found


def _gguf_module(src: Path):
    sys.path.insert(0, str(src / "gguf-py"))  # the gguf-py of the same tree as the binaries that read the files
    import gguf

    return gguf


def _permute(w, heads: int):
    """HF's rotary layout (halves) -> llama.cpp's (interleaved pairs), as convert_hf_to_gguf.py's LlamaModel does."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(w, heads: int):
    """llama.cpp's rotary layout (interleaved pairs) -> HF's (halves): _permute's inverse."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(ckpt, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) from the checkpoint's tokenizer.json (byte-level BPE), padded to vocab_size."""
    data = json.loads((ckpt.path / "tokenizer.json").read_text())
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [5] * vocab_size  # UNUSED
    for text, i in data["model"]["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = text, 1  # NORMAL
    for added in data.get("added_tokens", []):
        if added["id"] < vocab_size:
            tokens[added["id"]], types[added["id"]] = added["content"], 3 if added.get("special") else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"].get("merges", [])]
    return tokens, types, merges


def write_f16_gguf(ckpt, out: Path) -> None:
    """The checkpoint's language model as an f16 LLaMA GGUF (norms in f32, as llama.cpp's converter keeps them)."""
    import torch

    from edgeinspect.models.checkpoint import EMBED_KEY, NORM_KEY, layer_prefix

    gguf = _gguf_module(source_dir())
    cfg = ckpt.text_config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    w = gguf.GGUFWriter(str(out) + ".tmp", "llama")
    w.add_name(f"edgeinspect-{ckpt.fingerprint}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types, merges = _vocab(ckpt, cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)

    def add(name: str, t: torch.Tensor, norm: bool = False) -> None:
        w.add_tensor(name, t.float().numpy() if norm else t.half().numpy())

    top = ckpt.read([EMBED_KEY, NORM_KEY, ckpt.lm_head_key], torch.float32)
    add("token_embd.weight", top[EMBED_KEY])
    for i in range(cfg.num_hidden_layers):
        prefix = layer_prefix(i)
        layer = ckpt.read([prefix + k for k in LAYER_TENSORS], torch.float32, strip=prefix)
        for key, short in LAYER_TENSORS.items():
            t = layer[key]
            if short in ROTARY_HEADS:
                t = _permute(t, getattr(cfg, ROTARY_HEADS[short]))
            add(f"blk.{i}.{short}.weight", t, norm=short.endswith("norm"))
    add("output_norm.weight", top[NORM_KEY], norm=True)
    add("output.weight", top[ckpt.lm_head_key])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(out) + ".tmp", out)


def gguf_files(ckpt, quants: list[str], bins: dict[str, Path]) -> dict[str, Path]:
    """f16 GGUF of the checkpoint's LM and each quantized form, cached by checkpoint fingerprint."""
    folder = cache_dir() / "models"
    folder.mkdir(parents=True, exist_ok=True)
    f16 = folder / f"{ckpt.fingerprint}-f16.gguf"
    if not f16.is_file():
        print(f"writing {f16.name}", flush=True)
        write_f16_gguf(ckpt, f16)
    out = {"f16": f16}
    for q in quants:
        path = folder / f"{ckpt.fingerprint}-{q}.gguf"
        if not path.is_file():
            print(f"llama-quantize {q} -> {path.name}", flush=True)
            done = subprocess.run(
                [str(bins["llama-quantize"]), str(f16), str(path) + ".tmp", q],
                capture_output=True,
                text=True,
                errors="replace",
            )
            if done.returncode != 0:
                raise failed(f"llama-quantize {q}", done)
            os.replace(str(path) + ".tmp", path)
        out[q] = path
    return out


def failed(what: str, done: subprocess.CompletedProcess) -> Unavailable:
    """A llama.cpp tool's failure, saying how it ended: a crash leaves stderr empty, so the signal is named."""
    code = done.returncode
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
    return Unavailable(f"{what} failed ({how}): {done.stderr.strip()[-400:]}")


def llama_bench(binary: Path, model: Path, args: list[str]) -> list[dict]:
    """One llama-bench invocation (JSON output), each test's record. A crash is reported with its signal and never
    retried with llama.cpp's weight layouts off (`--repack 0` made it ~1.5x slower: not the baseline a user gets)."""
    done = subprocess.run(
        [str(binary), "-m", str(model), "-o", "json", *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=3600,
    )
    if done.returncode != 0:
        raise failed("llama-bench", done)
    return json.loads(done.stdout)


def measure(ckpt, prompt_tokens: int, tokens: int, threads: int, reps: int, quants: list[str]) -> dict:
    """Each quant's text-only report time (pg), prefill tok/s, decode ms/token at depth 0 and at the prompt's depth."""
    flavour = build_flavour()
    bins = binaries(flavour)
    files = gguf_files(ckpt, quants, bins)
    common = ["-t", str(threads), "-r", str(reps)]
    out = {}
    for q in quants:
        print(f"llama-bench {q}: -p {prompt_tokens} -n {tokens} -pg {prompt_tokens},{tokens} -t {threads}", flush=True)
        load = load_average()
        first = llama_bench(
            bins["llama-bench"],
            files[q],
            [*common, "-p", str(prompt_tokens), "-n", str(tokens), "-pg", f"{prompt_tokens},{tokens}"],
        )
        deep_args = [*common, "-p", "0", "-n", str(tokens), "-d", str(prompt_tokens)]
        deep = llama_bench(bins["llama-bench"], files[q], deep_args)
        rows = {(r["n_prompt"], r["n_gen"], r.get("n_depth", 0)): r for r in first + deep}
        pg = rows[(prompt_tokens, tokens, 0)]
        pp = rows[(prompt_tokens, 0, 0)]
        tg0 = rows[(0, tokens, 0)]
        tgd = rows[(0, tokens, prompt_tokens)]
        out[q] = {
            "report_text_only_s": round(pg["avg_ns"] / 1e9, 3),
            "prefill_tok_s": round(pp["avg_ts"], 1),
            "prefill_s": round(pp["avg_ns"] / 1e9, 3),
            "decode_ms_per_token_depth0": round(tg0["avg_ns"] / 1e6 / tokens, 2),
            f"decode_ms_per_token_depth{prompt_tokens}": round(tgd["avg_ns"] / 1e6 / tokens, 2),
            "decode_ms_per_token_at_depth": round(tgd["avg_ns"] / 1e6 / tokens, 2),
            "model_bytes": files[q].stat().st_size,
            "loadavg_before": load,
            "build": pg.get("build_commit", ""),
            "cpu_info": pg.get("cpu_info", ""),
        }
        print(f"  {q}: {json.dumps(out[q])}", flush=True)
    return {
        "what": "llama.cpp llama-bench, text only (no DeepSeek-VL vision path), same prompt length and threads",
        "source": f"llama-cpp-python=={LLAMA_CPP_PYTHON} sdist (vendored llama.cpp), cmake Release, {flavour}",
        "build_flavour": flavour,
        "cmake_flags": list(FLAVOUR_FLAGS[flavour]),
        "prompt_tokens": prompt_tokens,
        "tokens": tokens,
        "threads": threads,
        "reps": reps,
        "quants": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CKPT)
    ap.add_argument("--prompt-tokens", type=int, default=974, help="the report benchmark's prompt length")
    ap.add_argument("--tokens", type=int, default=80, help="generated tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="llama-bench -r")
    ap.add_argument("--quants", default="q8_0,q4_0")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    require_checkpoint(args.checkpoint)
    from edgeinspect.models.checkpoint import open_checkpoint

    machine = machine_info(bandwidth=False)
    try:
        result = measure(
            open_checkpoint(args.checkpoint),
            args.prompt_tokens,
            args.tokens,
            args.threads,
            args.reps,
            [q for q in args.quants.split(",") if q],
        )
    except Unavailable as e:
        skip(str(e))
    payload = {"benchmark": "anchor_llamacpp", "machine": machine | {"loadavg_end": load_average()}} | result
    print(f"-> {write_json('anchor_llamacpp', payload, args.out)}")


if __name__ == "__main__":
    main()
