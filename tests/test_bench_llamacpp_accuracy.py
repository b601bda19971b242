"""bench/anchor_llamacpp_accuracy.py: llama.cpp's files read back into our model, checked against what we wrote."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from bench_scripts import BENCH_DIR, run_bench

from edgeinspect.models.tiny import TinySpec, make_tiny


def bench_modules():
    sys.path.insert(0, str(BENCH_DIR))
    import anchor_llamacpp
    import anchor_llamacpp_accuracy

    return anchor_llamacpp, anchor_llamacpp_accuracy


def test_unpermute_undoes_the_rotary_row_order_the_gguf_writer_applies():
    """llama.cpp's q/k rows interleave each head's two rotary halves; reading them back must give HF's rows again,
    and the permutation must really move rows (else the check is empty)."""
    anchor, _ = bench_modules()
    heads, head_dim = 4, 8
    w = torch.arange(heads * head_dim * 3, dtype=torch.float32).reshape(heads * head_dim, 3)
    permuted = anchor._permute(w, heads)
    assert not torch.equal(permuted, w)
    assert torch.equal(permuted[1], w[head_dim // 2])  # head 0: row 1 of llama.cpp's is HF's second half's first
    assert torch.equal(anchor._unpermute(permuted, heads), w)


# Every row length a multiple of 256, so llama.cpp's k-quants take each tensor as it is (no fallback type).
SPEC = TinySpec(layers=2, hidden=256, heads=4, kv_heads=4, intermediate=512, initializer_range=0.02, seed=3)


@pytest.fixture(scope="module")
def ckpt256(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("ckpt") / "tiny256", SPEC)


@pytest.mark.slow  # builds llama.cpp once (~3 min on 2 cores, cached under ~/.cache/edgeinspect/llamacpp)
@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("c++")), reason="no cmake or C++ compiler")
def test_llamacpp_files_read_back_as_written_and_q4_0_is_our_grid(ckpt256):
    anchor, bench = bench_modules()
    from edgeinspect.models.checkpoint import open_checkpoint
    from edgeinspect.models.stage import LayerRange, load_stage

    ckpt = open_checkpoint(ckpt256)
    files = anchor.gguf_files(ckpt, ["q4_0"], anchor.binaries(anchor.build_flavour()))
    model = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "fp32")
    ours = {n: p.detach() for n, p in bench.parameters_by_gguf_name(model).items()}

    # The f16 file: every weight back in HF's layout, exactly the checkpoint's rounded to f16.
    f16 = bench.read_gguf(files["f16"], ckpt.text_config)
    assert set(f16) == set(ours)
    for name, w in ours.items():
        assert torch.equal(f16[name]["w"], w.half().float()), name

    # llama.cpp's q4_0 of the linears our int4 rounds is our q4_0 round trip of those f16 weights (the same grid and
    # scale rule; a value exactly between two steps may round the other way).
    q4 = bench.read_gguf(files["q4_0"], ckpt.text_config)
    grid = [n for n in ours if bench.is_grid(n)]
    assert {q4[n]["type"] for n in grid} == {"Q4_0"}
    assert bench.bits_per_weight(q4, grid) == 4.5
    same = sum(int((q4[n]["w"] == bench.round_trip_q4(f16[n]["w"])).sum()) for n in grid)
    assert same / sum(q4[n]["w"].numel() for n in grid) > 0.999


@pytest.mark.slow  # llama.cpp built (see above), two quantizations, three fp32 passes per file and two int stages
@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("c++")), reason="no cmake or C++ compiler")
def test_the_bench_on_a_small_checkpoint(ckpt256, tmp_path):
    got = run_bench(
        "anchor_llamacpp_accuracy",
        *("--checkpoint", str(ckpt256), "--quants", "q4_0,q8_0", "--ours", "int8,int4", "--tokens", "4"),
        out=tmp_path / "a.json",
        timeout=1800,
    )
    rows = got["llamacpp"]
    assert set(rows) == {"f16", "q4_0", "q8_0"}
    assert rows["f16"]["whole_file"]["min_cosine"] >= 0.9999
    assert rows["q4_0"]["grid_bits_per_weight"] == 4.5 and rows["q8_0"]["grid_bits_per_weight"] == 8.5
    # Finer grids cost less: the f16 file least, q4_0 the most; our round trip is q4_0's grid.
    assert rows["f16"]["grid"]["min_cosine"] >= rows["q8_0"]["grid"]["min_cosine"] > rows["q4_0"]["grid"]["min_cosine"]
    assert abs(got["ours_q4_0_round_trip_grid"]["min_cosine"] - rows["q4_0"]["grid"]["min_cosine"]) < 1e-3
    assert set(got["ours_whole"]) == {"int8", "int4"}
    # Bits read per decode token: q8_0 throughout; our int4 keeps down_proj and the lm_head int8.
    assert rows["q8_0"]["decode_bits_per_weight"] == 8.5
    ours_bits = {w: row["decode_bits_per_weight"] for w, row in got["ours_whole"].items()}
    assert 4.5 < ours_bits["int4"] < ours_bits["int8"]
    assert set(got["targets"]) == {"ours.int8.min_cosine", "ours.int4.min_cosine"}
    assert rows["f16"]["meets_cosine_target"]
