"""The anomaly gate's core: features, coreset, teach, bank store, scoring, on frames drawn here."""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgeinspect.errors import FailedPrecondition, InvalidInput, NotFound
from edgeinspect.models.anomaly.bank import BankStore
from edgeinspect.models.anomaly.coreset import greedy_coreset
from edgeinspect.models.anomaly.features import open_extractor
from edgeinspect.models.anomaly.scoring import DEFECT, BankMismatch, Scorer, heatmap_png, heatmap_scores, pixel_grid
from edgeinspect.models.anomaly.teach import TeachError, load_frames, teach

SIZE = 160
DEFECT_BOX = (96, 40, 120, 64)  # x0, y0, x1, y1 px of the drawn blob


def good_frame(rng: np.random.Generator) -> np.ndarray:
    """A smooth woven texture shifted a few px, with lighting gain and sensor noise: no two frames alike."""
    canvas = SIZE + 16
    y, x = np.mgrid[0:canvas, 0:canvas].astype(np.float32)
    base = 128 + 30 * np.sin(2 * np.pi * x / 32 + 0.8 * np.sin(2 * np.pi * y / 48)) + 20 * np.cos(2 * np.pi * y / 24)
    rgb = np.stack([base, base * 0.9 + 10, base * 0.8 + 20], -1) * rng.uniform(0.97, 1.03)  # [C, C, 3]
    dx, dy = rng.integers(0, 5, 2)
    frame = rgb[dy : dy + SIZE, dx : dx + SIZE] + rng.normal(0, 3, (SIZE, SIZE, 3))
    return np.clip(frame, 0, 255).astype(np.uint8)


def defect_frame(rng: np.random.Generator) -> np.ndarray:
    """A good frame with a dark stain blob inside DEFECT_BOX."""
    frame = good_frame(rng).copy()
    x0, y0, x1, y1 = DEFECT_BOX
    cv2.ellipse(frame, ((x0 + x1) // 2, (y0 + y1) // 2), ((x1 - x0) // 2, (y1 - y0) // 2), 0, 0, 360, (40, 30, 20), -1)
    return frame


@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(0)
    teach_set = [(f"good_{i:02d}.png", good_frame(rng)) for i in range(10)]
    return teach_set, [good_frame(rng) for _ in range(3)], defect_frame(rng)


@pytest.fixture(scope="module")
def raw():
    return open_extractor("raw-pixel")


@pytest.fixture(scope="module")
def effnet():
    return open_extractor("efficientnet-lite0")


@pytest.fixture(scope="module")
def raw_bank(frames, raw):
    bank, _ = teach(frames[0], raw, "woven")
    return bank


def _overlaps(region, box_px) -> bool:
    x0, y0, x1, y1 = (v / SIZE for v in box_px)
    return region.x0 < x1 and x0 < region.x1 and region.y0 < y1 and y0 < region.y1


@pytest.mark.parametrize("name", ["raw-pixel", "efficientnet-lite0"])
def test_a_drawn_defect_is_flagged_where_it_is_and_held_out_good_frames_pass(name, frames, raw, effnet):
    teach_set, held_out, defect = frames
    extractor = {"raw-pixel": raw, "efficientnet-lite0": effnet}[name]
    bank, report = teach(teach_set, extractor, "woven")
    assert report.outliers == [] and len(report.kept) == 10 and bank.version == 0
    results = Scorer(bank, extractor).score([*held_out, defect])
    for good in results[:3]:  # at most UNCERTAIN: above every teach frame's LOO score, under the threshold
        assert good.score < good.threshold and good.verdict != DEFECT
    flagged = results[3]
    assert flagged.score > flagged.threshold and flagged.verdict == DEFECT
    assert flagged.heatmap.shape == (SIZE, SIZE) and flagged.heatmap.dtype == np.float32
    assert _overlaps(flagged.regions[0], DEFECT_BOX), flagged.regions
    assert flagged.bank_id == bank.bank_id and flagged.fingerprint == extractor.fingerprint

    png = heatmap_png(defect, flagged.heatmap, flagged.threshold)
    picture = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and picture.shape == (SIZE, SIZE, 3)


def test_fingerprints_follow_name_layers_and_normalisation(raw, effnet):
    imagenet = open_extractor("efficientnet-lite0", normalisation="imagenet")
    other_layers = open_extractor("efficientnet-lite0", layers=[3, 10])
    prints = {raw.fingerprint, effnet.fingerprint, imagenet.fingerprint, other_layers.fingerprint}
    assert len(prints) == 4 and all(len(p) == 16 and int(p, 16) >= 0 for p in prints)
    # The same options rebuild the same extractor (a bank's describe() is enough to score against it again).
    described = effnet.describe()
    assert open_extractor(described["name"], **described["options"]).fingerprint == effnet.fingerprint
    # The default input is 448 px since issue 64 (real photographs): a 56x56 grid of stride-8 patches.
    assert described["grid"] == [56, 56] and described["channels"] == 120  # blocks 4 + 7: 40 + 80
    assert raw.describe()["grid"] == [28, 28] and raw.describe()["channels"] == 192


def test_unknown_extractors_and_options_are_refused():
    with pytest.raises(InvalidInput, match="raw-pixel"):
        open_extractor("resnet")
    with pytest.raises(InvalidInput, match="options"):
        open_extractor("raw-pixel", layers=(1, 2))


def test_a_scorer_refuses_a_bank_of_another_fingerprint(raw_bank, effnet):
    with pytest.raises(BankMismatch, match=raw_bank.fingerprint) as refused:
        Scorer(raw_bank, effnet)
    assert effnet.fingerprint in str(refused.value) and refused.value.status == "FAILED_PRECONDITION"


def test_publish_versions_and_rollback(raw_bank, tmp_path):
    store = BankStore(tmp_path / "banks")
    assert store.current("woven") is None and store.list_parts() == []
    first = store.publish(raw_bank)
    second = store.publish(raw_bank)
    assert (first.version, second.version) == (1, 2) and store.list_parts() == ["woven"]
    assert [b.version for b in store.versions("woven")] == [1, 2]
    assert store.current("woven").bank_id == second.bank_id == f"woven@v2:{raw_bank.content_hash[:8]}"
    loaded = store.load("woven", 1)
    np.testing.assert_array_equal(loaded.features, raw_bank.features)
    assert (loaded.threshold, loaded.band, loaded.grid) == (raw_bank.threshold, raw_bank.band, raw_bank.grid)
    assert store.rollback("woven", 1).version == 1 and store.current("woven").version == 1
    with pytest.raises(NotFound, match="no bank version 7"):
        store.rollback("woven", 7)


def test_a_whitened_bank_round_trips_and_banks_taught_before_whitening_score_raw_features(raw, frames, tmp_path):
    teach_set, held_out, _ = frames
    white, _ = teach(teach_set, raw, "woven")
    plain, _ = teach(teach_set, raw, "woven", whiten=False)
    c = white.features.shape[1]
    assert white.whitening.shape == (c + 1, c) and plain.whitening is None
    assert white.content_hash != plain.content_hash  # the whitening decides verdicts, so the hash covers it
    store = BankStore(tmp_path / "banks")
    loaded = store.load("woven", store.publish(white).version)
    np.testing.assert_array_equal(loaded.whitening, white.whitening)
    assert Scorer(loaded, raw).score([held_out[0]])[0].score == Scorer(white, raw).score([held_out[0]])[0].score
    # A bank written before whitening existed: no whitening.npy, no field in bank.json; its id and scores hold.
    old = store.publish(plain)
    folder = tmp_path / "banks" / "woven" / f"v{old.version:04d}"
    meta = json.loads((folder / "bank.json").read_text())
    meta.pop("whitening", None)
    (folder / "bank.json").write_text(json.dumps(meta))
    assert not (folder / "whitening.npy").exists()
    again = store.load("woven", old.version)
    assert again.whitening is None and again.bank_id == old.bank_id
    assert Scorer(again, raw).score([held_out[0]])[0].score == Scorer(plain, raw).score([held_out[0]])[0].score


@pytest.mark.parametrize("step", ["_write_version", "_set_pointer"])
def test_a_crash_mid_publish_leaves_the_previous_version_current(step, raw_bank, tmp_path, monkeypatch):
    store = BankStore(tmp_path / "banks")
    store.publish(raw_bank)
    write_version = BankStore._write_version

    def crash(*args):
        if step == "_write_version":
            write_version(*args)  # the temporary folder is whole, then the process "dies" before the rename
        raise OSError("disk gone")  # or: the new version is in place, CURRENT not yet swapped

    monkeypatch.setattr(BankStore, step, staticmethod(crash))
    with pytest.raises(OSError, match="disk gone"):
        store.publish(raw_bank)
    monkeypatch.undo()
    current = store.current("woven")
    assert current.version == 1 and (tmp_path / "banks/woven/CURRENT").read_text() == "v0001\n"
    assert sorted(p.name for p in (tmp_path / "banks/woven").iterdir() if not p.name.startswith(".lock")) == [
        "CURRENT",
        "v0001",
    ]
    np.testing.assert_array_equal(current.features, raw_bank.features)


@pytest.mark.parametrize("part", ["../etc", "a/b", "", ".", "..", "x" * 65])
def test_part_names_cannot_leave_the_store(part, raw_bank, tmp_path):
    store = BankStore(tmp_path)
    with pytest.raises(InvalidInput, match="part name"):
        store.load(part)
    bank = dataclasses.replace(raw_bank, part=part)
    with pytest.raises(InvalidInput, match="part name"):
        store.publish(bank)


@pytest.mark.parametrize("count", [0, 1])
def test_teach_refuses_too_few_frames(count, frames, raw):
    with pytest.raises(TeachError, match="at least 5 good frames") as refused:
        teach(frames[0][:count], raw, "woven")
    assert refused.value.status == "INVALID_ARGUMENT"


def test_an_outlier_in_the_teach_set_is_reported_and_left_out(frames, raw):
    teach_set, _, defect = frames
    bank, report = teach([*teach_set, ("oops.png", defect)], raw, "woven")
    assert [o.name for o in report.outliers] == ["oops.png"] and "oops.png" not in report.kept
    assert len(bank.teach_hashes) == 10 and "oops.png" in report.summary()
    assert bank.stats["outliers"][0]["name"] == "oops.png"


def test_a_frame_a_person_vouched_for_is_never_left_out_as_an_outlier(frames, raw):
    teach_set, _, defect = frames
    bank, report = teach([*teach_set, ("vouched.png", defect)], raw, "woven", vouched={"vouched.png"})
    assert not report.outliers and "vouched.png" in report.kept and len(bank.teach_hashes) == 11


def test_frames_of_another_aspect_ratio_are_refused(frames, raw):
    teach_set = list(frames[0][:6])
    wide = ("wide.png", np.zeros((SIZE, 2 * SIZE, 3), np.uint8))
    with pytest.raises(TeachError, match=r"wide\.png \(320x160\)"):
        teach([*teach_set, wide], raw, "woven")
    sliver = [(f"s{i}.png", np.zeros((20, 400, 3), np.uint8)) for i in range(6)]
    with pytest.raises(TeachError, match="too narrow"):
        teach(sliver, raw, "woven")


def test_load_frames_names_a_corrupt_file(frames, tmp_path):
    for name, frame in frames[0][:2]:
        cv2.imwrite(str(tmp_path / name), frame[..., ::-1])
    loaded = load_frames(tmp_path)
    assert [n for n, _ in loaded] == ["good_00.png", "good_01.png"]
    np.testing.assert_array_equal(loaded[0][1], frames[0][0][1])  # RGB, lossless
    data = (tmp_path / "good_01.png").read_bytes()
    (tmp_path / "good_02.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(TeachError, match="good_02.png"):
        load_frames(tmp_path)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's own, on the header
def test_a_12000x12000_frame_is_refused_before_it_is_decoded(tmp_path):
    # A valid PNG header for 12000x12000 RGB and a few bytes of pixels: decoding would fail as "truncated", so
    # the pixel-limit message proves the refusal came from the header alone (and no 432 MB buffer was made).
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", 12000, 12000, 8, 2, 0, 0, 0)
    png = (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )
    (tmp_path / "huge.png").write_bytes(png)
    with pytest.raises(TeachError, match=r"huge\.png: .*144000000 pixels.*limit"):
        load_frames(tmp_path)


def test_greedy_coreset_keeps_the_requested_count_deterministically():
    rng = np.random.default_rng(1)
    # One big cluster and 19 small ones far apart: k-center must visit every small one, a random pick misses some.
    centres = np.repeat(rng.standard_normal((20, 300)) * 10, [1905] + [5] * 19, axis=0)
    features = (centres + rng.standard_normal((2000, 300))).astype(np.float32)  # [2000, 300]
    picked = greedy_coreset(features, 0.1)
    assert len(picked) == 200 and len(set(picked.tolist())) == 200
    np.testing.assert_array_equal(picked, greedy_coreset(features, 0.1))
    assert not np.array_equal(picked, greedy_coreset(features, 0.1, seed=1))
    assert len(greedy_coreset(features, 1.0)) == 2000 and len(greedy_coreset(features[:3], 0.01)) == 1

    def radius(subset):  # the farthest any patch lies from its nearest kept patch (squared)
        kept = features[subset]
        d = (features**2).sum(1)[:, None] - 2 * features @ kept.T + (kept**2).sum(1)[None, :]  # [2000, 200]
        return d.min(1).max()

    assert radius(picked) < 0.5 * radius(rng.choice(2000, 200, replace=False))


def test_siglip_scores_the_towers_hidden_states_like_its_own_extract(tiny_checkpoint, frames):
    import torch

    extractor = open_extractor("siglip", checkpoint=str(tiny_checkpoint))
    last_only = open_extractor("siglip", checkpoint=str(tiny_checkpoint), layers=[2])
    assert extractor.fingerprint != last_only.fingerprint
    description = extractor.describe()
    assert (
        description["grid"] == [4, 4] and description["channels"] == 64 and description["options"]["layers"] == [1, 2]
    )
    teach_set, held_out, _ = frames
    grid = extractor.extract([f for _, f in teach_set[:2]])
    assert grid.shape == (2, 4, 4, 64) and grid.dtype == np.float32

    # The vision node's path: hidden states it computed anyway -> the same features -> scores without a re-encode.
    from edgeinspect.models.anomaly.features import resize_batch, to_nchw

    x = to_nchw(resize_batch(held_out, extractor.input_size), extractor.mean, extractor.std)
    with torch.inference_mode():
        hidden = extractor._tower.vision_model(x, output_hidden_states=True).hidden_states
    from_node = extractor.features_from_hidden_states(hidden)
    np.testing.assert_allclose(from_node, extractor.extract(held_out), rtol=1e-5, atol=1e-5)
    bank, _ = teach(teach_set, extractor, "woven")
    results = Scorer(bank, extractor).score_features(from_node, [(SIZE, SIZE)] * 3)
    assert [r.heatmap.shape for r in results] == [(SIZE, SIZE)] * 3


def test_onnx_extractor_concatenates_named_feature_maps(tmp_path, frames):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 8, 8)).astype(np.float32) * 0.05, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((6, 4, 2, 2)).astype(np.float32) * 0.5, "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["fine"], strides=[8, 8]),
         helper.make_node("Conv", ["fine", "w2"], ["coarse"], strides=[2, 2])],
        "features",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 224, 224])],
        [helper.make_tensor_value_info("fine", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("coarse", TensorProto.FLOAT, None)],
        [w1, w2],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "plant.onnx"
    onnx.save(model, path)
    extractor = open_extractor("onnx", path=str(path), outputs=["fine", "coarse"], mean=[0.5] * 3, std=[0.25] * 3)
    assert extractor.extract([f for _, f in frames[0][:2]]).shape == (2, 28, 28, 10)
    assert extractor.describe()["grid"] == [28, 28]
    scaled = open_extractor("onnx", path=str(path), outputs=["fine", "coarse"])
    assert scaled.fingerprint != extractor.fingerprint
    with pytest.raises(InvalidInput, match="no outputs"):
        open_extractor("onnx", path=str(path), outputs=["layer9"])
    model.graph.initializer[0].raw_data = (numpy_helper.to_array(w1) * 2).tobytes()
    onnx.save(model, Path(tmp_path / "retrained.onnx"))
    retrained = open_extractor("onnx", path=str(tmp_path / "retrained.onnx"), outputs=["fine", "coarse"])
    assert retrained.fingerprint != scaled.fingerprint


def test_a_staged_version_is_written_whole_but_never_current_until_promoted(raw_bank, tmp_path):
    store = BankStore(tmp_path / "banks")
    live = store.publish(raw_bank)
    staged = store.publish(raw_bank, stage=True)
    assert (staged.version, store.current_version("woven"), store.staged_version("woven")) == (2, 1, 2)
    assert store.current("woven").bank_id == live.bank_id and store.staged("woven").bank_id == staged.bank_id
    with pytest.raises(FailedPrecondition, match="v2 is staged, never live: promote it"):
        store.rollback("woven", 2)
    assert store.promote("woven", 2).version == 2
    assert (store.current_version("woven"), store.staged_version("woven")) == (2, None)
    assert not (tmp_path / "banks/woven/STAGED").exists()


def test_promote_refuses_what_is_not_staged_and_names_why(raw_bank, tmp_path):
    store = BankStore(tmp_path / "banks")
    store.publish(raw_bank)
    with pytest.raises(FailedPrecondition, match="v1 is already the current version"):
        store.promote("woven", 1)
    with pytest.raises(NotFound, match="no bank version 9"):
        store.promote("woven", 9)
    store.publish(raw_bank)
    store.rollback("woven", 1)
    with pytest.raises(FailedPrecondition, match=r"v2 is not staged \(no version is staged\)"):
        store.promote("woven", 2)  # an old live version goes back with rollback, not promote
    # A crash between promote's two swaps leaves STAGED naming the current version: nothing reads as staged.
    (tmp_path / "banks/woven/STAGED").write_text("v0001\n")
    assert store.staged_version("woven") is None


def test_go_live_gate_refuses_without_figures_stale_or_failed_ones_unless_forced(raw_bank, tmp_path):
    from edgeinspect.models.anomaly import golive

    store = BankStore(tmp_path / "banks")
    current = store.publish(raw_bank)
    staged = store.publish(raw_bank, stage=True)
    with pytest.raises(FailedPrecondition, match="v2 may not go live: v2 has no go-live figures"):
        golive.promote(store, "woven", 2)
    figures = {"escaped": 5, "n_defect": 20, "flagged_good": 0, "n_good": 20}
    base = {"escaped": 0, "n_defect": 20, "flagged_good": 0, "n_good": 20}  # escape 0/20: upper bound 16.1%
    failures = golive.regressions(figures, base)
    assert len(failures) == 1 and failures[0].startswith("escape 5/20 = 25.0% is above the current bank's 0/20")
    assert golive.regressions({**figures, "escaped": 3}, base) == []  # 15%: inside the interval
    record = {"bank_id": staged.bank_id, "baseline_bank_id": current.bank_id, "failures": failures}
    path = golive.record_path(store, "woven", 2)
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    with pytest.raises(FailedPrecondition, match="escape 5/20 = 25.0%"):
        golive.promote(store, "woven", 2)
    path.write_text(json.dumps({**record, "baseline_bank_id": "woven@v7:00000000"}))
    with pytest.raises(FailedPrecondition, match="were taken against woven@v7"):
        golive.promote(store, "woven", 2)
    assert store.current_version("woven") == 1  # every refusal left the live version alone
    path.write_text(json.dumps({**record, "failures": []}))
    assert golive.promote(store, "woven", 2).bank_id == staged.bank_id and store.current_version("woven") == 2
    store.publish(raw_bank, stage=True)
    assert golive.promote(store, "woven", 3, force=True).version == 3  # no figures at all, forced


def test_the_heatmap_png_carries_its_raw_scores_at_the_pixel_grid():
    heatmap = np.linspace(0.0, 3.0, 600 * 400, dtype=np.float32).reshape(400, 600)  # [H, W], long side > 256
    png = heatmap_png(np.zeros((400, 600, 3), np.uint8), heatmap, 1.0)
    assert cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR).shape == (400, 600, 3)  # still a picture
    scores = heatmap_scores(png)
    assert scores.shape == (171, 256) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, pixel_grid(heatmap), rtol=1e-3, atol=1e-4)  # float16
    assert heatmap_scores(cv2.imencode(".png", np.zeros((4, 4), np.uint8))[1].tobytes()) is None
