"""`weights: auto`: the candidates are timed on this CPU, the fastest within the accuracy bound is chosen, and the
choice is cached per CPU and checkpoint."""

from __future__ import annotations

import json

import pytest

from edgeinspect.models import autoformat, cpu
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.kernels import build
from edgeinspect.models.stage import LayerRange, load_stage

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


@pytest.fixture
def format_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINSPECT_FORMAT_CACHE", str(tmp_path / "formats"))
    return tmp_path / "formats"


def test_auto_picks_the_measured_fastest_within_the_bound_and_caches_it(tiny_checkpoint, format_cache):
    ckpt = open_checkpoint(tiny_checkpoint)
    first = autoformat.choose_weights(ckpt, ("fp32", "int8", "int4"))
    assert not first.cached
    assert set(first.ms_per_layer_step) >= {"fp32", "int8"}
    assert first.weights in first.eligible
    assert first.ms_per_layer_step[first.weights] == min(first.ms_per_layer_step[f] for f in first.eligible)
    assert "fp32" in first.eligible and first.update_cosine["fp32"] == 1.0
    assert first.weights in first.why and "ms per layer-step" in first.why
    files = list(format_cache.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["weights"] == first.weights

    again = autoformat.choose_weights(ckpt, ("fp32", "int8", "int4"))
    assert again.cached and again.weights == first.weights
    assert again.ms_per_layer_step == first.ms_per_layer_step  # read back, not measured again
    # another candidate set is another measurement (its own cache entry)
    assert autoformat.cache_key(ckpt, ("fp32", "int8")) != autoformat.cache_key(ckpt, ("fp32", "int8", "int4"))


def test_a_changed_kernel_source_is_measured_again(tiny_checkpoint, tmp_path, monkeypatch):
    ckpt = open_checkpoint(tiny_checkpoint)
    before = autoformat.cache_key(ckpt, ("fp32", "int8"))
    edited = tmp_path / "int8_vnni.c"
    edited.write_bytes(build.Q8_SOURCE.read_bytes() + b"\n/* a kernel edited after the choice was cached */\n")
    monkeypatch.setattr(build, "Q8_SOURCE", edited)
    assert autoformat.cache_key(ckpt, ("fp32", "int8")) != before


def test_a_format_outside_the_accuracy_bound_is_never_chosen_however_fast():
    choice = autoformat.decide({"fp32": 9.0, "int8": 3.0, "int4": 1.0}, {"fp32": 1.0, "int8": 0.999, "int4": 0.95})
    assert choice.weights == "int8" and choice.eligible == ["fp32", "int8"]
    assert "int4 (cosine 0.9500" in choice.why
    assert autoformat.decide({"fp32": 2.0, "int8": 3.0}, {"fp32": 1.0, "int8": 0.999}).weights == "fp32"


def test_a_stage_loaded_as_auto_runs_the_chosen_format(tiny_checkpoint, format_cache):
    ckpt = open_checkpoint(tiny_checkpoint)
    chosen = autoformat.choose_weights(ckpt).weights
    module = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "auto")
    assert module.weights == chosen


ARM_CORE = "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\nCPU part\t: {part}\nCPU revision\t: 1\n\n"


def test_the_format_cache_names_the_cpu_on_arm_as_on_x86():
    """ARM's /proc/cpuinfo has no "model name": its cores are named from their part numbers, so a Pi 4's cached
    choice is not a Pi 5's, and a big.LITTLE box says both kinds of core."""
    rk3588 = "".join(
        f"processor\t: {i}\nFeatures\t: fp asimd asimddp\n" + ARM_CORE.format(part="0xd05" if i < 4 else "0xd0b")
        for i in range(8)
    )
    assert cpu.cpu_model_from(rk3588) == "Cortex-A55 x4 + Cortex-A76 x4"
    assert cpu.cpu_model_from(ARM_CORE.format(part="0xd08") * 4) == "Cortex-A72 x4"
    assert cpu.cpu_model_from(ARM_CORE.format(part="0xfff")) == "part 0xfff x1"  # an Arm core not in the table
    other = ARM_CORE.replace("0x41", "0x51").format(part="0x802")  # another vendor's core: its raw ids
    assert cpu.cpu_model_from(other) == "0x51/0x802 x1"
    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\nflags\t: avx2\n"
    assert cpu.cpu_model_from(x86) == "AMD EPYC 9654 96-Core Processor"
    assert cpu.cpu_model_from("") == ""
