"""`edgeinspect verify` checks the cluster without leaving a trace in production: its requests (verification=True)
are answered but never stored in the report store nor published to the line's outputs."""

from __future__ import annotations

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc


def test_a_verification_request_is_answered_but_not_stored(embedded_stack):
    md = [("authorization", f"Bearer {embedded_stack.api_token}")]
    with grpc.insecure_channel(embedded_stack.gateway_address) as ch:
        stub = inspection_pb2_grpc.InspectionServiceStub(ch)
        request = inspection_pb2.InspectRequest(
            image=asset_path("part_ok.jpg").read_bytes(), max_new_tokens=6, verification=True, station="verify"
        )
        report = stub.Inspect(request, metadata=md, timeout=120)
        assert report.generated_token_ids and report.prompt_token_ids  # answered in full
        listed = stub.ListReports(inspection_pb2.ListReportsRequest(), metadata=md, timeout=60)
        assert report.report_id not in [r.report_id for r in listed.reports]
        assert all(r.station != "verify" for r in listed.reports)
        with pytest.raises(grpc.RpcError) as missing:
            stub.GetReport(inspection_pb2.GetReportRequest(report_id=report.report_id), metadata=md, timeout=60)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
