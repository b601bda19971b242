"""Metrics as a plant sees them: a real Prometheus (Debian's) scrapes every role of the embedded stack, every
metric passes `promtool check metrics`, and every PromQL expression of the shipped Grafana dashboard returns data
after a few inspections."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from edgeinspect.assets import asset_path
from edgeinspect.deploy import dashboard
from edgeinspect.services.client import InspectionClient
from edgeinspect.stack.launcher import free_ports

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus")
REPO = Path(__file__).resolve().parents[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def query(base: str, expr: str) -> list[dict]:
    reply = json.loads(get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    assert reply["status"] == "success", (expr, reply)
    return reply["data"]["result"]


@pytest.fixture(scope="module")
def ingest(embedded_stack, tmp_path_factory):
    """An `edgeinspect ingest` process with one folder camera (trigger only: it reads frames, sends none); yields
    its metrics address."""
    work = tmp_path_factory.mktemp("ingest")
    (work / "cam").mkdir()
    (work / "cam" / "part.jpg").write_bytes(asset_path("part_ok.jpg").read_bytes())
    (port,) = free_ports(1, "127.0.0.1")
    camera = {"id": "cam-obs", "station": "obs-1", "part": "HSG-2040", "source": str(work / "cam"), "loop": True}
    cfg = {
        "cameras": [{**camera, "folder_fps": 5, "sampling": {"trigger_only": True}}],
        "gateway": embedded_stack.gateway_address,
        "api_token": embedded_stack.api_token,
        "frames_dir": str(work / "frames"),
        "server": {"metrics_port": port},
    }
    (work / "ingest.yaml").write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, "-m", "edgeinspect.services.ingest", "--config", str(work / "ingest.yaml")]
    proc = subprocess.Popen(argv, stdout=(work / "ingest.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def prometheus(embedded_stack, ingest, tmp_path_factory):
    """Prometheus scraping every role of the stack and an ingest box once a second (the dashboard's config with
    other targets)."""
    stack = embedded_stack
    targets = {r.name: stack.metrics_url(r.name).removeprefix("http://").removesuffix("/metrics") for r in stack.roles}
    targets["ingest"] = ingest
    work = tmp_path_factory.mktemp("prometheus")
    (work / "prometheus.yml").write_text(yaml.safe_dump(dashboard.prometheus_config(targets, scrape_interval="1s")))
    (port,) = free_ports(1, "127.0.0.1")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("wb"),
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-2000:]
            try:
                active = json.loads(get(f"{base}/api/v1/targets"))["data"]["activeTargets"]
                if len(active) == len(targets) and all(t["health"] == "up" for t in active):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not scrape every role within 60 s"
            time.sleep(0.3)
        yield base
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def inspected(embedded_stack, prometheus) -> None:
    """Two waves of inspections while Prometheus scrapes, so every counter has grown between scrapes (a series'
    first sample counts no increase)."""
    image = asset_path("part_ok.jpg").read_bytes()
    with InspectionClient(embedded_stack.gateway_address, embedded_stack.api_token) as client:
        for _wave in range(2):
            for station in ("press-7", "line-2/station-1"):
                client.inspect(image, station=station, part="HSG-2040", max_new_tokens=6)
            time.sleep(2.5)


def test_every_role_is_scraped_and_its_metrics_pass_promtool(embedded_stack, prometheus):
    promtool = shutil.which("promtool")
    assert promtool, "Debian's prometheus ships promtool"
    for role in embedded_stack.roles:
        text = get(embedded_stack.metrics_url(role.name))
        assert "_created" not in text, role.name
        assert "edgeinspect_build_info{" in text, role.name
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (role.name, done.stdout + done.stderr)
    up = query(prometheus, "up")
    assert sorted(s["metric"]["component"] for s in up) == sorted([r.name for r in embedded_stack.roles] + ["ingest"])
    assert all(s["value"][1] == "1" for s in up)


def test_every_dashboard_query_returns_data_after_a_few_inspections(embedded_stack, prometheus, inspected):
    empty = []
    for expr in dashboard.expressions():
        if not query(prometheus, expr.replace("$__rate_interval", "1m")):
            empty.append(expr)
    assert empty == [], f"dashboard queries without data: {empty}"
    # the labels are the conventional ones: short method names, verdicts without their enum prefix
    verdicts = query(prometheus, "sum by (station, verdict) (edgeinspect_inspections_total)")
    assert {s["metric"]["station"] for s in verdicts} >= {"press-7", "line-2/station-1"}
    assert not any(s["metric"]["verdict"].startswith("VERDICT_") for s in verdicts)
    methods = {s["metric"]["method"] for s in query(prometheus, "edgeinspect_rpc_requests_total")}
    assert "Inspect" in methods and not any("/" in m for m in methods)
    rate = query(prometheus, dashboard.expressions()[0].replace("$__rate_interval", "1m"))
    assert any(float(s["value"][1]) > 0 for s in rate)
    steps = query(prometheus, "sum by (stage) (edgeinspect_stage_step_seconds_count)")
    assert len(steps) == 2  # one series per decoder stage, named by its layer range
    kv = query(prometheus, 'edgeinspect_kv_bytes{role="stage"}')
    assert sorted(s["metric"]["stage"] for s in kv) == sorted(s["metric"]["stage"] for s in steps)  # same names


def test_the_shipped_dashboard_is_the_one_the_renderer_writes():
    shipped = REPO / "compose" / "example" / "all-in-one" / dashboard.FOLDER / "grafana" / "dashboards"
    assert json.loads((shipped / "edgeinspect.json").read_text()) == dashboard.dashboard()
    assert all(t["datasource"]["uid"] == dashboard.DATASOURCE_UID for p in dashboard.dashboard()["panels"]
               for t in p["targets"])  # fmt: skip


def test_every_log_line_of_every_role_is_json_and_reports_carry_their_id_and_verdict(embedded_stack, inspected):
    stored = []
    for role in embedded_stack.roles:
        for n, line in enumerate(role.log_path.read_text().splitlines()):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                pytest.fail(f"{role.name} log line {n + 1} is not JSON: {line[:200]!r}")
            assert {"event", "level", "role", "timestamp"} <= record.keys(), (role.name, record)
            if role.name == "gateway" and record["event"].startswith("report ") and "stored" in record["event"]:
                stored.append(record)
    assert stored and all(r["report_id"] and r["verdict"] and r["request_id"] for r in stored)
