"""A bank taught through the gateway reaches every vision box (issue 69, item 2), as real processes on loopback:
three vision nodes, each with a banks folder of its own (as on separate boxes), a decoder stage and the gateway. A
part taught from reviewed reports is exported from the node that taught it, published in the report database and
pushed to the other node; a third node started later with an empty folder catches up by itself; a staged addition is
staged on every node and a promote on any one makes it current on all. ImportBank refuses an archive that does not
match its sha256, and another bank under a number the node holds, in words that name no internal address."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from edgeinspect.models.anomaly.bank import Bank, BankStore
from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.services.common.channel import wait_for_serving
from edgeinspect.services.store.banks import BankVersions
from edgeinspect.services.store.database import SQLiteDatabase
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, vision_pb2, vision_pb2_grpc

PART = "board"
STATION = "line-1"  # not gated: a part with no bank yet is inspected by the VLM, its frame kept for teaching
WITHIN_S = 30.0  # a pass runs every second (clients.py BANK_POLL_S); a push is one ImportBank


@pytest.fixture(scope="module")
def good_frames(tmp_path_factory):
    root = tmp_path_factory.mktemp("bank-sync-sample")
    write_sample_set(root, parts=[PART])
    return [p.read_bytes() for p in sorted((root / PART / "train" / "good").glob("*.png"))]


def own_banks_folder(stack: LocalStack, name: str, folder: Path) -> None:
    """The node's run config names a banks folder of its own (it takes it at its next start)."""
    config = stack.role(name).config_path
    cfg = yaml.safe_load(config.read_text())
    cfg["anomaly"]["banks_dir"] = str(folder)
    config.write_text(yaml.safe_dump(cfg))


def start(stack: LocalStack, name: str) -> None:
    stack.restart(name)
    asyncio.run(wait_for_serving(stack.address_of(name), 120))


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory):
    work = tmp_path_factory.mktemp("bank-sync")
    opts = StackOptions(workdir=work, checkpoint=tiny_checkpoint, stages=1, vision_replicas=3)
    with LocalStack(opts) as s:
        s.kill("vision2")  # started later, on an empty folder of its own
        own_banks_folder(s, "vision2", work / "banks-vision2")
        own_banks_folder(s, "vision1", work / "banks-vision1")
        start(s, "vision1")
        yield s


@pytest.fixture(scope="module")
def api(stack):
    channel = grpc.insecure_channel(stack.gateway_address)
    stub = inspection_pb2_grpc.InspectionServiceStub(channel)
    md = [("authorization", f"Bearer {stack.api_token}")]
    yield lambda method, request: getattr(stub, method)(request, metadata=md, timeout=300)
    channel.close()


def vision(stack: LocalStack, name: str, method: str, request):
    with grpc.insecure_channel(stack.address_of(name), options=[("grpc.max_receive_message_length", 64 << 20)]) as c:
        return getattr(vision_pb2_grpc.VisionServiceStub(c), method)(request, timeout=60)


def bank_of(stack: LocalStack, name: str) -> str:
    banks = vision(stack, name, "Info", vision_pb2.InfoRequest()).banks
    return {b.part: b.bank_id for b in banks}.get(PART, "")


def wait_for_bank(stack: LocalStack, names: list[str], bank_id: str) -> None:
    deadline = time.monotonic() + WITHIN_S
    while (held := {n: bank_of(stack, n) for n in names}) != dict.fromkeys(names, bank_id):
        assert time.monotonic() < deadline, f"not every vision node holds {bank_id} within {WITHIN_S}s: {held}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def reviewed(api, good_frames) -> list[str]:
    """Five reports of the part whose frames a person reviewed OK (the VLM inspected them: no bank yet)."""
    ids = []
    for frame in good_frames[:5]:
        request = inspection_pb2.InspectRequest(image=frame, station=STATION, part=PART, max_new_tokens=4)
        report = api("Inspect", request)
        api("ReviewReport", inspection_pb2.ReviewReportRequest(report_id=report.report_id,
                                                               verdict=inspection_pb2.VERDICT_OK))  # fmt: skip
        ids.append(report.report_id)
    return ids


@pytest.fixture(scope="module")
def taught(stack, api, reviewed) -> inspection_pb2.AnomalyBankVersion:
    """Part taught through the gateway's public API from the reviewed reports."""
    return api("TeachFromReports", inspection_pb2.TeachFromReportsRequest(station=STATION, part=PART, last_n=5))


def test_a_bank_taught_through_the_gateway_reaches_the_other_box_and_the_store(stack, taught):
    assert taught.version == 1
    wait_for_bank(stack, ["vision", "vision1"], taught.bank_id)
    exported = vision(stack, "vision1", "ExportBank", vision_pb2.ExportBankRequest(part=PART, version=1))
    assert exported.sha256 == hashlib.sha256(exported.archive).hexdigest() and exported.bank_id == taught.bank_id
    versions = BankVersions(SQLiteDatabase(stack.opts.workdir / "reports.sqlite"))
    try:
        [published] = versions.newest()
        stored = versions.get(PART, 1)
    finally:
        versions.close()
    assert (published.part, published.version, published.bank_id) == (PART, 1, taught.bank_id)
    assert not published.staged and published.origin in (stack.address_of("vision"), stack.address_of("vision1"))
    assert stored.sha256 == exported.sha256, "the node that imported it holds the very archive the store has"


def test_a_vision_node_started_later_with_an_empty_folder_catches_up_by_itself(stack, api, taught):
    wait_for_bank(stack, ["vision", "vision1"], taught.bank_id)
    start(stack, "vision2")
    wait_for_bank(stack, ["vision", "vision1", "vision2"], taught.bank_id)
    deadline = time.monotonic() + WITHIN_S  # the gateway reads the replicas' banks again every second
    while True:
        replicas = api("GetClusterStatus", inspection_pb2.ClusterStatusRequest()).vision_replicas
        if not any(r.behind for r in replicas):
            break
        assert time.monotonic() < deadline, f"the gateway still holds a caught-up node back: {replicas}"
        time.sleep(0.3)
    assert len(replicas) == 3 and all(r.state == "healthy" for r in replicas)


def foreign_v1(tmp_path: Path) -> vision_pb2.BankArchive:
    """A whole, valid bank of the part under version 1, other than the one the nodes hold."""
    store = BankStore(tmp_path / "elsewhere")
    rng = np.random.default_rng(7)
    store.publish(
        Bank(
            part=PART,
            version=0,
            extractor={"name": "raw-pixel"},
            fingerprint="raw-pixel:elsewhere",
            features=rng.normal(size=(16, 4)).astype(np.float32),
            grid=(4, 4),
            threshold=1.0,
            band=(0.9, 1.1),
            teach_hashes=["0" * 64],
            coreset_ratio=1.0,
            created_at="2026-12-07T00:00:00Z",
        )
    )
    a = store.export_archive(PART, 1)  # fmt: skip
    return vision_pb2.BankArchive(part=a.part, version=a.version, bank_id=a.bank_id, sha256=a.sha256, archive=a.data)


def test_import_bank_refuses_a_wrong_sha256_and_another_bank_under_a_held_number(stack, taught, tmp_path):
    wait_for_bank(stack, ["vision1"], taught.bank_id)
    exported = vision(stack, "vision", "ExportBank", vision_pb2.ExportBankRequest(part=PART, version=1))
    forged = vision_pb2.BankArchive()
    forged.CopyFrom(exported)
    forged.sha256 = "0" * 64
    refusals = {}
    for what, archive in (("sha256", forged), ("conflict", foreign_v1(tmp_path))):
        with pytest.raises(grpc.RpcError) as err:
            vision(stack, "vision1", "ImportBank", archive)
        refusals[what] = err.value
    assert refusals["sha256"].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not match its sha256" in refusals["sha256"].details()
    assert refusals["conflict"].code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"holds another v1 ({taught.bank_id})" in refusals["conflict"].details()
    for err in refusals.values():
        details = err.details()
        assert "127.0.0.1" not in details and str(stack.opts.workdir) not in details and "/" not in details
        assert "Traceback" not in details and "Error" not in details, details
    assert bank_of(stack, "vision1") == taught.bank_id, "a refused import changes nothing"


def test_a_staged_version_is_staged_on_every_box_and_a_promote_on_any_makes_it_current_on_all(
    stack, api, taught, reviewed
):
    names = [n for n in ("vision", "vision1", "vision2") if stack.role(n).proc.poll() is None]
    wait_for_bank(stack, names, taught.bank_id)
    # An addition builds on the part's teach frames: they travel with the bank, so any box can take it.
    staged = api("AddToGoodSet", inspection_pb2.AddToGoodSetRequest(report_id=reviewed[0], stage=True))
    assert staged.staged and staged.version == 2
    deadline = time.monotonic() + WITHIN_S
    while True:
        infos = {n: vision(stack, n, "Info", vision_pb2.InfoRequest()) for n in names}
        held = {n: [b.bank_id for b in info.staged_banks] for n, info in infos.items()}
        if held == dict.fromkeys(names, [staged.bank_id]):
            break
        assert time.monotonic() < deadline, f"{staged.bank_id} is not staged on every box within {WITHIN_S}s: {held}"
        time.sleep(0.3)
    assert {n: bank_of(stack, n) for n in names} == dict.fromkeys(names, taught.bank_id), "staged is not current"
    promoted = api("PromoteBank", inspection_pb2.PromoteBankRequest(part=PART, version=2, force=True))
    assert promoted.bank_id == staged.bank_id and not promoted.staged
    wait_for_bank(stack, names, staged.bank_id)
    versions = BankVersions(SQLiteDatabase(stack.opts.workdir / "reports.sqlite"))
    try:
        assert [(b.version, b.staged) for b in versions.newest()] == [(2, False)]
    finally:
        versions.close()
