"""The verdict reaching the line, end to end on one embedded stack (its gateway publishing to a real Mosquitto)
and a real `edgeinspect ingest` process serving OPC UA to an asyncua client that plays the PLC.

MQTT: one inspection publishes exactly one result with its report id; results made while the broker is down
arrive after it returns, in order (the subscriber dedupes by report id: delivery is at least once).
OPC UA: 3 handshakes in a row (20 under -m slow); a PLC that never acks; a stage frozen with SIGSTOP (NG +
Error=timeout at the deadline, the late report linked); a killed gateway (Error=unavailable within the deadline;
last, so it stays down).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml
from line_peers import Subscriber

from edgeinspect.assets import sample_image
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.line.handshake import ErrorCode
from edgeinspect.services.line.plcsim import PlcSim
from edgeinspect.services.line.testing import MosquittoBroker, free_port
from edgeinspect.services.outputs.config import mqtt_outputs_env
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.testing import stop_process

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs Debian's mosquitto"),
]
RESULTS = "edgeinspect/+/+/result"
FAST_MS = 20_000  # station-a: room for an inspection on a loaded 2-core box
TIGHT_MS = 2_500  # station-b: the takt budget the faults are measured against


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with MosquittoBroker(tmp_path_factory.mktemp("mosquitto")) as b:
        yield b


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, broker, tmp_path_factory):
    """The embedded stack with the gateway publishing to the broker (as `edgeinspect up --mqtt URL` does)."""
    opts = StackOptions(
        workdir=tmp_path_factory.mktemp("line-stack"),
        checkpoint=tiny_checkpoint,
        stages=2,
        extra_env=mqtt_outputs_env(broker.url, node="station-3"),
    )
    with LocalStack(opts) as s:
        yield s


@pytest.fixture(scope="module")
def line(stack, tmp_path_factory):
    """`edgeinspect ingest` with two line stations on OPC UA; yields (endpoint, journal path)."""
    work = tmp_path_factory.mktemp("line-ingest")
    (work / "cam").mkdir()
    shutil.copy(sample_image(), work / "cam" / "part.jpg")
    port = free_port()

    def camera(cid: str, station: str, deadline_ms: int) -> dict:
        return {
            "id": cid,
            "station": station,
            "part": "HSG-210",
            "source": str(work / "cam"),
            "loop": True,
            "folder_fps": 20,
            "sampling": {"trigger_only": True},
            "max_new_tokens": 12,
            "line": {"result_deadline_ms": deadline_ms, "ack_timeout_ms": 1500},
        }

    cfg = {
        "cameras": [camera("cam-a", "station-a", FAST_MS), camera("cam-b", "station-b", TIGHT_MS)],
        "gateway": stack.gateway_address,
        "api_token": stack.api_token,
        "frames_dir": str(work / "frames"),
        "request_timeout_s": 60,
        "retry_attempts": 1,
        "opcua": {"host": "127.0.0.1", "port": port, "journal": str(work / "line.sqlite")},
        "log_json": False,
    }
    (work / "cameras.yaml").write_text(yaml.safe_dump(cfg))
    log = (work / "ingest.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinspect.cli", "ingest", "--config", str(work / "cameras.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    endpoint = f"opc.tcp://127.0.0.1:{port}/edgeinspect/"
    try:
        yield endpoint, work / "line.sqlite"
    finally:
        stop_process(proc)
        log.close()


def journal_row(path, cycle_id: str) -> dict:
    with sqlite3.connect(path) as db:
        cur = db.execute("SELECT * FROM cycles WHERE cycle_id = ?", (cycle_id,))
        row = cur.fetchone()
        return {} if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))


def inspect(stack, n: int = 1) -> list[str]:
    image = sample_image().read_bytes()
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        reports = [client.inspect(image, station="station-3", part="HSG-210", max_new_tokens=24) for _ in range(n)]
    return [r.report_id for r in reports]


def test_one_inspection_publishes_exactly_one_result_with_its_report_id(stack, broker):
    sub = Subscriber(broker.port, RESULTS, "test-one")
    try:
        sub.wait_subscribed()  # subscribed before the report exists
        (report_id,) = inspect(stack)
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


def test_results_made_while_the_broker_is_down_arrive_after_it_returns_in_order(stack, broker):
    sub = Subscriber(broker.port, RESULTS, "test-outage")  # persistent session: the broker keeps its queue
    try:
        sub.wait_subscribed()  # a subscription the broker never acknowledged would not be queued for
        broker.stop()
        # the session (and so its queue) survives the restart only through this file (see MosquittoBroker)
        assert (broker.workdir / "mosquitto.db").is_file()
        ids = inspect(stack, 3)  # the inspections never wait for the broker
        time.sleep(1.0)  # the gateway has tried (and failed) to publish by now
        assert not any(b.get("report_id") in ids for b in sub.bodies())
        broker.start()
        sub.wait_for(lambda s: all(i in s.unique_ids() for i in ids), 60, "all three results after the restart")
        assert [i for i in sub.unique_ids() if i in ids] == ids
    finally:
        sub.close()


@pytest.mark.slow  # a second embedded stack, started the way a user starts it
def test_up_with_mqtt_publishes_what_inspect_produces(broker, tmp_path):
    """`edgeinspect up --mqtt URL` as a process, `edgeinspect inspect` as a process: the result on the broker."""
    sub = Subscriber(broker.port, RESULTS, "test-up")
    port, workdir = free_port(), tmp_path / "up"
    args = ["up", "--mqtt", broker.url, "--no-kb", "--workdir", str(workdir), "--port", str(port)]
    args += ["--console-port", "-1"]
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "edgeinspect.cli", *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while b"edgeinspect is up" not in (tmp_path / "up.log").read_bytes():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()[-2000:]
            time.sleep(0.5)
        token = (workdir / "api_token").read_text().strip()
        image = str(sample_image())
        inspect_args = ["inspect", image, "--gateway", f"127.0.0.1:{port}", "--token", token, "--station", "st-up"]
        done = subprocess.run([sys.executable, "-m", "edgeinspect.cli", *inspect_args, "--max-new-tokens", "12",
                               "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        report_id = json.loads(done.stdout)["report_id"]
        sub.wait_for(lambda s: report_id in s.unique_ids(), 30, "the result of `edgeinspect inspect`")
        assert sub.messages[-1][0] == "edgeinspect/st-up/none/result"
    finally:
        sub.close()
        up.terminate()  # SIGTERM: `up` stops every role it started
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()


@pytest.mark.parametrize("n", [3, pytest.param(20, marks=pytest.mark.slow)])
async def test_plc_runs_cycles_in_a_row(stack, line, n):
    endpoint, _ = line
    plc = await PlcSim.when_up(endpoint, "station-a")
    try:
        cycles = [await plc.cycle(result_timeout_s=FAST_MS / 1000 + 5, lot_id="LOT-7") for _ in range(n)]
    finally:
        await plc.__aexit__()
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        for c in cycles:
            assert c.error == 0 and not c.busy_at_result, c
            assert c.ok != (c.ng or c.recheck), c  # exactly one decision
            report = client.get(c.report_id)  # stored by the gateway under the cycle's key
            assert report.idempotency_key == c.cycle_id and report.station == "station-a"
            assert c.ok == (report.verdict == 1)  # VERDICT_OK
            assert c.ack_to_ready_ms is not None
    assert len({c.report_id for c in cycles}) == n


async def test_a_cycle_without_ack_times_out_into_error_and_the_next_trigger_recovers(line):
    endpoint, _ = line
    plc = await PlcSim.when_up(endpoint, "station-a")
    try:
        first = await plc.cycle(ack=False, result_timeout_s=FAST_MS / 1000 + 5)
        assert first.error == 0 and first.report_id
        await plc.wait("Error", int(ErrorCode.ack_timeout), 5)  # ack_timeout_ms is 1.5 s
        assert await plc.read("TriggerReady") and not await plc.read("ResultReady") and not await plc.read("Busy")
        again = await plc.cycle(result_timeout_s=FAST_MS / 1000 + 5)
        assert again.error == 0 and again.report_id and again.report_id != first.report_id
    finally:
        await plc.__aexit__()


async def test_a_frozen_stage_gives_ng_timeout_at_the_deadline_and_the_late_report_is_linked(stack, line):
    endpoint, journal = line
    stage = next(r for r in stack.roles if r.name == "stage1")
    plc = await PlcSim.when_up(endpoint, "station-b")
    os.kill(stage.proc.pid, signal.SIGSTOP)
    try:
        cycle = await plc.cycle(result_timeout_s=TIGHT_MS / 1000 + 5)
    finally:
        os.kill(stage.proc.pid, signal.SIGCONT)
        await plc.__aexit__()
    assert cycle.ng and not cycle.ok and cycle.error == ErrorCode.timeout and not cycle.busy_at_result
    assert TIGHT_MS - 50 <= cycle.trigger_to_result_ms <= TIGHT_MS + 1000  # at the deadline
    assert cycle.report_id == "" and cycle.cycle_id
    deadline = time.monotonic() + 60
    while not journal_row(journal, cycle.cycle_id).get("report_id"):
        assert time.monotonic() < deadline, journal_row(journal, cycle.cycle_id)
        time.sleep(0.2)
    row = journal_row(journal, cycle.cycle_id)
    assert row["late"] == 1 and row["line"] == "NG" and row["error"] == ErrorCode.timeout
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        assert client.get(row["report_id"]).idempotency_key == cycle.cycle_id


@pytest.mark.slow  # a CLI process of its own: ~10 s of imports on a loaded box
def test_plc_sim_prints_each_cycle_and_a_summary(line):
    endpoint, _ = line
    args = ["line", "plc-sim", "--endpoint", endpoint, "--station", "station-a", "--cycles", "2", "--lot", "L1"]
    out = subprocess.run(
        [sys.executable, "-m", "edgeinspect.cli", *args, "--timeout", str(FAST_MS / 1000 + 5)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 cycles:" in out.stdout and "errors 0" in out.stdout and "trigger→result median" in out.stdout


async def test_a_dead_gateway_gives_error_unavailable_within_the_deadline(stack, line):
    endpoint, _ = line
    plc = await PlcSim.when_up(endpoint, "station-b")
    stack.kill("gateway")
    try:
        cycle = await plc.cycle(result_timeout_s=TIGHT_MS / 1000 + 5)
        assert cycle.ng and cycle.error == ErrorCode.unavailable and not cycle.busy_at_result
        # The code itself says the station answered before its deadline (after it, the code is timeout); the
        # bound adds what the PLC client needs to see it on a loaded box.
        assert cycle.trigger_to_result_ms < TIGHT_MS + 1000
    finally:
        await plc.__aexit__()  # the gateway stays down: this module's stack ends here
