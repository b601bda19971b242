"""The drift watch (services/gateway/drift.py): good parts' anomaly scores creeping toward the OK cut are said
before they cross it, with hysteresis, per station and part, afresh for a new bank; Prometheus carries it."""

from __future__ import annotations

from prometheus_client import REGISTRY

from edgeinspect.services.gateway.drift import MIN_FRAMES, DriftWatch


def gauge(name: str, station: str, part: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"station": station, "part": part})


def test_scores_creeping_toward_the_cut_are_said_before_they_cross_it_and_cleared_with_hysteresis(caplog):
    watch, threshold = DriftWatch(), 20.0
    for i in range(MIN_FRAMES):  # a healthy line: passed parts score about half the cut
        state = watch.observe("press-7", "bracket", "bracket@v1:aa", 10.0 + (i % 5) * 0.2, threshold)
    assert not state.drifting and 0.5 < state.p90_ratio < 0.6
    assert gauge("edgeinspect_anomaly_drift", "press-7", "bracket") == 0
    caplog.set_level("INFO")
    for _ in range(40):  # the lens goes soft: good parts now score 85% of the cut, none of them over it
        state = watch.observe("press-7", "bracket", "bracket@v1:aa", 17.0, threshold)
    assert state.drifting and state.p90_ratio >= 0.8
    assert gauge("edgeinspect_anomaly_drift", "press-7", "bracket") == 1
    assert gauge("edgeinspect_anomaly_good_score_p90_ratio", "press-7", "bracket") == state.p90_ratio
    assert any("drift toward the OK cut" in r.getMessage() for r in caplog.records)
    for _ in range(100):  # just under the warning, above the clear line: still drifting (no flapping)
        state = watch.observe("press-7", "bracket", "bracket@v1:aa", 15.6, threshold)
    assert state.drifting
    for _ in range(100):  # fixed: back to half the cut
        state = watch.observe("press-7", "bracket", "bracket@v1:aa", 10.0, threshold)
    assert not state.drifting and gauge("edgeinspect_anomaly_drift", "press-7", "bracket") == 0


def test_a_new_bank_starts_the_window_afresh_and_stations_are_apart():
    watch = DriftWatch()
    for _ in range(30):
        watch.observe("press-7", "bracket", "bracket@v1:aa", 17.0, 20.0)
        watch.observe("press-8", "bracket", "bracket@v1:aa", 5.0, 20.0)
    states = {(s.station, s.bank_id): s for s in watch.states()}
    assert states[("press-7", "bracket@v1:aa")].drifting and not states[("press-8", "bracket@v1:aa")].drifting
    state = watch.observe("press-7", "bracket", "bracket@v2:bb", 17.0, 40.0)  # re-taught: another scale
    assert state.frames == 1 and state.p90_ratio == 0.0 and not state.drifting
