"""MQTT output against a real Mosquitto: every report of the embedded stack reaches the broker once (at least
once, deduped by report id), also when the broker was down while the reports were made."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from line_peers import Subscriber

from edgeinspect.assets import sample_image
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.launcher import LocalStack, StackOptions
from edgeinspect.services.line.testing import MosquittoBroker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs Debian's mosquitto"),
]
RESULTS = "edgeinspect/+/+/result"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with MosquittoBroker(tmp_path_factory.mktemp("mosquitto")) as b:
        yield b


@pytest.fixture(scope="module")
def mqtt_stack(tiny_checkpoint, broker, tmp_path_factory):
    """The embedded stack with the gateway publishing to the broker (as `edgeinspect up --mqtt URL` does)."""
    outputs = {"mqtt": {"url": broker.url, "node": "station-3"}, "retry_base_s": 0.1, "retry_max_s": 0.5}
    opts = StackOptions(
        workdir=tmp_path_factory.mktemp("mqtt-stack"),
        checkpoint=tiny_checkpoint,
        stages=2,
        extra_env={"EDGEINSPECT_OUTPUTS": json.dumps(outputs)},
    )
    with LocalStack(opts) as stack:
        yield stack


def inspect(stack, n: int = 1) -> list[str]:
    image = sample_image().read_bytes()
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        reports = [client.inspect(image, station="station-3", part="HSG-210", max_new_tokens=24) for _ in range(n)]
    return [r.report_id for r in reports]


def test_one_inspection_publishes_exactly_one_result_with_its_report_id(mqtt_stack, broker):
    sub = Subscriber(broker.port, RESULTS, "test-one")
    try:
        time.sleep(0.3)  # subscribed before the report exists
        (report_id,) = inspect(mqtt_stack)
        sub.wait_for(lambda s: report_id in s.unique_ids(), 30, "the result message")
        time.sleep(1.0)  # a second message would arrive by now
        assert [b["report_id"] for b in sub.bodies()] == [report_id]
        topic, body, _ = sub.messages[0]
        assert topic == "edgeinspect/station-3/none/result"  # no camera in a CLI inspection
        assert body["station"] == "station-3" and body["part"] == "HSG-210"
        assert body["verdict"] in ("OK", "DEFECT", "UNCERTAIN") and isinstance(body["classes"], list)
        assert body["created_time"].endswith("+00:00")
    finally:
        sub.close()
    # A controller that connects later still sees the station's last verdict and the gateway online (retained).
    late = Subscriber(broker.port, "edgeinspect/#", "test-late")
    try:
        late.wait_for(lambda s: len(s.messages) >= 2, 10, "the retained messages")
        retained = {t: b for t, b, r in late.messages if r}
        assert retained["edgeinspect/station-3/last"]["report_id"] == report_id
        assert retained["edgeinspect/station-3/status"] == {"raw": "online"}
    finally:
        late.close()


def test_results_made_while_the_broker_is_down_arrive_after_it_returns_in_order(mqtt_stack, broker):
    sub = Subscriber(broker.port, RESULTS, "test-outage")  # persistent session: the broker keeps its queue
    try:
        time.sleep(0.3)
        broker.stop()
        ids = inspect(mqtt_stack, 3)  # the inspections never wait for the broker
        time.sleep(1.0)  # the gateway has tried (and failed) to publish by now
        assert not any(b.get("report_id") in ids for b in sub.bodies())
        broker.start()
        sub.wait_for(lambda s: all(i in s.unique_ids() for i in ids), 60, "all three results after the restart")
        assert [i for i in sub.unique_ids() if i in ids] == ids
    finally:
        sub.close()
