"""The anomaly gate in the service (issue 57): the embedded stack as separate processes, a gated station, a part
taught through the vision node's Teach. A good part is answered by the gate alone (stage Stats prove no decoder
step), a flagged one by the gate and the VLM and never OK, an admin adds a falsely rejected frame to the good set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.services.common.auth import hash_token
from edgeinspect.services.line.plcsim import PlcSim
from edgeinspect.services.line.testing import free_port
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.testing import stop_process
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, stage_pb2, stage_pb2_grpc, vision_pb2, vision_pb2_grpc

PART = "board"
GATED, VLM_STATION = "gated-1", "line-vlm"
ADMIN, INSPECTOR = "ei_gate-admin-token-for-tests-000000", "ei_gate-inspect-token-for-tests-0000"
NEW_TOKENS = 48
PNG = b"\x89PNG\r\n\x1a\n"
FAINT_SCRATCH = "test/scratch/000.png"  # severity 1: flagged by the 30-frame bank, acceptable to a person here


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("anomaly-sample")
    write_sample_set(root, parts=[PART])
    return root / PART


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory, sample):
    tokens = [{"name": "ann-admin", "role": "admin", "hash": hash_token(ADMIN)},
              {"name": "camera-1", "role": "inspect", "hash": hash_token(INSPECTOR)}]  # fmt: skip
    opts = StackOptions(workdir=tmp_path_factory.mktemp("gate"), checkpoint=tiny_checkpoint, stages=2,
                        api_token=ADMIN, extra_env={"EDGEINSPECT_API_TOKENS": json.dumps(tokens)},
                        anomaly="vlm", gate_stations=(GATED,))  # fmt: skip
    with LocalStack(opts) as s:
        frames = [p.read_bytes() for p in sorted((sample / "train" / "good").glob("*.png"))]
        with grpc.insecure_channel(s.address_of("vision")) as channel:
            taught = vision_pb2_grpc.VisionServiceStub(channel).Teach(
                vision_pb2.TeachRequest(part=PART, frames=frames), timeout=300
            )
        assert taught.bank.version == 1 and taught.bank.frames == len(frames)
        yield s


@pytest.fixture(scope="module")
def api(stack):
    channel = grpc.insecure_channel(stack.gateway_address)
    yield inspection_pb2_grpc.InspectionServiceStub(channel)
    channel.close()


def call(api, method: str, request, token: str = ADMIN):
    return getattr(api, method)(request, metadata=[("authorization", f"Bearer {token}")], timeout=300)


def inspect(api, path, station: str, part: str = PART) -> tuple[inspection_pb2.DefectReport, float]:
    request = inspection_pb2.InspectRequest(image=path.read_bytes(), station=station, part=part,
                                            max_new_tokens=NEW_TOKENS)  # fmt: skip
    started = time.perf_counter()
    report = call(api, "Inspect", request)
    return report, time.perf_counter() - started


def decoder_steps(stack) -> int:
    """Session-steps every decoder stage has run so far (StageStats)."""
    total = 0
    for k in range(2):
        with grpc.insecure_channel(stack.address_of(f"stage{k}")) as channel:
            total += stage_pb2_grpc.DecoderStageStub(channel).Stats(stage_pb2.StatsRequest(), timeout=10).session_steps
    return total


def heatmap(api, report_id: str) -> inspection_pb2.ReportImage:
    return call(api, "GetReportImage", inspection_pb2.GetReportImageRequest(report_id=report_id, heatmap=True))


def overlaps(box: inspection_pb2.BoundingBox, drawn: list[float]) -> bool:
    x0, y0, x1, y1 = drawn
    return box.x < x1 and x0 < box.x + box.width and box.y < y1 and y0 < box.y + box.height


def test_good_part_is_answered_by_the_gate_without_a_decoder_step(stack, api, sample):
    good = sample / "test" / "good" / "000.png"
    _, vlm_s = inspect(api, good, VLM_STATION)  # today's full VLM report of the same frame, same run
    before = decoder_steps(stack)
    report, gate_s = inspect(api, good, GATED)
    assert decoder_steps(stack) == before, "a good part under `gate` must take no decoder step"
    assert report.verdict == inspection_pb2.VERDICT_OK
    a = report.anomaly
    assert a.decided_by == inspection_pb2.DECIDED_BY_GATE and a.policy == "gate"
    assert 0 < a.score < a.threshold and a.bank_id.startswith(f"{PART}@v1") and a.extractor_fingerprint
    assert a.score < a.ok_cut < a.threshold < a.defect_cut  # OK below the OK cut, the one number reports name
    assert f"below the OK cut {a.ok_cut:.3g}" in report.description
    assert not report.generated_token_ids and not a.regions
    assert gate_s < vlm_s, f"gate {gate_s:.2f} s is not faster than a VLM report {vlm_s:.2f} s"
    image = heatmap(api, report.report_id)
    assert a.heatmap_stored and image.state == inspection_pb2.IMAGE_STATE_STORED and image.data.startswith(PNG)
    assert image.media_type == "image/png"
    stored = call(api, "GetReport", inspection_pb2.GetReportRequest(report_id=report.report_id))
    assert stored.anomaly == report.anomaly  # the finding round-trips through the report store


def explained(api, report_id: str, within_s: float = 240.0) -> inspection_pb2.DefectReport:
    """The stored report once its explanation is no longer pending."""
    deadline = time.monotonic() + within_s
    while True:
        report = call(api, "GetReport", inspection_pb2.GetReportRequest(report_id=report_id))
        if report.explanation != inspection_pb2.EXPLANATION_PENDING or time.monotonic() > deadline:
            return report
        time.sleep(0.5)


def test_flagged_frame_is_decided_at_takt_then_explained_by_the_vlm_never_ok_and_boxed(stack, api, sample):
    labels = json.loads((sample / "defects.json").read_text())
    name = next(n for n, label in labels.items() if label["severity"] == 3)
    decision, decided_s = inspect(api, sample / name, GATED)
    # The line's answer: the gate's verdict with its boxes, before any token (the VLM explains after).
    assert decision.verdict == inspection_pb2.VERDICT_DEFECT and "decided at takt" in decision.verdict_reason
    assert decision.explanation == inspection_pb2.EXPLANATION_PENDING and not decision.generated_token_ids
    a = decision.anomaly
    assert a.decided_by == inspection_pb2.DECIDED_BY_GATE and a.score > a.threshold and a.regions
    assert not [t for t in decision.timings if t.stage.startswith("stage") or t.stage == "vision"]
    assert any(d.defect_class == "anomaly" and overlaps(d.box, labels[name]["box"]) for d in decision.defects)

    report = explained(api, decision.report_id)
    assert report.explanation == inspection_pb2.EXPLANATION_DONE, report.explanation_error
    assert report.verdict == inspection_pb2.VERDICT_DEFECT and report.verdict_reason == decision.verdict_reason
    assert report.anomaly == decision.anomaly and report.created_time == decision.created_time
    assert report.vlm_verdict != inspection_pb2.VERDICT_UNSPECIFIED and report.HasField("explained_time")
    assert report.generated_token_ids and report.raw_text.strip(), "the VLM described the flagged frame"
    assert any(d.HasField("box") and overlaps(d.box, labels[name]["box"]) for d in report.defects), (
        f"no defect box overlaps the drawn {labels[name]['kind']} at {labels[name]['box']}: {report.defects}"
    )
    assert heatmap(api, report.report_id).data.startswith(PNG)
    # The same frame at a station that waits for the VLM took the whole report: the decision came faster.
    _, full_s = inspect(api, sample / name, VLM_STATION)
    assert decided_s < full_s, f"decided in {decided_s:.2f} s, a full report took {full_s:.2f} s"


def test_a_stream_gets_the_decision_first_then_the_explanation_as_it_is_written(stack, api, sample):
    labels = json.loads((sample / "defects.json").read_text())
    name = next(n for n, label in labels.items() if label["severity"] == 3)
    request = inspection_pb2.InspectRequest(image=(sample / name).read_bytes(), station=GATED, part=PART,
                                            max_new_tokens=NEW_TOKENS)  # fmt: skip
    events = list(api.InspectStream(request, metadata=[("authorization", f"Bearer {ADMIN}")], timeout=300))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "decision" and kinds[-1] == "report" and "delta" in kinds, kinds
    decision, final = events[0].decision, events[-1].report
    assert decision.explanation == inspection_pb2.EXPLANATION_PENDING
    assert final.report_id == decision.report_id and final.explanation == inspection_pb2.EXPLANATION_DONE
    assert final.verdict == decision.verdict
    assert "".join(e.delta.text for e in events if e.HasField("delta")).strip()


async def test_the_plc_reads_the_gates_score_and_regions_over_opc_ua(stack, api, sample, tmp_path):
    """`edgeinspect ingest` serving OPC UA for the gated station: a defective part's cycle gives NG with the gate's
    score, threshold, who decided and the regions, equal to what the stored report says."""
    labels = json.loads((sample / "defects.json").read_text())
    name = next(n for n, label in labels.items() if label["severity"] == 3)
    (tmp_path / "cam").mkdir()
    shutil.copy(sample / name, tmp_path / "cam" / "part.png")
    port = free_port()
    camera = {"id": "cam-gated", "station": GATED, "part": PART, "source": str(tmp_path / "cam"), "loop": True,
              "folder_fps": 20, "sampling": {"trigger_only": True}, "max_new_tokens": 12,
              "line": {"result_deadline_ms": 120_000, "ack_timeout_ms": 5_000}}  # fmt: skip
    cfg = {"cameras": [camera], "gateway": stack.gateway_address, "api_token": ADMIN, "request_timeout_s": 120,
           "frames_dir": str(tmp_path / "frames"), "log_json": False,
           "opcua": {"host": "127.0.0.1", "port": port, "journal": str(tmp_path / "line.sqlite")}}  # fmt: skip
    (tmp_path / "cameras.yaml").write_text(yaml.safe_dump(cfg))
    with (tmp_path / "ingest.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "edgeinspect.cli", "ingest", "--config",
                                 str(tmp_path / "cameras.yaml")], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            plc = await PlcSim.when_up(f"opc.tcp://127.0.0.1:{port}/edgeinspect/", GATED)
            try:
                cycle = await plc.cycle(result_timeout_s=150)
            finally:
                await plc.__aexit__()
        finally:
            stop_process(proc, grace_s=30)
    assert cycle.error == 0 and cycle.ng and not cycle.ok, cycle
    stored = call(api, "GetReport", inspection_pb2.GetReportRequest(report_id=cycle.report_id)).anomaly
    seen = cycle.anomaly
    assert seen["decided_by"] == "GATE" and seen["score"] > seen["threshold"] > 0  # decided at takt
    assert seen["score"] == pytest.approx(stored.score, rel=1e-5)
    # The PLC's AnomalyThreshold node is the OK cut, the one number that decides OK (below the band's threshold).
    assert seen["threshold"] == pytest.approx(stored.ok_cut, rel=1e-5)
    assert 0 < stored.ok_cut < stored.threshold < stored.defect_cut
    assert len(seen["regions"]) == len(stored.regions) >= 1
    for box, region in zip(seen["regions"], stored.regions, strict=True):
        assert box == pytest.approx([region.x, region.y, region.width, region.height], abs=1e-4)


def test_policy_vlm_records_the_score_beside_the_vlm_verdict(stack, api, sample):
    report, _ = inspect(api, sample / "test" / "good" / "001.png", VLM_STATION)
    a = report.anomaly
    assert a.decided_by == inspection_pb2.DECIDED_BY_VLM and a.policy == "vlm"
    assert a.score > 0 and a.bank_id.startswith(PART) and report.generated_token_ids


def test_part_without_a_bank_runs_the_vlm_and_says_so(stack, api, sample):
    report, _ = inspect(api, sample / "test" / "good" / "002.png", VLM_STATION, part="HSG-210")
    assert report.generated_token_ids and report.verdict != inspection_pb2.VERDICT_UNSPECIFIED
    assert report.anomaly.decided_by == inspection_pb2.DECIDED_BY_VLM
    assert "no anomaly bank for part HSG-210" in report.anomaly.note and not report.anomaly.bank_id


def test_a_misspelled_part_at_a_gated_station_is_never_passed_and_the_known_parts_are_named(stack, api, sample):
    report, _ = inspect(api, sample / "test" / "good" / "002.png", GATED, part="baord")
    assert report.generated_token_ids, "the VLM still describes the frame"
    assert report.verdict == inspection_pb2.VERDICT_UNCERTAIN, "a part the gate has not judged is never OK here"
    for said in (report.anomaly.note, report.verdict_reason):
        assert "no anomaly bank for part 'baord'" in said and f"parts with a bank: {PART}" in said, said
    shown = subprocess.run(
        [sys.executable, "-m", "edgeinspect.cli", "reports", "show", report.report_id[:12], "--gateway",
         stack.gateway_address, "--token", ADMIN],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert shown.returncode == 0 and "UNCERTAIN" in shown.stdout and "'baord'" in shown.stdout, shown.stderr


def test_non_admin_token_may_not_change_the_good_set(stack, api, sample):
    report, _ = inspect(api, sample / "test" / "good" / "003.png", GATED)
    for method, request in (
        ("AddToGoodSet", inspection_pb2.AddToGoodSetRequest(report_id=report.report_id)),
        ("TeachFromReports", inspection_pb2.TeachFromReportsRequest(station=GATED, part=PART, last_n=5)),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call(api, method, request, token=INSPECTOR)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_add_to_good_set_makes_a_new_version_and_the_frame_then_passes(stack, api, sample):
    rejected, _ = inspect(api, sample / FAINT_SCRATCH, GATED)
    assert rejected.verdict != inspection_pb2.VERDICT_OK and rejected.anomaly.bank_id.startswith(f"{PART}@v1")
    version = call(api, "AddToGoodSet", inspection_pb2.AddToGoodSetRequest(report_id=rejected.report_id))
    assert version.version == 2 and version.bank_id.startswith(f"{PART}@v2") and not version.outliers
    again, _ = inspect(api, sample / FAINT_SCRATCH, GATED)
    assert again.verdict == inspection_pb2.VERDICT_OK, again.anomaly
    assert again.anomaly.decided_by == inspection_pb2.DECIDED_BY_GATE and again.anomaly.bank_id == version.bank_id
    with pytest.raises(grpc.RpcError) as err:
        call(api, "AddToGoodSet", inspection_pb2.AddToGoodSetRequest(report_id="0" * 32))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_teach_from_reports_uses_the_reviewed_ok_frames(stack, api, sample):
    with pytest.raises(grpc.RpcError) as err:  # nothing reviewed yet
        call(api, "TeachFromReports", inspection_pb2.TeachFromReportsRequest(station=GATED, part=PART, last_n=5))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "reviewed OK" in err.value.details()
    for i in range(5, 10):
        report, _ = inspect(api, sample / "test" / "good" / f"{i:03d}.png", GATED)
        review = inspection_pb2.ReviewReportRequest(report_id=report.report_id, verdict=inspection_pb2.VERDICT_OK)
        call(api, "ReviewReport", review)
    version = call(api, "TeachFromReports", inspection_pb2.TeachFromReportsRequest(station=GATED, part=PART, last_n=5))
    assert version.version == 3 and version.frames + len(version.outliers) == 5


def flagged_faint_frame(api, sample) -> tuple[inspection_pb2.DefectReport, Path]:
    """A severity-1 defect the current bank flags: an operator would call it good."""
    labels = json.loads((sample / "defects.json").read_text())
    for name in sorted(n for n, label in labels.items() if label["severity"] == 1):
        report, _ = inspect(api, sample / name, GATED)
        if report.verdict != inspection_pb2.VERDICT_OK:  # flagged: decided at takt, explained after
            return report, sample / name
    raise AssertionError("the current bank flags no faint defect")


def test_a_staged_good_set_addition_is_not_used_until_promoted_and_promotion_checks_it(stack, api, sample):
    rejected, path = flagged_faint_frame(api, sample)
    live = rejected.anomaly.bank_id
    staged = call(api, "AddToGoodSet", inspection_pb2.AddToGoodSetRequest(report_id=rejected.report_id, stage=True))
    assert staged.staged and staged.bank_id != live
    vision = grpc.insecure_channel(stack.address_of("vision"))
    info = vision_pb2_grpc.VisionServiceStub(vision).Info(vision_pb2.InfoRequest(), timeout=10)
    vision.close()
    assert [b.bank_id for b in info.banks if b.part == PART] == [live]  # what every replica compares
    assert [(b.bank_id, b.staged) for b in info.staged_banks] == [(staged.bank_id, True)]
    again, _ = inspect(api, path, GATED)
    assert again.anomaly.bank_id == live and again.verdict != inspection_pb2.VERDICT_OK  # the staged one never gates

    def promote(version: int, force: bool = False, token: str = ADMIN):
        request = inspection_pb2.PromoteBankRequest(part=PART, version=version, force=force)
        with pytest.raises(grpc.RpcError) as err:
            call(api, "PromoteBank", request, token=token)
        return err.value.code(), err.value.details()

    code, details = promote(staged.version)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "has no go-live figures" in details, details
    assert promote(staged.version, token=INSPECTOR)[0] == grpc.StatusCode.PERMISSION_DENIED
    assert promote(staged.version + 5)[0] == grpc.StatusCode.NOT_FOUND
    assert promote(0)[0] == grpc.StatusCode.INVALID_ARGUMENT
    code, details = promote(int(live.split("@v")[1].split(":")[0]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "already the current version" in details

    promoted = call(
        api, "PromoteBank", inspection_pb2.PromoteBankRequest(part=PART, version=staged.version, force=True)
    )
    assert promoted.bank_id == staged.bank_id and not promoted.staged
    passed, _ = inspect(api, path, GATED)
    assert passed.verdict == inspection_pb2.VERDICT_OK and passed.anomaly.bank_id == staged.bank_id, passed.anomaly


def test_status_says_what_a_flagged_frame_waits_for_at_each_station(stack, api):
    status = call(api, "GetClusterStatus", inspection_pb2.ClusterStatusRequest())
    rows = {g.station: (g.policy, g.flagged) for g in status.stations}
    assert rows[GATED] == ("gate", "decided at takt, explained after")
    assert rows["*"] == ("vlm", "")  # the stack's default policy: the VLM decides, nothing to wait for
    assert status.explaining >= 0
    watched = {(d.station, d.part): d for d in status.drift}  # the good parts the gate passed in this module
    assert watched[(GATED, PART)].frames >= 1 and watched[(GATED, PART)].bank_id.startswith(f"{PART}@v")
