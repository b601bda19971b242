"""`backend: auto` on the vision node: every candidate that runs here is timed on the sample part, the fastest
within the visual-token accuracy bound is kept, and a restart reads the choice from the cache."""

from __future__ import annotations

import json

import pytest

from edgeinspect.assets import sample_image
from edgeinspect.models.kernels import bindings
from edgeinspect.services.vision.autobackend import MIN_TOKEN_COSINE, decide
from edgeinspect.services.vision.encoder import VisionEncoder
from edgeinspect.services.vision.settings import VisionSettings

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


def test_the_fastest_candidate_within_the_bound_wins_and_a_faster_inaccurate_one_is_refused():
    ms = {"torch-fp32": 100.0, "onnxruntime-fp32": 40.0, "onnxruntime-int8": 10.0}
    cos = {"torch-fp32": 1.0, "onnxruntime-fp32": 0.99999, "onnxruntime-int8": MIN_TOKEN_COSINE - 0.01}
    choice = decide(ms, cos)
    assert choice.backend == "onnxruntime-fp32"
    assert "refused: onnxruntime-int8" in choice.why and choice.eligible == ["torch-fp32", "onnxruntime-fp32"]
    only_reference = decide({"torch-fp32": 5.0, "torch-bf16": 1.0}, {"torch-fp32": 1.0, "torch-bf16": 0.5})
    assert only_reference.backend == "torch-fp32"  # the reference always qualifies


def test_auto_measures_once_keeps_the_winner_and_a_restart_uses_the_cache(tiny_checkpoint, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("EDGEINSPECT_FORMAT_CACHE", str(tmp_path / "cache"))
    cfg = VisionSettings(checkpoint=tiny_checkpoint, backend="auto", onnx_path=tmp_path / "onnx" / "vision.onnx")
    encoder = VisionEncoder.load(cfg)
    (cached,) = (tmp_path / "cache").glob("vision-*.json")
    choice = json.loads(cached.read_text())
    torch_int8 = {"torch-int8"} if bindings.q8_fast() else set()
    everywhere = {"torch-fp32", "torch-bf16", "onnxruntime-fp32", "onnxruntime-int8"}
    assert set(choice["ms_per_image"]) == everywhere | torch_int8
    fastest = min(choice["eligible"], key=choice["ms_per_image"].get)
    assert choice["backend"] == fastest and "torch-fp32" in choice["eligible"]
    assert all(choice["min_token_cosine"][n] >= MIN_TOKEN_COSINE for n in choice["eligible"] if n != "torch-fp32")
    expected = "torch" if choice["backend"].startswith("torch-") else "onnxruntime"
    assert encoder.backend.name == expected
    first = encoder.encode(sample_image().read_bytes()).tokens

    again = VisionEncoder.load(cfg)  # the restart: the cached choice, loaded alone, encodes the same
    assert again.backend.name == expected
    assert (again.encode(sample_image().read_bytes()).tokens - first).abs().max() < 1e-4
    assert list((tmp_path / "cache").glob("vision-*.json")) == [cached]
