"""AggregateReports through the real gateway equals the counts computed from ListReports, on 500 generated reports
(written into the gateway's own database by a second writer, as another gateway process would)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc
from edgeinspect.v1.inspection_pb2 import DefectReport

pytestmark = pytest.mark.e2e
# Long before anything the other tests inspect, so their "latest reports" and shift counts do not see these.
T0 = datetime(2025, 1, 6, 6, 0, tzinfo=UTC)
BUCKET_S = 8 * 3600
OK, DEFECT, UNCERTAIN = inspection_pb2.VERDICT_OK, inspection_pb2.VERDICT_DEFECT, inspection_pb2.VERDICT_UNCERTAIN


def _generate(db_path, n: int = 500) -> None:
    rng = random.Random(500)
    classes = ["porosity", "scratch", "dent", "burr"]
    with ReportStore(db_path) as store:
        for i in range(n):
            report_id, _ = store.claim(f"agg-{i}", "generated")
            verdict = rng.choice([OK, OK, DEFECT, UNCERTAIN])
            r = DefectReport(report_id=report_id, idempotency_key=f"agg-{i}", station=f"agg-{rng.randint(1, 3)}",
                             camera_id=f"cam{rng.randint(1, 2)}", verdict=verdict)  # fmt: skip
            for c in rng.sample(classes, rng.randint(1, 2)) if verdict == DEFECT else []:
                r.defects.add(defect_class=c, severity="minor")
            r.created_time.FromDatetime(T0 + timedelta(seconds=rng.randrange(2 * 86400)))
            store.complete(r)
            if i % 7 == 0:  # some reviewed, some of those overriding the model
                store.review(report_id, rng.choice([OK, DEFECT]), [], "", "gen", "admin")


def _time_range(request) -> None:
    request.since.FromDatetime(T0)
    request.until.FromDatetime(T0 + timedelta(days=3))


def test_aggregates_equal_counts_from_list_reports_on_500_reports(reviewing_stack):
    stack = reviewing_stack.stack
    _generate(stack.opts.workdir / "reports.sqlite")
    md = [("authorization", f"Bearer {reviewing_stack.reader}")]  # a read token may ask both
    with grpc.insecure_channel(stack.gateway_address) as channel:
        stub = inspection_pb2_grpc.InspectionServiceStub(channel)

        def listed(**kw) -> list[DefectReport]:
            out, request = [], inspection_pb2.ListReportsRequest(page_size=200, **kw)
            _time_range(request)
            while True:
                answer = stub.ListReports(request, metadata=md, timeout=60)
                out += answer.reports
                if not answer.next_page_token:
                    return out
                request.page_token = answer.next_page_token

        request = inspection_pb2.AggregateReportsRequest(bucket_seconds=BUCKET_S)
        _time_range(request)
        counts = stub.AggregateReports(request, metadata=md, timeout=60).counts
        reports = listed()
        reviewed = {r.report_id for r in listed(review=inspection_pb2.REVIEW_FILTER_REVIEWED)}
        disagreed = {r.report_id for r in listed(review=inspection_pb2.REVIEW_FILTER_DISAGREED)}
        one_station = inspection_pb2.AggregateReportsRequest(station="agg-2", camera_id="cam1")
        _time_range(one_station)
        (single,) = stub.AggregateReports(one_station, metadata=md, timeout=60).counts
        cam1_at_2 = listed(station="agg-2", camera_id="cam1")
        porosity = listed(defect_class="porosity")
    assert len(reports) == 500 and len(reviewed) == len(range(0, 500, 7))

    expected, expected_classes, expected_reviews = Counter(), Counter(), Counter()
    for r in reports:
        key = (r.station, r.created_time.seconds // BUCKET_S * BUCKET_S)
        expected[*key, inspection_pb2.Verdict.Name(r.verdict)] += 1
        for c in {d.defect_class for d in r.defects}:
            expected_classes[*key, c] += 1
        expected_reviews[*key, "reviewed"] += r.report_id in reviewed
        expected_reviews[*key, "disagreed"] += r.report_id in disagreed
    got, got_classes, got_reviews = Counter(), Counter(), Counter()
    for c in counts:
        key = (c.station, c.bucket_start.seconds)
        for verdict, n in c.by_verdict.items():
            got[*key, verdict] += n
        for defect_class, n in c.by_class.items():
            got_classes[*key, defect_class] += n
        got_reviews[*key, "reviewed"] += c.reviewed
        got_reviews[*key, "disagreed"] += c.disagreed
        assert c.total == sum(c.by_verdict.values())
    assert got == expected
    assert got_classes == expected_classes
    assert +got_reviews == +expected_reviews
    assert single.total == len(cam1_at_2)
    assert sum(c.by_class.get("porosity", 0) for c in counts) == len(porosity)
