"""Vision and retrieval replicas (issue 58 item 1): no single vision or retrieval box stops the line.

Real processes on loopback: two vision nodes sharing a banks folder, 2 decoder stages, two retrieval nodes, the
gateway, the console. Faults are caused for real: SIGSTOP then SIGKILL of a vision node with inspections in flight
on it, a vision node left on an older anomaly bank (its own banks folder), SIGKILL of a retrieval node, a retrieval
node left on an older KB index (its own KB folder). `edgeinspect status` and the console's stations page show it.
"""

from __future__ import annotations

import http.cookiejar
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import yaml

from edgeinspect.assets import asset_path
from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.rag import sample_kb_dir
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.indexer import build_index
from edgeinspect.stack.launcher import LocalStack, StackOptions
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
                        gate_stations=(GATED,), console_port=0)  # fmt: skip
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


def test_a_retrieval_replica_on_an_older_kb_index_is_not_searched_until_it_has_the_new_one(stack, api, tmp_path):
    """Each retrieval node on a KB folder of its own; retrieval1's is re-indexed with one more spec: every report's
    references come from the new index (retrieval0 is behind, and `edgeinspect status` and the console say so) until
    the new version reaches retrieval0's folder too."""
    r0, r1 = stack.address_of("retrieval"), stack.address_of("retrieval1")
    kbs = {name: tmp_path / f"kb-{name}" for name in ("retrieval", "retrieval1")}
    for name, kb in kbs.items():
        shutil.copytree(stack.opts.kb_dir, kb)
        config = stack.role(name).config_path
        cfg = yaml.safe_load(config.read_text())
        cfg["kb_dir"], cfg["reload_interval_s"] = str(kb), 0.5
        config.write_text(yaml.safe_dump(cfg))
        stack.restart(name)
    status = api.wait("both retrieval replicas healthy on one index", lambda s: all(
        r.state == "healthy" for r in s.retrieval_replicas), timeout_s=180)  # fmt: skip
    old = {r.index_fingerprint for r in status.retrieval_replicas}
    assert len(old) == 1 and "" not in old, status.retrieval_replicas

    specs = tmp_path / "specs"  # the plant's specs plus a new revision: a new index version in retrieval1's folder
    shutil.copytree(sample_kb_dir(), specs)
    (specs / "HSG-200-rework-rev-f.md").write_text(REWORK_SPEC)
    summary = build_index(specs, kbs["retrieval1"], Embedder())
    assert not summary.unchanged
    status = api.wait("retrieval0 behind on the index", lambda s: {r.address: r.state for r in s.retrieval_replicas}
                      == {r0: "behind", r1: "healthy"}, timeout_s=30)  # fmt: skip
    new = {r.address: r for r in status.retrieval_replicas}[r1]
    assert new.index_version == summary.index_version and new.index_fingerprint not in old
    assert status.retrieval_index == f"{summary.index_version} ({new.index_fingerprint})"
    assert any(f"retrieval: 1 of 2 replicas usable ({r0} not on index" in n for n in status.notes), status.notes
    behind = {r.address: r for r in status.retrieval_replicas}[r0]
    assert "older than" in behind.reason and new.index_fingerprint in behind.reason

    before = api.replicas("retrieval")
    image = asset_path("part_dent.jpg").read_bytes()
    reports = [api.inspect(image, "s1", part="HSG-200") for _ in range(3)]
    after = api.replicas("retrieval")
    assert all(r.references for r in reports), [r.degraded for r in reports]
    assert {ref.index_version for r in reports for ref in r.references} == {summary.index_version}
    assert after[r0].served == before[r0].served, "a replica on the older index was searched"
    assert after[r1].served == before[r1].served + 3 and after[r1].last

    out = cli_status(stack)  # what the operator reads: the replica held back and why, and who served last
    row = next(line for line in out.splitlines() if r0 in line and "retrieval" in line)
    assert "behind" in row and "older than" in out, out
    assert next(line for line in out.splitlines() if r1 in line and "retrieval" in line).count("<- last") == 1
    page = console_stations(stack)
    assert row_attrs(page, "retrieval", r0) == 'data-state="behind"', page
    assert row_attrs(page, "retrieval", r1) == 'data-state="healthy" data-last="1"', page

    # The new version reaches retrieval0's folder (as a sync would): within its reload interval it is searched again.
    version = summary.index_version
    shutil.copytree(kbs["retrieval1"] / "versions" / version, kbs["retrieval"] / "versions" / version)
    (kbs["retrieval"] / "CURRENT.tmp").write_text(version + "\n")
    os.replace(kbs["retrieval"] / "CURRENT.tmp", kbs["retrieval"] / "CURRENT")
    api.wait("retrieval0 on the new index", lambda s: all(r.state == "healthy" and r.index_version == version
                                                          for r in s.retrieval_replicas), timeout_s=30)  # fmt: skip
    before = api.replicas("retrieval")
    reports = [api.inspect(image, "s1", part="HSG-200") for _ in range(2)]
    after = api.replicas("retrieval")
    assert {ref.index_version for r in reports for ref in r.references} == {version}
    assert after[r0].served > before[r0].served, "retrieval0 holds the new index but is never searched"


def test_status_and_console_list_every_replica_of_every_role_and_the_gateways(stack, api):
    api.wait("every replica healthy", lambda s: all(r.state == "healthy" for r in (
        *s.vision_replicas, *s.stages, *s.retrieval_replicas)), timeout_s=120)  # fmt: skip
    api.inspect(asset_path("part_dent.jpg").read_bytes(), "s1", part="HSG-200")
    status = api.status()
    addresses = {"vision": [r.address for r in status.vision_replicas], "stage": [s.address for s in status.stages],
                 "retrieval": [r.address for r in status.retrieval_replicas]}  # fmt: skip
    assert [len(a) for a in addresses.values()] == [2, 2, 2]
    assert all(s.last for s in status.stages)  # one replica per layer range: each carried its range's last step

    out = cli_status(stack)
    for role, listed in addresses.items():
        rows = [line for line in out.splitlines() if line.split("│")[1:2] == [f" {role:<9} "]]
        assert sorted(a for a in listed for row in rows if a in row) == sorted(listed), (role, out)
        assert all("healthy" in row for row in rows), out
        assert sum("<- last" in row for row in rows) == (2 if role == "stage" else 1), out
    gateway_row = next(line for line in out.splitlines() if stack.gateway_address in line and "serving" in line)
    assert "<- current" in gateway_row, out

    page = console_stations(stack)
    for role, listed in addresses.items():
        for address in listed:
            assert row_attrs(page, role, address).startswith('data-state="healthy"'), page
    assert page.count("data-last=") == 4, page  # vision, both stages, retrieval
    assert f'data-address="{stack.gateway_address}" data-state="serving" data-current="1"' in page, page


REWORK_SPEC = """---
title: HSG-200 Housing rework limits, revision F
product: [HSG-200, HSG-210]
station: rework
defect_classes: [dent, scratch]
severities: [major, minor]
revision: F
---
# HSG-200 Housing: rework limits

A dent deeper than 0.3 mm on a sealing face is major and not reworked. A dent on a cosmetic face up to 0.5 mm deep
may be reworked by polishing once; a scratch longer than 10 mm on zone A is major.
"""


def cli_status(stack: LocalStack) -> str:
    """`edgeinspect status` as an operator runs it on the box `up` runs on (exit 0: serving)."""
    cmd = [sys.executable, "-m", "edgeinspect.cli", "status", "--gateway", stack.gateway_address, "--token",
           stack.api_token, "--workdir", str(stack.opts.workdir)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def console_stations(stack: LocalStack) -> str:
    """The console's stations page after logging in with the stack's token, as a browser gets it."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = urllib.parse.urlencode({"token": stack.api_token, "next": "/stations"}).encode()
    with opener.open(f"{stack.console_url}/login", data=form, timeout=60) as reply:
        assert reply.url.endswith("/stations"), reply.url
        return reply.read().decode()


def row_attrs(page: str, role: str, address: str) -> str:
    """The state attributes of the console's row of one replica ('data-state="behind"', ' data-last="1"')."""
    start = page.index(f'data-role="{role}" data-address="{address}"')
    return page[start : page.index(">", start)].split("\n", 1)[1].strip()
