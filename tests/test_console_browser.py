"""The web console in a real browser: Debian's headless Chromium driven by Playwright, against the real embedded
stack (vision, 2 stages, retrieval, gateway, console as `up` starts them). Screenshots land in the test's temp dir."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

pytestmark = pytest.mark.e2e
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
ADMIN, READER = "ei_console-admin-token-for-tests-0123", "ei_console-read-token-for-tests-0123"  # conftest
STATION = "st-browser"

if not Path(CHROMIUM).exists():  # tools/test.sh installs it; without it these tests cannot run at all
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def stack(reviewing_stack):
    assert (reviewing_stack.admin, reviewing_stack.reader) == (ADMIN, READER)
    return reviewing_stack.stack


@pytest.fixture(scope="module")
def console_url(stack):
    """The console LocalStack started beside the gateway, as `edgeinspect up` does."""
    assert stack.console_url
    return stack.console_url


@pytest.fixture(scope="module")
def api(stack):
    channel = grpc.insecure_channel(stack.gateway_address)
    yield inspection_pb2_grpc.InspectionServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("console-screenshots")


def _inspect(api, image: str, token: str = ADMIN, camera: str = "cam-1") -> inspection_pb2.DefectReport:
    request = inspection_pb2.InspectRequest(
        image=asset_path(image).read_bytes(), station=STATION, camera_id=camera, part="HSG-210", max_new_tokens=8
    )
    return api.Inspect(request, metadata=[("authorization", f"Bearer {token}")], timeout=300)


def _login(browser, url: str, token: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{url}/stations")
    assert "/login" in page.url  # not logged in: the login page, not data
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/stations")
    return context, page


def _frame_loaded(page) -> None:
    page.wait_for_function(
        "() => { const i = document.querySelector('[data-testid=frame]');"
        " return i && i.complete && i.naturalWidth > 0 }",
        timeout=15_000,
    )


def test_operator_sees_the_new_report_opens_it_and_overrides_the_verdict(browser, console_url, api, shots):
    context, page = _login(browser, console_url, ADMIN)
    assert "ann-admin" in page.text_content("[data-testid=who]")
    assert page.text_content("[data-testid=cluster]").startswith("Cluster: ")
    report = _inspect(api, "part_dent.jpg")
    card = f'[data-report-id="{report.report_id}"]'
    page.wait_for_selector(card, timeout=30_000)  # arrives by the page's own poll, no reload
    station = page.locator(f'section[data-station="{STATION}"]')
    assert "OK" in station.text_content() and "NG" in station.text_content()
    page.screenshot(path=str(shots / "stations.png"), full_page=True)

    page.click(card)
    page.wait_for_url(f"{console_url}/reports/{report.report_id}")
    _frame_loaded(page)
    model_label = inspection_pb2.Verdict.Name(report.verdict).removeprefix("VERDICT_")
    assert model_label in page.text_content("[data-testid=model-verdict]")
    assert report.model.checkpoint_fingerprint in page.content()
    assert report.references and report.references[0].text  # the sample KB's specs were cited
    page.click("a[href$='/spec/0']")
    assert report.references[0].text.strip()[:40] in page.text_content("[data-testid=spec-text]")
    page.go_back()
    _frame_loaded(page)
    override = "ok" if report.verdict == inspection_pb2.VERDICT_DEFECT else "defect"
    page.select_option("[data-testid=override-verdict]", override)
    if override == "defect":
        page.fill("[data-testid=override-classes]", "dent")
    page.fill("[data-testid=override-comment]", "dent on the rim, visible at 3 o'clock")
    page.click("[data-testid=override]")
    page.wait_for_selector("[data-testid=review-verdict]")
    assert model_label in page.text_content("[data-testid=model-verdict]")  # the model's verdict still shown
    assert override.upper() in page.text_content("[data-testid=review-verdict]")
    reviewer = page.text_content("[data-testid=reviewer]")
    assert "ann-admin" in reviewer and "admin" in reviewer and "overrides the model" in reviewer
    _frame_loaded(page)
    page.screenshot(path=str(shots / "report.png"), full_page=True)
    stored = api.GetReport(inspection_pb2.GetReportRequest(report_id=report.report_id),
                           metadata=[("authorization", f"Bearer {ADMIN}")], timeout=30)  # fmt: skip
    assert stored.verdict == report.verdict  # the model's report is not rewritten
    assert stored.review.reviewer == "ann-admin" and not stored.review.agrees
    context.close()
    print(f"screenshots in {shots}")


def test_csv_export_has_the_rows_list_reports_gives(browser, console_url, api):
    _inspect(api, "part_ok.jpg", camera="cam-2")
    context, page = _login(browser, console_url, ADMIN)
    page.goto(f"{console_url}/reports?station={STATION}")
    with page.expect_download() as download:
        page.click("[data-testid=export-csv]")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    listed = api.ListReports(inspection_pb2.ListReportsRequest(station=STATION, page_size=500),
                             metadata=[("authorization", f"Bearer {ADMIN}")], timeout=30).reports  # fmt: skip
    assert len(rows) == len(listed) >= 2
    for row, r in zip(rows, listed, strict=True):
        assert row["report_id"] == r.report_id
        assert row["verdict"] == inspection_pb2.Verdict.Name(r.verdict).removeprefix("VERDICT_")
        assert row["camera_id"] == r.camera_id and row["station"] == STATION
        assert row["reviewer"] == (r.review.reviewer if r.HasField("review") else "")
    context.close()


def test_read_only_token_sees_no_review_buttons_and_a_forged_review_is_refused(browser, console_url, api):
    report = _inspect(api, "part_missing_hole.jpg")
    context, page = _login(browser, console_url, READER)
    page.goto(f"{console_url}/reports/{report.report_id}")
    _frame_loaded(page)
    assert page.locator("[data-testid=review-forms]").count() == 0
    assert page.locator("form[action$='/review']").count() == 0
    # A hand-made POST with this session's cookie: the console refuses it, and so would the gateway.
    forged = context.request.post(f"{console_url}/reports/{report.report_id}/review",
                                  form={"verdict": "ok", "csrf": "guessed"})  # fmt: skip
    assert forged.status == 403
    with pytest.raises(grpc.RpcError) as err:
        api.ReviewReport(inspection_pb2.ReviewReportRequest(report_id=report.report_id, verdict=1),
                         metadata=[("authorization", f"Bearer {READER}")], timeout=30)  # fmt: skip
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stored = api.GetReport(inspection_pb2.GetReportRequest(report_id=report.report_id),
                           metadata=[("authorization", f"Bearer {READER}")], timeout=30)  # fmt: skip
    assert not stored.HasField("review")
    context.close()
    bad = browser.new_page()
    bad.goto(f"{console_url}/login")
    bad.fill("input[name=token]", "ei_not-a-token")
    bad.click("button[type=submit]")
    assert "not accepted" in bad.text_content("[role=alert]")
    bad.close()


def test_a_frame_pruned_by_retention_says_it_expired_and_the_report_stays(browser, console_url, api, shots):
    first = _inspect(api, "part_scratch.jpg")
    _inspect(api, "part_ok.jpg")
    last = _inspect(api, "conveyor_empty.jpg")  # three distinct frames > the budget: the oldest goes
    context, page = _login(browser, console_url, READER)
    page.goto(f"{console_url}/reports/{first.report_id}")
    assert "expired" in page.text_content("[data-testid=frame-expired]")
    assert first.report_id in page.content()
    page.goto(f"{console_url}/reports/{last.report_id}")
    _frame_loaded(page)
    context.close()


def test_defect_boxes_are_drawn_over_the_frame(browser, console_url, reviewing_stack, shots):
    from edgeinspect.services.gateway.reports.store import ReportStore
    from edgeinspect.services.gateway.settings import FrameSettings

    # A report whose model gave coordinates, stored by a second writer on the gateway's own database.
    db = reviewing_stack.stack.opts.workdir / "reports.sqlite"
    with ReportStore(db, frames=FrameSettings(max_bytes=reviewing_stack.frame_budget)) as store:
        report_id, _ = store.claim("", "boxes")
        r = inspection_pb2.DefectReport(
            report_id=report_id, station=STATION, camera_id="cam-3", part="HSG-210",
            verdict=inspection_pb2.VERDICT_DEFECT, description="dent near the bore <b id=injected>x</b>",
        )  # fmt: skip
        d = r.defects.add(defect_class="dent", severity="major", location="right of the bore", evidence="shadow")
        d.box.x, d.box.y, d.box.width, d.box.height = 0.56, 0.52, 0.14, 0.16
        store.complete(r, image=asset_path("part_dent.jpg").read_bytes())
    context, page = _login(browser, console_url, READER)
    page.goto(f"{console_url}/reports/{report_id}")
    _frame_loaded(page)
    box = page.locator(".defect-box")
    assert box.count() == 1 and "dent (major)" in box.text_content()
    # Model text is text: markup in it is shown, never run or rendered.
    assert page.locator("#injected").count() == 0 and "<b id=injected>x</b>" in page.text_content("main")
    frame, drawn = page.locator("[data-testid=frame]").bounding_box(), box.bounding_box()
    assert abs((drawn["x"] - frame["x"]) / frame["width"] - 0.56) < 0.01
    assert abs(drawn["width"] / frame["width"] - 0.14) < 0.01
    page.screenshot(path=str(shots / "report-boxes.png"), full_page=True)
    context.close()


def test_a_quiet_station_still_shows_beside_busy_ones(browser, console_url, reviewing_stack):
    from edgeinspect.services.gateway.reports.store import ReportStore

    # One report at a quiet station, then more reports elsewhere than the stations page's latest-reports page.
    with ReportStore(reviewing_stack.stack.opts.workdir / "reports.sqlite") as store:
        for i in range(1 + 210):
            report_id, _ = store.claim("", "quiet")
            station = "st-quiet" if i == 0 else "st-busy"
            store.complete(inspection_pb2.DefectReport(report_id=report_id, station=station, verdict=1))
            if i == 0:
                quiet_id = report_id
    context, page = _login(browser, console_url, READER)
    quiet = page.locator('section[data-station="st-quiet"]')
    assert quiet.count() == 1 and quiet.locator(f'[data-report-id="{quiet_id}"]').count() == 1
    assert "OK 1" in quiet.text_content()
    context.close()
