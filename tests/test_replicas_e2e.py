"""Vision and retrieval replicas (issue 58 item 1): no single vision or retrieval box stops the line.

Real processes on loopback: two vision nodes sharing a banks folder, 2 decoder stages, two retrieval nodes, the
gateway. Faults are caused for real: SIGSTOP then SIGKILL of a vision node with inspections in flight on it, a
vision node left on an older anomaly bank (its own banks folder), SIGKILL of a retrieval node.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import yaml

from edgeinspect.assets import asset_path
from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.services.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, vision_pb2, vision_pb2_grpc

PART = "board"
GATED = "gated-1"
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def good_frames(tmp_path_factory):
    root = tmp_path_factory.mktemp("replica-sample")
    write_sample_set(root, parts=[PART])
    return [p.read_bytes() for p in sorted((root / PART / "train" / "good").glob("*.png"))]


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, sample_kb, good_frames, tmp_path_factory):
    opts = StackOptions(workdir=tmp_path_factory.mktemp("replicas"), checkpoint=tiny_checkpoint, stages=2,
                        vision_replicas=2, kb_dir=sample_kb, retrieval_replicas=2, anomaly="vlm",
                        gate_stations=(GATED,))  # fmt: skip
    with LocalStack(opts) as s:
        teach(s, "vision", good_frames)  # v1 in the shared folder: the other replica reloads it
        yield s


@pytest.fixture(scope="module")
def api(stack):
    channel = grpc.insecure_channel(stack.gateway_address)
    yield Api(inspection_pb2_grpc.InspectionServiceStub(channel), [("authorization", f"Bearer {stack.api_token}")])
    channel.close()


class Api:
    def __init__(self, stub, md):
        self.stub, self.md = stub, md

    def inspect(self, image: bytes, station: str, part: str = PART) -> inspection_pb2.DefectReport:
        request = inspection_pb2.InspectRequest(image=image, station=station, part=part, max_new_tokens=NEW_TOKENS)
        return self.stub.Inspect(request, metadata=self.md, timeout=120)

    def status(self) -> inspection_pb2.ClusterStatus:
        return self.stub.GetClusterStatus(inspection_pb2.ClusterStatusRequest(), metadata=self.md, timeout=10)

    def replicas(self, role: str) -> dict[str, inspection_pb2.ReplicaStatus]:
        return {r.address: r for r in getattr(self.status(), f"{role}_replicas")}

    def wait(self, what: str, ok, timeout_s: float = 60.0):
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if ok(status):
                return status
            assert time.monotonic() < deadline, f"not {what} within {timeout_s}s: {status}"
            time.sleep(0.3)


def teach(stack: LocalStack, name: str, frames: list[bytes]) -> vision_pb2.AnomalyBank:
    with grpc.insecure_channel(stack.address_of(name)) as channel:
        reply = vision_pb2_grpc.VisionServiceStub(channel).Teach(
            vision_pb2.TeachRequest(part=PART, frames=frames), timeout=300
        )
    return reply.bank


def test_a_vision_replica_on_an_older_bank_is_not_used_for_score_until_it_has_the_new_one(
    stack, api, good_frames, tmp_path
):
    v0, v1 = stack.address_of("vision"), stack.address_of("vision1")
    # vision1 gets a banks folder of its own (a copy of v1), so a new version reaches only vision0.
    own = tmp_path / "banks-vision1"
    shutil.copytree(stack.banks_dir, own)
    config = stack.role("vision1").config_path
    cfg = yaml.safe_load(config.read_text())
    cfg["anomaly"]["banks_dir"] = str(own)
    config.write_text(yaml.safe_dump(cfg))
    stack.restart("vision1")
    api.wait("both vision replicas healthy", lambda s: all(r.state == "healthy" for r in s.vision_replicas))

    newer = teach(stack, "vision", good_frames[: len(good_frames) - 2])  # v2, in the shared folder only
    assert newer.version == 2
    status = api.wait("vision1 behind on the bank", lambda s: any(list(r.behind) == [PART] for r in s.vision_replicas))
    behind = {r.address for r in status.vision_replicas if r.behind}
    assert behind == {v1}, status.vision_replicas

    before = api.replicas("vision")
    good = good_frames[0]  # in both teach sets: the gate passes it (Score only, no Encode)
    reports = [api.inspect(good, GATED) for _ in range(4)]
    after = api.replicas("vision")
    assert all(r.anomaly.bank_id == newer.bank_id for r in reports), [r.anomaly.bank_id for r in reports]
    assert after[v1].served == before[v1].served, "a replica on the older bank scored a gated frame"
    assert after[v0].served == before[v0].served + 4

    # The new version reaches vision1's folder (as a sync would): within its reload interval it is used again.
    version = f"v{newer.version:04d}"
    shutil.copytree(stack.banks_dir / PART / version, own / PART / version)
    (own / PART / "CURRENT.tmp").write_text(version + "\n")
    os.replace(own / PART / "CURRENT.tmp", own / PART / "CURRENT")
    api.wait("vision1 on the new bank", lambda s: not any(r.behind for r in s.vision_replicas), timeout_s=30)
    before = api.replicas("vision")
    reports = [api.inspect(good, GATED) for _ in range(4)]
    after = api.replicas("vision")
    assert all(r.anomaly.bank_id == newer.bank_id for r in reports)
    assert after[v1].served > before[v1].served, "vision1 holds the newest bank but is never used"


def test_a_killed_vision_replica_loses_no_inspection(stack, api):
    """vision1 is stopped (SIGSTOP) with inspections in flight on it, then SIGKILLed: those are retried on vision0
    within their deadline, and the next inspections run on vision0 alone."""
    v0, v1 = stack.address_of("vision"), stack.address_of("vision1")
    image = asset_path("part_scratch.jpg").read_bytes()
    api.wait("both vision replicas healthy", lambda s: all(r.state == "healthy" for r in s.vision_replicas))
    pid = stack.role("vision1").pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(4) as pool:
            running = [pool.submit(api.inspect, image, "s1") for _ in range(4)]
            status = api.wait("an inspection in flight on the stopped vision1", lambda s: any(
                r.address == v1 and r.inflight > 0 for r in s.vision_replicas), timeout_s=30)  # fmt: skip
            assert status.serving
            stack.kill("vision1")
            reports = [f.result(timeout=120) for f in running]
    finally:
        if stack.role("vision1").proc.poll() is None:
            os.kill(pid, signal.SIGCONT)
    assert all(r.verdict != inspection_pb2.VERDICT_UNSPECIFIED for r in reports)
    after = [api.inspect(image, "s1") for _ in range(3)]
    assert len(after) == 3
    replicas = api.replicas("vision")
    assert replicas[v1].state in ("down", "banned")
    assert replicas[v0].last and replicas[v0].state == "healthy"
    stack.restart("vision1")
    api.wait("vision1 back", lambda s: all(r.state == "healthy" for r in s.vision_replicas))


def test_a_killed_retrieval_replica_leaves_reports_with_spec_references(stack, api):
    r0, r1 = stack.address_of("retrieval"), stack.address_of("retrieval1")
    api.wait("both retrieval replicas healthy", lambda s: len(s.retrieval_replicas) == 2
             and all(r.state == "healthy" for r in s.retrieval_replicas), timeout_s=180)  # fmt: skip
    stack.kill("retrieval")
    image = asset_path("part_dent.jpg").read_bytes()
    reports = [api.inspect(image, "s1", part="HSG-200") for _ in range(3)]
    for report in reports:
        assert report.references, f"no spec references: {report.degraded}"
    replicas = api.replicas("retrieval")
    assert replicas[r1].last and replicas[r0].state in ("down", "banned")
    stack.restart("retrieval")
