"""Pure policy of ingest: sampling rules, change gating, latest-frame slot, in-flight limits, retention, keys."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinspect.services.ingest.config import GatingConfig, IngestSettings, SamplingConfig
from edgeinspect.services.ingest.delivery import idempotency_key, plan_prune
from edgeinspect.services.ingest.flow import InFlightLimits, LatestSlot
from edgeinspect.services.ingest.sampling import Sampler

BELT = np.full((36, 64, 3), 60, np.uint8)


def with_part(x: int = 20) -> np.ndarray:
    img = BELT.copy()
    img[8:28, x : x + 20] = 180
    return img


def run(sampler: Sampler, frames: list[np.ndarray], fps: float = 10.0) -> list[bool]:
    return [sampler.decide(i, i / fps, f).inspect for i, f in enumerate(frames)]


def test_every_n_inspects_one_frame_in_n():
    got = run(Sampler(SamplingConfig(every_n=4)), [BELT] * 12)
    assert got == [i % 4 == 0 for i in range(12)]


def test_max_rate_caps_inspections_per_second():
    got = run(Sampler(SamplingConfig(max_rate_hz=2.0)), [BELT] * 30, fps=10.0)  # 3 s of video
    assert sum(got) == 6 and [i for i, g in enumerate(got) if g] == [0, 5, 10, 15, 20, 25]


def test_gating_skips_a_static_scene_after_inspecting_it_once():
    sampler = Sampler(SamplingConfig(gating=GatingConfig(settle_threshold=None)))
    assert run(sampler, [with_part()] * 10) == [True] + [False] * 9


def test_gating_inspects_the_next_identical_part_once_the_previous_one_left_and_it_settled():
    gating = GatingConfig(threshold=8.0, settle_threshold=3.0)
    sampler = Sampler(SamplingConfig(gating=gating))
    moving = [with_part(x) for x in (0, 10)]
    frames = moving + [with_part(20)] * 4 + [BELT] * 4 + moving + [with_part(20)] * 4
    got = run(sampler, frames)
    # First settled frame of each stop is inspected; the empty belt (no background given) once in between.
    assert [i for i, g in enumerate(got) if g] == [3, 7, 13]


def test_gating_never_inspects_frames_that_match_the_background():
    from edgeinspect.services.ingest.sampling import thumbnail

    gating = GatingConfig(threshold=8.0, settle_threshold=3.0)
    sampler = Sampler(SamplingConfig(gating=gating), background=thumbnail(BELT, gating.size))
    frames = [BELT] * 4 + [with_part(10), with_part(20)] + [with_part(20)] * 4 + [BELT] * 4
    got = run(sampler, frames)
    assert [i for i, g in enumerate(got) if g] == [6]


def test_sensor_noise_does_not_count_as_change():
    import cv2

    rng = np.random.default_rng(0)
    scene = cv2.resize(with_part(), (640, 360), interpolation=cv2.INTER_NEAREST).astype(np.float32)
    noisy = [np.clip(scene + rng.normal(0, 6, scene.shape), 0, 255).astype(np.uint8) for _ in range(20)]
    got = run(Sampler(SamplingConfig(gating=GatingConfig())), noisy)
    assert sum(got) == 1


def test_trigger_inspects_the_first_frame_at_or_after_it_and_only_that_one():
    sampler = Sampler(SamplingConfig(trigger_only=True))
    assert not any(run(sampler, [BELT] * 5))
    sampler.trigger(at=0.65)
    got = [sampler.decide(i, i / 10, BELT) for i in range(5, 12)]
    assert [d.inspect for d in got] == [False, False, True, False, False, False, False]
    assert got[2].reason == "external trigger"


def test_forget_makes_the_gate_choose_the_current_scene_again():
    sampler = Sampler(SamplingConfig(gating=GatingConfig(settle_threshold=None)))
    assert run(sampler, [with_part()] * 3) == [True, False, False]
    sampler.forget()
    assert sampler.decide(3, 0.3, with_part()).inspect


def test_latest_slot_keeps_only_the_newest_and_returns_what_it_replaced():
    woken = []
    slot: LatestSlot[int] = LatestSlot(on_put=lambda: woken.append(1))
    assert slot.put(1) is None
    assert slot.put(2) == 1
    assert slot.put(3) == 2
    assert slot.take() == 3 and slot.take() is None and not slot.peek()
    assert len(woken) == 3


def test_in_flight_limits_hold_per_camera_and_overall():
    limits = InFlightLimits(total=3, per_camera={"a": 2, "b": 2})
    limits.start("a")
    limits.start("a")
    assert not limits.can_start("a")
    limits.start("b")
    assert not limits.can_start("b")  # the overall limit, b has room of its own
    limits.finish("a")
    assert limits.can_start("b") and limits.running() == 2
    with pytest.raises(RuntimeError):
        InFlightLimits(total=1, per_camera={"a": 1}).finish("a")


def test_retention_deletes_old_frames_then_the_oldest_beyond_the_count(tmp_path):
    now = 1_000_000.0
    files = [(tmp_path / f"{i}.jpg", now - i * 3600.0) for i in range(10)]  # one per hour, 0 h .. 9 h old
    doomed = plan_prune(files, now, max_age_s=5.5 * 3600, max_count=4)
    assert sorted(p.name for p in doomed) == sorted(f"{i}.jpg" for i in range(4, 10))
    assert plan_prune(files, now, None, None) == []


def test_idempotency_key_is_camera_and_capture_time_and_stable():
    assert idempotency_key("cam-1", 1700000000.123456) == idempotency_key("cam-1", 1700000000.123456)
    assert idempotency_key("cam-1", 1700000000.123456) == "cam-1:1700000000123456"
    assert idempotency_key("cam-1", 1.0) != idempotency_key("cam-2", 1.0)


def test_config_resolves_relative_paths_and_reads_the_token_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "cams.yaml").write_text(
        "cameras:\n"
        "  - {id: a, station: s, part: p, source: clips/a.mp4,"
        "     sampling: {gating: {background: empty.jpg}}}\n"
        "  - {id: b, station: s, part: p, source: 'rtsp://127.0.0.1:8554/x', rtsp_transport: udp}\n"
    )
    monkeypatch.setenv("EDGEINSPECT_API_TOKEN", "s3cret")
    settings = IngestSettings.load(tmp_path / "cams.yaml")
    assert settings.api_token == "s3cret"
    assert settings.cameras[0].source == str(tmp_path / "clips/a.mp4")
    assert settings.cameras[0].sampling.gating.background == tmp_path / "empty.jpg"
    assert settings.cameras[1].source == "rtsp://127.0.0.1:8554/x"


def test_config_rejects_repeated_camera_ids(tmp_path):
    (tmp_path / "cams.yaml").write_text(
        "cameras:\n  - {id: a, station: s, part: p, source: x.mp4}\n  - {id: a, station: s, part: p, source: y.mp4}\n"
    )
    with pytest.raises(ValueError, match="repeated: a"):
        IngestSettings.load(tmp_path / "cams.yaml")
