"""The drift watch tells the line (services/gateway/drift.py, through the MQTT output of services/outputs): good
parts' scores rising toward the OK cut put one `drifting` alert on the station's drift topic of a real Mosquitto,
with the bank and the window's median, p90 and OK cut; scores falling back put one clear alert there; the
Prometheus gauge follows. A new bank clears a drifting station, and webhooks never get drift alerts."""

from __future__ import annotations

import shutil
import time
import uuid

import numpy as np
import pytest
from line_peers import SECRET, Receiver, Subscriber
from prometheus_client import REGISTRY

from edgeinspect.services.gateway.drift import MIN_FRAMES, WINDOW, DriftState, DriftWatch, alert
from edgeinspect.services.line.testing import MosquittoBroker
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.services.outputs.fanout import Outputs

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs Debian's mosquitto"),
]
DRIFT_TOPICS = "edgeinspect/+/drift"
THRESHOLD = 20.0


@pytest.fixture
def broker(tmp_path):
    with MosquittoBroker(tmp_path / "mosquitto") as b:
        yield b


@pytest.fixture
def subscriber(broker):
    sub = Subscriber(broker.port, DRIFT_TOPICS, f"drift-{uuid.uuid4().hex[:6]}")
    sub.wait_subscribed()
    yield sub
    sub.close()


class Line:
    """A DriftWatch and the outputs its flips go to, as the gateway's Inspector wires them (_watch_drift)."""

    def __init__(self, outputs: Outputs, station: str, part: str) -> None:
        self.watch, self.outputs = DriftWatch(), outputs
        self.station, self.part = station, part
        self.fed: list[float] = []
        self.flips: list[DriftState] = []
        self.window_at_flip: list[list[float]] = []  # the scores the watch held when each flip was returned

    def feed(self, scores, bank_id: str = "bracket@v1:aa", threshold: float = THRESHOLD) -> DriftState:
        for score in scores:
            state = self.watch.observe(self.station, self.part, bank_id, float(score), threshold)
            self.fed.append(float(score))
            if state.changed:
                self.flips.append(state)
                self.window_at_flip.append(self.fed[-state.frames :])
                self.outputs.publish_drift(alert(state))
        return state

    def gauge(self, name: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"station": self.station, "part": self.part})


def test_scores_rising_toward_the_cut_send_one_drifting_alert_and_falling_back_one_clear_alert(
    broker, subscriber, tmp_path
):
    outputs = Outputs.local(OutputsConfig(mqtt={"url": broker.url, "node": "drift-test"}, poll_s=0.2), tmp_path)
    line = Line(outputs, "press-drift-1", "bracket")
    topic = "edgeinspect/press-drift-1/drift"
    try:
        rng = np.random.default_rng(7)
        state = line.feed(10.0 + rng.uniform(0, 1.0, 40))  # well clear of the cut: p90 about half of it
        assert not state.drifting and 0.5 < state.p90_ratio < 0.6
        assert line.gauge("edgeinspect_anomaly_drift") == 0
        assert line.flips == []

        line.feed(np.linspace(11.0, 18.0, 60) + rng.uniform(0, 0.5, 60))  # the lens going soft: toward the cut
        assert len(line.flips) == 1 and line.flips[0].drifting
        assert line.gauge("edgeinspect_anomaly_drift") == 1
        assert line.gauge("edgeinspect_anomaly_good_score_p90_ratio") >= 0.8
        subscriber.wait_for(lambda s: len(s.messages) >= 1, 15, "the drifting alert")

        # Still drifting for many frames: no further alert (one per flip, not one per frame).
        line.feed(17.0 + rng.uniform(0, 0.5, 80))
        assert line.gauge("edgeinspect_anomaly_drift") == 1

        line.feed(10.0 + rng.uniform(0, 1.0, WINDOW))  # back to good: the window fills with clear scores
        assert len(line.flips) == 2 and not line.flips[1].drifting
        assert line.gauge("edgeinspect_anomaly_drift") == 0
        assert line.gauge("edgeinspect_anomaly_good_score_p90_ratio") < 0.75
        subscriber.wait_for(lambda s: len(s.messages) >= 2, 15, "the clear alert")
        time.sleep(1.0)  # a third message (one per frame, or a redelivery) would be here by now
    finally:
        outputs.close()

    assert [t for t, _, _ in subscriber.messages] == [topic, topic]
    late = Subscriber(broker.port, DRIFT_TOPICS, f"drift-late-{uuid.uuid4().hex[:6]}")
    try:
        late.wait_subscribed()
        time.sleep(0.5)
        assert late.messages == []  # not retained: a late subscriber is not handed an old alert
    finally:
        late.close()
    drifting, clear = subscriber.bodies()
    for body, scores in zip((drifting, clear), line.window_at_flip, strict=True):
        p50, p90 = np.percentile(scores, [50, 90])
        assert body["event"] == "drift" and body["station"] == "press-drift-1" and body["part"] == "bracket"
        assert body["bank_id"] == "bracket@v1:aa" and body["ok_cut"] == THRESHOLD
        assert body["frames"] == len(scores) >= MIN_FRAMES and len(scores) <= WINDOW
        assert body["p50"] == pytest.approx(p50, abs=1e-5) and body["p90"] == pytest.approx(p90, abs=1e-5)
        assert body["p90_ratio"] == pytest.approx(p90 / THRESHOLD, abs=1e-4)
        assert body["alert_id"] and body["time"].endswith("+00:00")
    assert drifting["drifting"] is True and drifting["p90_ratio"] >= 0.8 and drifting["p50"] < drifting["p90"]
    assert clear["drifting"] is False and clear["p90_ratio"] < 0.75
    assert drifting["alert_id"] != clear["alert_id"]


def test_a_new_bank_clears_a_drifting_station_on_mqtt_and_webhooks_get_no_drift_alert(broker, subscriber, tmp_path):
    hook = Receiver()
    cfg = OutputsConfig(
        mqtt={"url": broker.url, "node": "drift-test"},
        webhooks=[{"url": hook.url, "secret": SECRET}],
        poll_s=0.2,
    )
    outputs = Outputs.local(cfg, tmp_path)
    line = Line(outputs, "press-drift-2", "housing")
    try:
        line.feed([17.0] * MIN_FRAMES, bank_id="housing@v1:aa")
        assert [f.drifting for f in line.flips] == [True]
        state = line.feed([9.0], bank_id="housing@v2:bb", threshold=30.0)  # re-taught: its own scale, afresh
        assert not state.drifting and state.frames == 1 and [f.drifting for f in line.flips] == [True, False]
        assert line.gauge("edgeinspect_anomaly_drift") == 0
        subscriber.wait_for(lambda s: len(s.messages) >= 2, 15, "the drifting and the clear alert")
        assert outputs.wait_idle(10)  # every queued row is out: a webhook row would have been sent too
    finally:
        outputs.close()
        hook.close()
    drifting, clear = subscriber.bodies()
    assert drifting["drifting"] is True and drifting["bank_id"] == "housing@v1:aa"
    assert clear["drifting"] is False and clear["bank_id"] == "housing@v2:bb" and clear["frames"] == 1
    assert clear["ok_cut"] == 30.0
    assert hook.requests == []
