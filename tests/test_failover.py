"""A box can die mid-inspection and no report is lost: replicas, failover by replay, stalls, bans, readiness.

Real processes on loopback (vision, 2 layer ranges x 2 replicas, retrieval, gateway); faults are caused for real
(SIGKILL, SIGSTOP, a restart with another checkpoint). The oracle for every disturbed report is the same request's
undisturbed run: fp32 on the wire and fp32 stages, so replay must reproduce it token for token.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.assets import asset_path
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.stack.launcher import LocalStack, StackOptions, stage_name
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

IMAGES = ["part_scratch.jpg", "part_dent.jpg", "part_ok.jpg", "part_missing_hole.jpg"]
NEW_TOKENS = 40
CONCURRENT = 4
ROUNDS = 5  # x CONCURRENT inspections, a replica killed during each round
ENV = {
    "EDGEINSPECT_STRUCTURED_OUTPUT": "false",  # runs to the budget: long enough to be killed in the middle
    "EDGEINSPECT_STALL_MIN_S": "2.0",
    "EDGEINSPECT_MICRO_BATCHES": "1",
}


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, sample_kb, tmp_path_factory):
    opts = StackOptions(
        workdir=tmp_path_factory.mktemp("failover"),
        checkpoint=tiny_checkpoint,
        stages=2,
        replicas=2,
        codec="fp32",
        kb_dir=sample_kb,
        extra_env=ENV | {"EDGEINSPECT_REPLAN": "false"},
    )
    with LocalStack(opts) as s:
        yield s


class Gateway:
    def __init__(self, stack: LocalStack):
        self.channel = grpc.insecure_channel(stack.gateway_address)
        self.stub = inspection_pb2_grpc.InspectionServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.md = [("authorization", f"Bearer {stack.api_token}")]

    def request(self, image: str, key: str = "") -> inspection_pb2.InspectRequest:
        return inspection_pb2.InspectRequest(
            image=asset_path(image).read_bytes(),
            station="s1",
            part="HSG-200",
            max_new_tokens=NEW_TOKENS,
            idempotency_key=key or uuid.uuid4().hex,
        )

    def inspect(self, image: str, key: str = "") -> inspection_pb2.DefectReport:
        return self.stub.Inspect(self.request(image, key), metadata=self.md, timeout=120)

    def status(self) -> inspection_pb2.ClusterStatus:
        return self.stub.GetClusterStatus(inspection_pb2.ClusterStatusRequest(), metadata=self.md, timeout=10)

    def serving(self) -> bool:
        reply = self.health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def wait_all_healthy(self, n: int, timeout_s: float = 60.0) -> inspection_pb2.ClusterStatus:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if sum(1 for s in status.stages if s.state == "healthy") == n:
                return status
            time.sleep(0.2)
        raise AssertionError(f"not every stage healthy again: {self.status()}")

    def close(self) -> None:
        self.channel.close()


@pytest.fixture(scope="module")
def gateway(stack):
    g = Gateway(stack)
    yield g
    g.close()


@pytest.fixture(scope="module")
def undisturbed(gateway):
    return {name: list(gateway.inspect(name).generated_token_ids) for name in IMAGES}


def streamed_inspection(gateway: Gateway, image: str, key: str, started: threading.Event, out: dict) -> None:
    """One InspectStream call in a thread: `started` is set at its first token delta."""
    try:
        for event in gateway.stub.InspectStream(gateway.request(image, key), metadata=gateway.md, timeout=120):
            if event.HasField("delta"):
                started.set()
            else:
                out[key] = event.report
    except grpc.RpcError as err:
        out[key] = err
    finally:
        started.set()


def test_replicas_killed_mid_generation_lose_no_report(stack, gateway, undisturbed):
    assert len(gateway.wait_all_healthy(4).stages) == 4
    results: dict = {}
    keys: list[tuple[str, str]] = []
    for rnd in range(ROUNDS):
        victim = stage_name(rnd % 2, rnd % 2)  # alternate the range and the replica
        batch = [(f"chaos-{rnd}-{i}", IMAGES[i % len(IMAGES)]) for i in range(CONCURRENT)]
        started = [threading.Event() for _ in batch]
        threads = [
            threading.Thread(target=streamed_inspection, args=(gateway, image, key, ev, results))
            for (key, image), ev in zip(batch, started, strict=True)
        ]
        for t in threads:
            t.start()
        for ev in started:
            assert ev.wait(60)
        stack.kill(victim)  # SIGKILL while tokens stream
        for t in threads:
            t.join(120)
        keys += batch
        stack.restart(victim)
        gateway.wait_all_healthy(4)
    failovers = 0
    for key, _ in keys:
        assert isinstance(results[key], inspection_pb2.DefectReport), f"{key}: {results[key]}"
    wrong = [
        (key, [(f.stage, f.position, f.reason) for f in results[key].failovers], list(results[key].model.partition))
        for key, image in keys
        if list(results[key].generated_token_ids) != undisturbed[image]
    ]
    assert not wrong, wrong
    for key, _ in keys:
        report = results[key]
        failovers += len(report.failovers)
        for f in report.failovers:
            assert f.reason and f.recovery_ms > 0 and f.stage in {"[0,3)", "[3,5)"}
            assert f.route and all(f.endpoint not in r for r in f.route)  # the new route avoids the failed box
    assert failovers >= ROUNDS  # every kill hit the sessions routed through the killed replica
    # Exactly one stored report per idempotency key, none failed.
    md = gateway.md
    listed = gateway.stub.ListReports(inspection_pb2.ListReportsRequest(station="s1", page_size=500), metadata=md)
    by_key = [r.idempotency_key for r in listed.reports if r.idempotency_key.startswith("chaos-")]
    assert sorted(by_key) == sorted(k for k, _ in keys)
    assert gateway.status().failovers >= failovers


@pytest.mark.slow
def test_a_hundred_inspections_survive_random_kills_and_stalls(stack, gateway, undisturbed):
    rng = random.Random(13)
    gateway.wait_all_healthy(4)
    results: dict = {}
    keys: list[tuple[str, str]] = []
    for rnd in range(25):
        victim = stack.role(stage_name(rng.randrange(2), rng.randrange(2)))
        batch = [(f"soak-{rnd}-{i}", IMAGES[rng.randrange(len(IMAGES))]) for i in range(CONCURRENT)]
        started = [threading.Event() for _ in batch]
        threads = [
            threading.Thread(target=streamed_inspection, args=(gateway, image, key, ev, results))
            for (key, image), ev in zip(batch, started, strict=True)
        ]
        for t in threads:
            t.start()
        for ev in started:
            assert ev.wait(60)
        if rng.random() < 0.5:
            stack.kill(victim.name)
            for t in threads:
                t.join(120)
            stack.restart(victim.name)
        else:
            os.kill(victim.pid, signal.SIGSTOP)
            time.sleep(3.0)
            os.kill(victim.pid, signal.SIGCONT)
            for t in threads:
                t.join(120)
        keys += batch
        gateway.wait_all_healthy(4)
    lost = [(k, results[k]) for k, _ in keys if not isinstance(results[k], inspection_pb2.DefectReport)]
    assert not lost, lost
    wrong = [k for k, image in keys if list(results[k].generated_token_ids) != undisturbed[image]]
    assert not wrong, wrong


def test_a_stopped_stage_is_left_behind_within_the_stall_bound(stack, gateway, undisturbed):
    gateway.wait_all_healthy(4)
    victim = stack.role(stage_name(1, 0))
    started, out = threading.Event(), {}
    # Two sessions at once: least-loaded routing puts one on each replica of range 1.
    keys = [f"stall-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    threads = [
        threading.Thread(target=streamed_inspection, args=(gateway, "part_dent.jpg", k, ev, out))
        for k, ev in zip(keys, [started, threading.Event()], strict=True)
    ]
    for t in threads:
        t.start()
    assert started.wait(60)
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    reports = [out[k] for k in keys]
    assert all(isinstance(r, inspection_pb2.DefectReport) for r in reports), reports
    assert all(list(r.generated_token_ids) == undisturbed["part_dent.jpg"] for r in reports)
    stalled = [f for r in reports for f in r.failovers if f.reason.startswith("stalled")]
    assert stalled and elapsed < 5.0 + 5.0  # the stall bound (2 s at the tiny model) + replay, with headroom
    gateway.wait_all_healthy(4)


def test_a_replica_restarted_with_another_checkpoint_is_refused_and_never_used(
    stack, gateway, undisturbed, tmp_path_factory
):
    from edgeinspect.models.tiny import TinySpec, make_tiny

    other = make_tiny(tmp_path_factory.mktemp("other") / "tiny", TinySpec(seed=7))
    name = stage_name(0, 1)
    config_path = stack.run_dir / f"{name}.yaml"
    original = config_path.read_text()
    cfg = yaml.safe_load(original)
    cfg["checkpoint"] = str(other)
    config_path.write_text(yaml.safe_dump(cfg))
    try:
        stack.restart(name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            mine = [s for s in gateway.status().stages if s.address == stack.address_of(name)]
            if mine and mine[0].state == "mismatch":
                break
            time.sleep(0.2)
        assert mine[0].state == "mismatch" and "checkpoint fingerprint" in mine[0].reason
        ours = open_checkpoint(stack.checkpoint).fingerprint
        for image in IMAGES[:2]:
            report = gateway.inspect(image)
            assert list(report.generated_token_ids) == undisturbed[image]
            assert report.model.checkpoint_fingerprint == ours
            assert not any(stack.address_of(name) in p for p in report.model.partition)
    finally:
        config_path.write_text(original)
        stack.restart(name)
    gateway.wait_all_healthy(4)


def test_retrieval_down_gives_a_report_without_spec_context_that_says_so(stack, gateway):
    with_specs = gateway.inspect("part_scratch.jpg")
    assert with_specs.references and not with_specs.degraded
    stack.kill("retrieval")
    try:
        report = gateway.inspect("part_scratch.jpg")
        assert not report.references
        assert any(d.startswith("no spec context: retrieval") for d in report.degraded), report.degraded
        assert gateway.serving()  # spec context is optional: still SERVING, shown as degraded
        assert gateway.status().degraded
    finally:
        stack.restart("retrieval")


def test_no_route_is_not_serving_within_two_seconds_and_names_the_range(stack, gateway):
    gateway.wait_all_healthy(4)
    names = [stage_name(1, r) for r in range(2)]
    for name in names:
        stack.kill(name)
    t0 = time.monotonic()
    try:
        while gateway.serving():
            assert time.monotonic() - t0 < 2.0, "still SERVING with no route for layers [3,5)"
            time.sleep(0.05)
        t1 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            gateway.inspect("part_ok.jpg")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "[3,5)" in err.value.details() and "127.0.0.1" not in err.value.details()
        assert time.monotonic() - t1 < 1.5
        assert not gateway.status().serving
    finally:
        for name in names:
            stack.restart(name)
    gateway.wait_all_healthy(4)
    deadline = time.monotonic() + 5
    while not gateway.serving():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert gateway.inspect("part_ok.jpg").report_id


def test_three_stages_without_replicas_replan_onto_the_survivors_and_back(tiny_checkpoint, tmp_path):
    opts = StackOptions(
        workdir=tmp_path,
        checkpoint=tiny_checkpoint,
        stages=3,
        codec="fp32",
        extra_env=ENV | {"EDGEINSPECT_REPLAN_SETTLE_S": "1"},
    )
    with LocalStack(opts) as stack:
        gateway = Gateway(stack)
        try:
            before = {name: list(gateway.inspect(name).generated_token_ids) for name in IMAGES[:2]}
            assert gateway.status().plan == "normal"
            results, started = {}, threading.Event()
            thread = threading.Thread(
                target=streamed_inspection, args=(gateway, IMAGES[0], "replan-1", started, results)
            )
            thread.start()
            assert started.wait(60)
            stack.kill("stage1")
            thread.join(120)
            report = results["replan-1"]
            assert isinstance(report, inspection_pb2.DefectReport), report
            assert list(report.generated_token_ids) == before[IMAGES[0]]
            status = gateway.status()
            assert status.serving and status.plan.startswith("degraded"), status
            assert len(report.model.partition) == 2  # the survivors: one of them took over layers [2,4)
            after = gateway.inspect(IMAGES[1])
            assert list(after.generated_token_ids) == before[IMAGES[1]]
            assert after.model.plan.startswith("degraded")
            stack.restart("stage1")
            deadline = time.monotonic() + 60
            while gateway.status().plan != "normal":
                assert time.monotonic() < deadline, gateway.status()
                time.sleep(0.3)
            back = gateway.inspect(IMAGES[1])
            assert list(back.generated_token_ids) == before[IMAGES[1]] and len(back.model.partition) == 3
        finally:
            gateway.close()
