"""The anomaly gate in the web console, in Debian's headless Chromium: the report page shows the heatmap over the
frame with the gate's score, and an admin adds a flagged frame to the part's good set (a new bank version)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.services.common.auth import hash_token
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, vision_pb2, vision_pb2_grpc

pytestmark = pytest.mark.e2e
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
ADMIN, READER = "ei_gate-console-admin-token-0000000", "ei_gate-console-read-token-00000000"
PART, STATION = "board", "gated-console"

if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("anomaly-sample")
    write_sample_set(root, parts=[PART], n_train=20, n_test_good=1, per_severity=1)
    return root / PART


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory, sample):
    tokens = [{"name": "ann-admin", "role": "admin", "hash": hash_token(ADMIN)},
              {"name": "viewer", "role": "read", "hash": hash_token(READER)}]  # fmt: skip
    opts = StackOptions(workdir=tmp_path_factory.mktemp("gate-console"), checkpoint=tiny_checkpoint, stages=2,
                        api_token=ADMIN, extra_env={"EDGEINSPECT_API_TOKENS": json.dumps(tokens)}, console_port=0,
                        gate_stations=(STATION,))  # fmt: skip
    with LocalStack(opts) as s:
        frames = [p.read_bytes() for p in sorted((sample / "train" / "good").glob("*.png"))]
        with grpc.insecure_channel(s.address_of("vision")) as channel:
            teach = vision_pb2.TeachRequest(part=PART, frames=frames)
            vision_pb2_grpc.VisionServiceStub(channel).Teach(teach, timeout=300)
        yield s


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _flagged_report(stack, sample) -> inspection_pb2.DefectReport:
    labels = json.loads((sample / "defects.json").read_text())
    name = next(n for n, label in labels.items() if label["severity"] == 3)
    request = inspection_pb2.InspectRequest(image=(sample / name).read_bytes(), station=STATION, part=PART,
                                            max_new_tokens=24)  # fmt: skip
    metadata = [("authorization", f"Bearer {ADMIN}")]
    with grpc.insecure_channel(stack.gateway_address) as channel:
        stub = inspection_pb2_grpc.InspectionServiceStub(channel)
        decision = stub.Inspect(request, metadata=metadata, timeout=300)
        # Decided at takt: the page refreshes itself until the VLM's explanation is there; wait for it first.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            report = stub.GetReport(inspection_pb2.GetReportRequest(report_id=decision.report_id), metadata=metadata)
            if report.explanation != inspection_pb2.EXPLANATION_PENDING:
                return report
            time.sleep(0.3)
    raise AssertionError(f"report {decision.report_id} was not explained within 120 s")


def _login(browser, url: str, token: str):
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    page.goto(f"{url}/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/stations")
    return context, page


def _heatmap_loaded(page) -> int:
    page.wait_for_function(
        "() => { const i = document.querySelector('[data-testid=heatmap]');"
        " return i && i.complete && i.naturalWidth > 0 }",
        timeout=15_000,
    )
    return page.evaluate("document.querySelector('[data-testid=heatmap]').naturalWidth")


def test_report_page_shows_the_heatmap_and_an_admin_adds_the_frame_to_the_good_set(stack, sample, browser, tmp_path):
    report = _flagged_report(stack, sample)
    assert report.anomaly.heatmap_stored and report.verdict != inspection_pb2.VERDICT_OK

    reader, page = _login(browser, stack.console_url, READER)
    page.goto(f"{stack.console_url}/reports/{report.report_id}")
    assert _heatmap_loaded(page) > 0
    assert page.locator("[data-testid=add-to-good-set]").count() == 0  # a read token sees no teach button
    reader.close()

    context, page = _login(browser, stack.console_url, ADMIN)
    page.goto(f"{stack.console_url}/reports/{report.report_id}")
    assert _heatmap_loaded(page) == 256  # the sample frame's width: the heatmap is drawn over the whole frame
    gate = page.text_content("[data-testid=anomaly-gate]")
    assert f"{report.anomaly.score:.4g}" in gate and report.anomaly.bank_id in gate and "the anomaly gate" in gate
    # The one number beside a score is the OK cut (below it OK), not the threshold inside the UNCERTAIN band.
    assert page.text_content("[data-testid=gate-ok-cut]") == f"{report.anomaly.ok_cut:.4g}"
    assert report.anomaly.ok_cut < report.anomaly.threshold
    assert "explained at" in page.text_content("[data-testid=explained]")  # decided at takt, explained after
    page.screenshot(path=str(tmp_path / "report-heatmap.png"), full_page=True)
    assert (tmp_path / "report-heatmap.png").stat().st_size > 0

    page.once("dialog", lambda dialog: dialog.accept())  # the confirmation
    page.click("[data-testid=add-to-good-set]", timeout=240_000)  # a re-teach at 448 px takes a while on 2 cores
    page.wait_for_selector("[data-testid=good-set-added]", timeout=240_000)
    assert f"{PART}@v2" in page.text_content("[data-testid=good-set-added]")
    page.screenshot(path=str(tmp_path / "good-set-added.png"), full_page=True)
    context.close()
