"""The console's pure helpers (shifts, defect boxes, filter parsing, CSV rows) and its listener."""

from __future__ import annotations

import csv
import io
from datetime import datetime

import pytest

from edgeinspect.services.console import views
from edgeinspect.v1 import inspection_pb2


@pytest.mark.parametrize(
    "now, start",
    [("2026-12-01T05:59", "2026-11-30T22:00"), ("2026-12-01T06:00", "2026-12-01T06:00"),
     ("2026-12-01T13:59", "2026-12-01T06:00"), ("2026-12-01T14:00", "2026-12-01T14:00"),
     ("2026-12-01T23:30", "2026-12-01T22:00")],
)  # fmt: skip
def test_shift_start_for_three_eight_hour_shifts_from_six(now, start):
    assert views.shift_start(datetime.fromisoformat(now), 6, 8) == datetime.fromisoformat(start)


def test_defect_boxes_are_percent_of_the_frame_and_clamped():
    r = inspection_pb2.DefectReport()
    d = r.defects.add(defect_class="dent", severity="major")
    d.box.x, d.box.y, d.box.width, d.box.height = 0.25, 0.5, 0.5, 0.75  # runs past the bottom edge
    r.defects.add(defect_class="scratch")  # no coordinates: no box
    (box,) = views.defect_boxes(r)
    assert box.label == "dent (major)"
    assert box.style == "left:25.00%;top:50.00%;width:50.00%;height:50.00%"


def test_list_request_from_query_parameters():
    q = views.list_request({"station": "s3", "verdict": "defect", "review": "disagreed", "defect_class": "porosity",
                            "since": "2026-12-01T06:00"})  # fmt: skip
    assert (q.station, q.verdict, q.review, q.defect_class) == (
        "s3", inspection_pb2.VERDICT_DEFECT, inspection_pb2.REVIEW_FILTER_DISAGREED, "porosity")  # fmt: skip
    assert q.since.ToJsonString() == "2026-12-01T06:00:00Z" and not q.HasField("until")


@pytest.mark.parametrize("params, match", [({"verdict": "bad"}, "verdict"), ({"review": "x"}, "review"),
                                           ({"since": "yesterday"}, "since")])  # fmt: skip
def test_bad_filter_names_the_parameter(params, match):
    with pytest.raises(ValueError, match=match):
        views.list_request(params)


def test_csv_rows_carry_both_verdicts():
    r = inspection_pb2.DefectReport(report_id="a" * 32, station="s1", verdict=inspection_pb2.VERDICT_OK)
    r.review.verdict, r.review.reviewer = inspection_pb2.VERDICT_DEFECT, "ann"
    r.review.defect_classes.append("dent")
    (row,) = list(csv.DictReader(io.StringIO(views.to_csv([r]))))
    assert (row["verdict"], row["reviewed_verdict"], row["reviewed_classes"], row["reviewer"]) == (
        "OK", "DEFECT", "dent", "ann")  # fmt: skip
    assert row["review_agrees"] == "no"


def test_console_on_a_taken_port_fails_naming_the_port():
    import socket

    from edgeinspect.errors import FailedPrecondition
    from edgeinspect.services.console.server import bind

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(FailedPrecondition, match=f"127.0.0.1:{port}"):
            bind("127.0.0.1", port)
    finally:
        holder.close()
    bind("127.0.0.1", port).close()  # free again: it binds


def test_replica_rows_show_a_vision_replica_behind_on_a_bank_and_which_replica_served_last():
    from edgeinspect.services.cluster_view import replica_rows

    status = inspection_pb2.ClusterStatus()
    status.vision_replicas.add(address="v0:1", state="healthy", last=True, banks={"board": "board@v2:aa"})
    status.vision_replicas.add(address="v1:1", state="healthy", banks={"board": "board@v1:bb"}, behind=["board"])
    status.stages.add(address="s0:1", state="down", layer_start=0, layer_end=3, reason="UNAVAILABLE: reset")
    status.retrieval_replicas.add(address="r0:1", state="behind", reason="older", index_version="v000001",
                                  index_fingerprint="8ceaab2c8b0d")  # fmt: skip
    rows = {r.address: r for r in replica_rows(status)}
    assert [r.role for r in rows.values()] == ["vision", "vision", "stage", "retrieval"]
    assert (rows["v0:1"].state, rows["v0:1"].last) == ("healthy", True)
    assert rows["v1:1"].state == "behind" and "board" in rows["v1:1"].why  # still encodes; no Score of board
    assert (rows["s0:1"].state, rows["s0:1"].version, rows["s0:1"].why) == (
        "down",
        "layers [0,3)",
        "UNAVAILABLE: reset",
    )
    assert rows["r0:1"].version == "index v000001 (8ceaab2c8b0d)" and rows["r0:1"].why == "older"
