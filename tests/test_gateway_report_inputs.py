"""Bad ListReports / GetReport / AggregateReports / GetReportImage input through the real gateway: the right status
with a bounded message, and the next good request still succeeds. Plus: the frame is kept with the report."""

from __future__ import annotations

import base64
import csv
import json
import subprocess
import sys

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

pytestmark = pytest.mark.e2e


def _token(*parts) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts, separators=(",", ":")).encode()).decode().rstrip("=")


def _nested(depth: int) -> str:
    return base64.urlsafe_b64encode(("[" * depth + "]" * depth).encode()).decode().rstrip("=")


@pytest.fixture(scope="module")
def api(embedded_stack):
    channel = grpc.insecure_channel(embedded_stack.gateway_address)
    stub = inspection_pb2_grpc.InspectionServiceStub(channel)
    md = [("authorization", f"Bearer {embedded_stack.api_token}")]
    yield stub, md
    channel.close()


@pytest.fixture(scope="module")
def stored(api):
    """One real inspection, so the good follow-up requests have something to find."""
    stub, md = api
    request = inspection_pb2.InspectRequest(
        image=asset_path("part_scratch.jpg").read_bytes(), station="st-inputs", camera_id="cam-9", max_new_tokens=4
    )
    return stub.Inspect(request, metadata=md, timeout=300)


def _good_list(stub, md, stored) -> None:
    answer = stub.ListReports(inspection_pb2.ListReportsRequest(station="st-inputs"), metadata=md, timeout=30)
    assert stored.report_id in [r.report_id for r in answer.reports]


def _refused(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    details = err.value.details()
    assert len(details) < 400 and "Error" not in details and "Traceback" not in details
    return details


@pytest.mark.parametrize(
    "token",
    [_token(2**70, "x"), _token(-(2**70), "x"), _nested(5000), _nested(50)],
    ids=["2^70", "-2^70", "nested-5000", "nested-50"],
)
def test_list_reports_with_a_bad_page_token_is_invalid_argument(api, stored, token):
    stub, md = api
    details = _refused(
        lambda: stub.ListReports(inspection_pb2.ListReportsRequest(page_token=token), metadata=md, timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "page_token" in details
    _good_list(stub, md, stored)


@pytest.mark.parametrize(
    "field, seconds, nanos",
    [("since", 2**62, 0), ("since", -(2**62), 0), ("until", 2**62, 0), ("since", 0, -1), ("until", 0, 10**9)],
)
def test_list_reports_with_an_out_of_range_time_is_invalid_argument(api, stored, field, seconds, nanos):
    stub, md = api
    request = inspection_pb2.ListReportsRequest()
    getattr(request, field).seconds = seconds
    getattr(request, field).nanos = nanos
    details = _refused(lambda: stub.ListReports(request, metadata=md, timeout=30), grpc.StatusCode.INVALID_ARGUMENT)
    assert field in details
    _good_list(stub, md, stored)


def test_aggregate_with_an_out_of_range_time_is_invalid_argument(api, stored):
    stub, md = api
    request = inspection_pb2.AggregateReportsRequest()
    request.since.seconds = 2**62
    _refused(lambda: stub.AggregateReports(request, metadata=md, timeout=30), grpc.StatusCode.INVALID_ARGUMENT)
    answer = stub.AggregateReports(inspection_pb2.AggregateReportsRequest(station="st-inputs"), metadata=md, timeout=30)
    assert answer.counts[0].total >= 1


@pytest.mark.parametrize("method", ["GetReport", "GetReportImage"])
def test_a_megabyte_report_id_is_refused_without_echoing_it(api, stored, method):
    stub, md = api
    request_cls = inspection_pb2.GetReportRequest if method == "GetReport" else inspection_pb2.GetReportImageRequest
    huge = "x" * (1 << 20)
    details = _refused(
        lambda: getattr(stub, method)(request_cls(report_id=huge), metadata=md, timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "x" * 50 not in details
    assert getattr(stub, method)(request_cls(report_id=stored.report_id), metadata=md, timeout=30).report_id


def test_unknown_report_id_is_not_found(api, stored):
    stub, md = api
    details = _refused(
        lambda: stub.GetReport(inspection_pb2.GetReportRequest(report_id="0" * 32), metadata=md, timeout=30),
        grpc.StatusCode.NOT_FOUND,
    )
    assert "0" * 32 in details
    assert stub.GetReport(inspection_pb2.GetReportRequest(report_id=stored.report_id), metadata=md, timeout=30)


def test_the_frame_is_kept_with_the_report_and_served(api, stored):
    stub, md = api
    sent = asset_path("part_scratch.jpg").read_bytes()
    request = inspection_pb2.GetReportImageRequest(report_id=stored.report_id)
    image = stub.GetReportImage(request, metadata=md, timeout=30)
    assert image.state == inspection_pb2.IMAGE_STATE_STORED
    assert image.data == sent and image.media_type == "image/jpeg" and image.width > 0
    thumb = stub.GetReportImage(
        inspection_pb2.GetReportImageRequest(report_id=stored.report_id, thumbnail=True), metadata=md, timeout=30
    )
    assert thumb.state == inspection_pb2.IMAGE_STATE_STORED and 0 < len(thumb.data) < len(sent)
    listed = stub.ListReports(inspection_pb2.ListReportsRequest(camera_id="cam-9"), metadata=md, timeout=30)
    assert [r.report_id for r in listed.reports] == [stored.report_id]


def _cli(stack, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "edgeinspect.cli", "reports", *args, "--gateway", stack.gateway_address,
            "--token", stack.api_token]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_reports_cli_lists_shows_reviews_and_exports(embedded_stack, stored, tmp_path):
    listed = _cli(embedded_stack, "list", "--station", "st-inputs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert stored.report_id in [json.loads(line)["report_id"] for line in listed.stdout.splitlines()]
    reviewed = _cli(embedded_stack, "review", stored.report_id, "--verdict", "defect", "--classes", "scratch",
                    "--comment", "cli", "--json")  # fmt: skip
    assert reviewed.returncode == 0, reviewed.stderr
    review = json.loads(reviewed.stdout)
    assert review["verdict"] == "VERDICT_DEFECT" and review["defect_classes"] == ["scratch"]
    shown = _cli(embedded_stack, "show", stored.report_id)
    assert shown.returncode == 0 and "reviewed: DEFECT scratch" in shown.stdout
    out = tmp_path / "reports.csv"
    exported = _cli(embedded_stack, "export", "--station", "st-inputs", "--review", "reviewed", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["report_id"] for r in rows] == [stored.report_id] and rows[0]["reviewed_verdict"] == "DEFECT"
    missing = _cli(embedded_stack, "show", "0" * 32)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr and "Traceback" not in missing.stderr
