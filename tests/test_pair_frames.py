"""Issue 58, frames in a gateway pair, without the stack: two report stores on one real PostgreSQL with a frames folder
each (or one shared), and GetReportImage's reads (reports/images.py) against a real gRPC server over the other store.
The end-to-end path through two gateway processes is in test_gateway_pair.py."""

from __future__ import annotations

import dataclasses
import time

import grpc
import pytest

from edgeinspect.assets import asset_path, sample_image
from edgeinspect.config import ApiToken, ServerConfig, TokenRole
from edgeinspect.services.common.auth import hash_token, new_token, public_auth
from edgeinspect.services.common.server import start_server
from edgeinspect.services.gateway.api.servicer import InspectionServicer
from edgeinspect.services.gateway.reports.images import FORWARDED_KEY, FrameHeldElsewhere, ReportImages
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.gateway.settings import FrameSettings
from edgeinspect.services.store.database import PostgresDatabase
from edgeinspect.services.store.schema import SCHEMA_VERSION
from edgeinspect.services.store.settings import StoreBackend, StoreSettings
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc
from edgeinspect.v1.inspection_pb2 import IMAGE_STATE_EXPIRED, IMAGE_STATE_STORED, DefectReport

FRAME = asset_path("part_ok.jpg").read_bytes()
HEATMAP = b"\x89PNG\r\n\x1a\n-heatmap"
BANK = "HSG-210@v3"


@pytest.fixture
def pair_stores(postgres_server, tmp_path):
    """gw-a and gw-b on one database, a frames folder each; `shared(...)` opens another store on gw-a's folder."""
    dsn = postgres_server.fresh_schema_dsn()
    opened: list[ReportStore] = []

    def store(owner: str, folder: str, **kw) -> ReportStore:
        frames = FrameSettings(dir=tmp_path / folder)
        opened.append(ReportStore(PostgresDatabase(dsn), owner=owner, frames=frames, **kw))
        return opened[-1]

    yield store
    for s in opened:
        s.close()


def _report_on(store: ReportStore) -> str:
    report = DefectReport(report_id=f"{time.time_ns():032x}", station="pair")
    report.anomaly.bank_id = BANK
    store.complete(report, image=FRAME, heatmap=HEATMAP)
    return report.report_id


def test_a_frame_on_the_other_gateways_disk_names_its_holder_and_address(pair_stores):
    a, b = pair_stores("gw-a", "frames-a"), pair_stores("gw-b", "frames-b")
    a.advertise("10.0.0.7:50051")
    report_id = _report_on(a)
    for kind in ({}, {"thumbnail": True}, {"heatmap": True}):
        assert a.image(report_id, **kind).state == IMAGE_STATE_STORED
        answer = b.image(report_id, **kind)
        assert answer.state == IMAGE_STATE_EXPIRED and answer.data == b""
        assert (answer.holder.owner, answer.holder.address, answer.holder.live) == ("gw-a", "10.0.0.7:50051", True)
    assert a._db.schema_version() == SCHEMA_VERSION >= 5  # 5 added the address a holder is reached at


def test_each_gateway_of_a_pair_prunes_only_the_frames_on_its_own_disk(pair_stores):
    a, b = pair_stores("gw-a", "frames-a"), pair_stores("gw-b", "frames-b")
    b.frame_settings = FrameSettings(dir=b.frames.root, max_bytes=0)  # gw-b's budget fits no frame at all
    on_a = _report_on(a)
    assert b.prune_frames() == []  # gw-b holds no frame: gw-a's row and file stay
    assert a.image(on_a).state == IMAGE_STATE_STORED
    other = DefectReport(report_id=f"{time.time_ns():032x}", station="pair")
    b.complete(other, image=sample_image().read_bytes())  # complete() prunes at once: gw-b's own frame goes
    assert b.image(other.report_id).state == IMAGE_STATE_EXPIRED and a.image(on_a).state == IMAGE_STATE_STORED


def test_a_pair_sharing_one_frames_folder_reads_the_file_without_a_holder(pair_stores):
    a, b = pair_stores("gw-a", "frames"), pair_stores("gw-b", "frames")
    report_id = _report_on(a)
    for kind in ({}, {"thumbnail": True}, {"heatmap": True}):
        answer = b.image(report_id, **kind)
        assert answer.state == IMAGE_STATE_STORED and answer.holder is None
        assert answer.data == a.image(report_id, **kind).data


async def test_a_silent_or_unreachable_holder_is_named_quickly_without_its_address(pair_stores):
    a, b = pair_stores("gw-a", "frames-a"), pair_stores("gw-b", "frames-b")
    report_id = _report_on(a)  # gw-a never beat: silent
    with pytest.raises(FrameHeldElsewhere, match="'gw-a', which has not been heard from"):
        await ReportImages(b).image(report_id, False, False)
    a.heartbeat()  # alive, but no address advertised
    with pytest.raises(FrameHeldElsewhere, match="'gw-a', which advertises no address"):
        await ReportImages(b).image(report_id, False, False)
    a.advertise("127.0.0.1:1")  # alive by its heartbeat, but nothing listens there
    started = time.monotonic()
    with pytest.raises(FrameHeldElsewhere, match="'gw-a', which is not answering") as down:
        await ReportImages(b).image(report_id, False, False)
    assert time.monotonic() - started < 5 and "127.0.0.1" not in str(down.value)


async def test_the_holders_image_is_read_as_the_same_caller(pair_stores):
    a, b = pair_stores("gw-a", "frames-a"), pair_stores("gw-b", "frames-b")
    token = new_token()
    auth = public_auth([ApiToken(name="viewer", role=TokenRole.read, hash=hash_token(token))], 50.0, 50, False)
    running = await start_server(
        [lambda s: inspection_pb2_grpc.add_InspectionServiceServicer_to_server(InspectionServicer(a), s)],
        [],
        ServerConfig(host="127.0.0.1", port=0),
        role="gateway",
        interceptors=[auth],
    )
    try:
        a.advertise(f"127.0.0.1:{running.port}")
        report_id = _report_on(a)
        caller = [("authorization", f"Bearer {token}")]
        for kind in ({}, {"thumbnail": True}, {"heatmap": True}):
            wanted = a.image(report_id, **kind)
            got = await ReportImages(b).image(
                report_id, kind.get("thumbnail", False), kind.get("heatmap", False), caller
            )
            assert (got.state, got.data) == (IMAGE_STATE_STORED, wanted.data)
            assert dataclasses.replace(got.frame, nbytes=0) == dataclasses.replace(wanted.frame, nbytes=0)
        with pytest.raises(FrameHeldElsewhere, match="refused this caller's token"):
            await ReportImages(b).image(report_id, False, False, [("authorization", "Bearer ei_not-a-token")])
        # A forwarded call answers from its own box only: gw-b never asks on for a forwarded read.
        forwarded = await ReportImages(b).image(report_id, False, False, [*caller, (FORWARDED_KEY, "gw-a")])
        assert forwarded.state == IMAGE_STATE_EXPIRED
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:  # the holder's own answer
            reply = await inspection_pb2_grpc.InspectionServiceStub(channel).GetReportImage(
                inspection_pb2.GetReportImageRequest(report_id=report_id), metadata=caller
            )
        assert reply.data == FRAME
    finally:
        await running.stop(0)


def test_the_advertised_address_defaults_to_the_bound_one_except_on_every_interface():
    pg = {"backend": StoreBackend.postgres, "dsn": "postgresql://x@h/db"}
    assert StoreSettings(**pg).advertised("10.0.0.7", 50051) == "10.0.0.7:50051"
    assert StoreSettings(**pg).advertised("0.0.0.0", 50051) == ""
    assert StoreSettings(**pg).advertised("::", 50051) == ""
    assert StoreSettings(**pg).advertised("fd00::7", 50051) == "[fd00::7]:50051"
    assert StoreSettings(**pg, advertise="gw-a.plant:50051").advertised("0.0.0.0", 50051) == "gw-a.plant:50051"
    with pytest.raises(ValueError, match="host:port"):
        StoreSettings(**pg, advertise="gw-a.plant")
