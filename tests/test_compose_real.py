"""The rendered plant runs on a real Docker engine: `deploy render` for a 3-box inventory, the image built once
from compose/Dockerfile (the stand-in base, the host-built wheelhouse), the all-in-one compose file brought up with
Debian's docker-compose 1.29, an inspection through the published gateway port, a killed role brought back by its
restart policy with no report lost, a part taught through the published API (reviewed reports, TeachFromReports)
and then decided by the anomaly gate at the station the inventory gates, `down` + `up` with reports, frames, the KB
and the bank intact; then every box's own compose project on one engine, each publishing on its box address and
reaching its peers there, a bank taught through the gateway held by both vision boxes (each with its own folder).

Slow (minutes: the image, model loading in every container); run by hand before a change to the deploy path lands:
    sudo tools/docker_engine.sh && .venv/bin/pytest -m docker tests/test_compose_real.py
EDGEINSPECT_COMPOSE_BENCH=bench/results/compose_up.json also records the image size, build time and the time from
`compose up` to the first report there.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from docker_testing import (
    BASE_IMAGE,
    Built,
    Project,
    build_image,
    docker,
    drop_loopback_addresses,
    engine_unavailable_reason,
    loopback_addresses,
)

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[1]
TAG = "edgeinspect:compose-test"
UID = 10001  # the image's user (compose/DEPLOY.md section 5: chown the box folder to it)
HEALTHY_WITHIN_S = 420.0
PART = "board"  # drawn by `edgeinspect anomaly sample`: the gate's accuracy is judged elsewhere, its wiring here
GATED = "press-7"  # the inventory's `anomaly` gates this station; every other one gets VLM reports
TEACH_FRAMES = 8
BANKS_WITHIN_S = 60.0  # the gateway gives a vision replica behind the store's newest bank every second


def free_port() -> int:
    """A port free on every interface (the gateway's public port is published on all of them)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def cli(*args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "edgeinspect.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)  # fmt: skip
    if check and done.returncode != 0:
        raise RuntimeError(f"edgeinspect {' '.join(args[:3])}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


@pytest.fixture(scope="module")
def engine() -> None:
    reason = engine_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def image(engine) -> Built:
    """Built once per run; EDGEINSPECT_COMPOSE_REUSE_IMAGE=1 takes the tag as it is (a renderer-only change)."""
    if os.environ.get("EDGEINSPECT_COMPOSE_REUSE_IMAGE") == "1" and docker("image", "inspect", TAG, check=False).stdout:
        info = json.loads(docker("image", "inspect", TAG).stdout)[0]
        return Built(TAG, float("nan"), info["Size"], len(info["RootFS"]["Layers"]))
    return build_image(TAG, sys.executable)


def inventory(data_dir: Path, gateway_port: int, console_port: int, subnet: int) -> dict:
    """Four boxes as a line has them: two camera boxes' vision, a decoder box, the line server."""
    box = {"memory_gb": 6, "cpus": 2, "speed": 1.0}
    return {
        "plant": {
            "name": "compose-test",
            "image": TAG,
            "data_dir": str(data_dir),
            "checkpoint": "tiny",
            "weights": "fp32",
            "codec": "fp16",
            "max_new_tokens": 24,
            "kv_budget_mb": 64,
            "ports": {"gateway": gateway_port, "console": console_port},
            "anomaly": {"default": {"policy": "vlm"}, "stations": {GATED: {"policy": "gate"}}},
        },
        "boxes": [
            {"name": "cell", "address": f"10.213.{subnet}.11", "roles": ["vision"], **box},
            {"name": "cell2", "address": f"10.213.{subnet}.13", "roles": ["vision"], **box},
            {"name": "edge", "address": f"10.213.{subnet}.12", "roles": ["stage"], **box},
            {"name": "line", "address": f"10.213.{subnet}.10", "roles": ["gateway", "retrieval", "stage"], **box},
        ],
    }


def chown_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, UID, UID, follow_symlinks=False)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """`edgeinspect anomaly sample`'s drawn part: train/good frames to teach, test/ frames with defects.json."""
    from edgeinspect.models.anomaly.sample import write_sample_set

    root = tmp_path_factory.mktemp("anomaly-sample")
    write_sample_set(root, parts=[PART])
    return root / PART


@pytest.fixture(scope="module")
def plant(image, tiny_checkpoint, sample_kb, tmp_path_factory):
    """The rendered plant (`deploy render` as DEPLOY.md runs it, its admin token included), the data folders set up
    as sections 1 and 5 say; every project of the test torn down at the end (containers, networks, volumes)."""
    root = tmp_path_factory.mktemp("compose-plant")
    root.chmod(0o755)
    data = root / "data"
    shutil.copytree(tiny_checkpoint, data / "checkpoints" / "tiny")
    shutil.copytree(sample_kb, data / "kb")
    for name in ("reports", "cache", "frames", "banks"):
        (data / name).mkdir(parents=True)
    chown_tree(data)  # DEPLOY.md section 1: the image's user reads the checkpoint (saved 0600) and writes the rest
    subnet = random.randint(1, 250)
    inv = inventory(data, free_port(), free_port(), subnet)
    (root / "plant.yaml").write_text(yaml.safe_dump(inv))
    out = root / "plant"
    cli("deploy", "render", "-i", str(root / "plant.yaml"), "-o", str(out), "--target", "compose",
        "--checkpoint", str(data / "checkpoints" / "tiny"), "--ca", str(root / "pki"))  # fmt: skip
    for folder in [p.parent for p in out.glob("*/compose.yaml")]:  # the token files `render` wrote, as section 5
        chown_tree(folder / "config")
        chown_tree(folder / "secrets")
    projects: list[Project] = []
    addresses = [b["address"] for b in inv["boxes"]]
    loopback_addresses(addresses)
    token = (out / "secrets" / "admin_token").read_text().strip()
    ctx = {"root": root, "out": out, "data": data, "inv": inv, "token": token, "projects": projects, "figures": {}}
    try:
        yield ctx
    finally:
        for p in projects:
            p.down(volumes=True)
        drop_loopback_addresses(addresses)
        _record(ctx["figures"], image)


def _record(figures: dict, image: Built) -> None:
    path = os.environ.get("EDGEINSPECT_COMPOSE_BENCH")
    if not path or "first_report_s" not in figures:
        return
    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    out = {
        "command": "sudo tools/docker_engine.sh && EDGEINSPECT_COMPOSE_BENCH=bench/results/compose_up.json "
        ".venv/bin/pytest -m docker tests/test_compose_real.py",
        "image": {
            "tag": image.tag,
            "base": BASE_IMAGE,
            "size_mb": round(image.size_bytes / 1e6),
            "layers": image.layers,
            "build_s": round(image.build_s, 1),
        },  # fmt: skip
        **figures,
        "engine": docker("version", "--format", "{{.Server.Version}}").stdout.strip(),
        "storage_driver": docker("info", "--format", "{{.Driver}}").stdout.strip(),
        "compose": subprocess.run(
            ["docker-compose", "version", "--short"], capture_output=True, text=True
        ).stdout.strip(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_flags": [f for f in flags if f.startswith(("avx", "amx", "sse4", "fma"))],
    }
    Path(path).write_text(json.dumps(out, indent=2) + "\n")


def gateway_of(ctx) -> str:
    return f"127.0.0.1:{ctx['inv']['plant']['ports']['gateway']}"


def _auth(ctx) -> list[str]:
    """The CLI's gateway, token and CA options for this plant."""
    return ["--gateway", gateway_of(ctx), "--token", ctx["token"], "--ca", str(ctx["root"] / "pki" / "ca.crt")]


def client(ctx):
    from edgeinspect.services.client import InspectionClient

    return InspectionClient(gateway_of(ctx), ctx["token"], timeout_s=120, ca=ctx["root"] / "pki" / "ca.crt")


def part_jpeg() -> bytes:
    from edgeinspect.assets import asset_path

    return asset_path("part_scratch.jpg").read_bytes()


def first_report(ctx, timeout_s: float) -> str:
    """Runs `deploy smoke` (DEPLOY.md section 7) until the gateway returns a stored report; its id."""
    from edgeinspect.assets import asset_path

    deadline = time.monotonic() + timeout_s
    while True:
        done = cli("deploy", "smoke", "--image", str(asset_path("part_scratch.jpg")), *_auth(ctx), "--json",
                   check=False)  # fmt: skip
        if done.returncode == 0:
            return json.loads(done.stdout)["report_id"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no report within {timeout_s:.0f} s: {done.stdout[-1500:]}{done.stderr[-1500:]}")
        time.sleep(3)


def status(ctx) -> dict:
    done = cli("status", *_auth(ctx), "--json", check=False)
    return {"exit": done.returncode, **(json.loads(done.stdout) if done.stdout.strip().startswith("{") else {})}


def stored_ids(ctx) -> set[str]:
    from edgeinspect.v1 import inspection_pb2

    with client(ctx) as c:
        listed = c.call("ListReports", inspection_pb2.ListReportsRequest(page_size=500), timeout_s=30)
    return {r.report_id for r in listed.reports}


def test_all_in_one_runs_survives_a_killed_role_gates_a_taught_part_and_keeps_its_data_across_down_and_up(
    plant, sample
):
    out = plant["out"]
    aio = Project(f"eitest-aio-{os.getpid()}", out / "all-in-one" / "compose.yaml")
    plant["projects"].append(aio)
    services = aio.services()
    started = time.monotonic()
    aio.up()
    first = first_report(plant, HEALTHY_WITHIN_S)
    plant["figures"]["first_report_s"] = round(time.monotonic() - started, 1)
    aio.wait_healthy(services, HEALTHY_WITHIN_S)
    plant["figures"]["all_healthy_s"] = round(time.monotonic() - started, 1)

    # The engine's healthchecks and the gateway's status say the same: every role serving.
    st = status(plant)
    assert st["exit"] == 0, st
    _assert_status_matches_health(st, [aio])
    _assert_console_signs_in_with_api_tokens_only(plant)

    # A crashed role (the gateway: it holds the reports) comes back by its restart policy with every report. The
    # crash is a SIGKILL of the container's process: `docker kill` is a manual stop to the engine (no restart).
    ids = {first, *(_inspect(plant) for _ in range(2))}
    before = aio.state("gateway")
    os.kill(before["Pid"], signal.SIGKILL)
    _wait_restarted(aio, "gateway", before)
    assert first_report(plant, HEALTHY_WITHIN_S)
    assert ids <= stored_ids(plant)

    # A part taught through the public API gates the station the inventory gates: a good frame passes on the gate
    # alone, a defective one is flagged at takt.
    taught = _teach(plant, sorted((sample / "train" / "good").glob("*.png"))[:TEACH_FRAMES])
    assert taught.part == PART and taught.version == 1 and taught.frames > 0 and not taught.staged
    _wait_banks(plant, taught.bank_id)
    _assert_gate_decides(plant, sample, taught.bank_id)

    # down + up: new containers, the same reports, frames and knowledge base (they live in the box's folders).
    frames = sorted(p.name for p in (plant["data"] / "reports" / "frames").rglob("*") if p.is_file())
    assert frames, "the gateway stored no frame"
    aio.down()
    aio.up()
    aio.wait_healthy(services, HEALTHY_WITHIN_S)
    assert ids <= stored_ids(plant)
    assert frames == sorted(p.name for p in (plant["data"] / "reports" / "frames").rglob("*") if p.is_file())
    with client(plant) as c:
        report = c.get(first)
    assert report.report_id == first
    assert _inspect(plant)
    _wait_banks(plant, taught.bank_id)  # the banks folder and the store outlived every container
    _assert_gate_decides(plant, sample, taught.bank_id)
    aio.down(volumes=True)


def test_every_box_runs_its_own_compose_project_reaches_its_peers_and_gives_every_vision_box_its_banks(plant, sample):
    out = plant["out"]
    boxes = [b["name"] for b in plant["inv"]["boxes"]]
    projects = {b: Project(f"eitest-{b}-{os.getpid()}", out / b / "compose.yaml") for b in boxes}
    for p in plant["projects"]:  # the all-in-one's, where its test stopped early: they hold the published ports
        p.down(volumes=True)
    plant["projects"].extend(projects.values())
    _own_banks_folder(projects["cell2"], plant["data"] / "banks-cell2")
    started = time.monotonic()
    # The gateway's box last (DEPLOY.md, Adding a box): `up` returns once its local peers are healthy, and its
    # gateway checks the peers on other boxes at handshake.
    for b in ("cell", "cell2", "edge", "line"):
        projects[b].up()
    report = first_report(plant, HEALTHY_WITHIN_S)
    plant["figures"]["per_box_first_report_s"] = round(time.monotonic() - started, 1)
    for p in projects.values():
        p.wait_healthy(p.services(), HEALTHY_WITHIN_S)
    _wait_banks(plant)  # cell2's empty folder is given the bank the store holds from the all-in-one's teach
    st = status(plant)
    assert st["exit"] == 0, st
    _assert_status_matches_health(st, list(projects.values()))
    assert report in stored_ids(plant)

    # A version taught through the gateway on the line box reaches both camera boxes' own banks folders.
    taught = _teach(plant, sorted((sample / "train" / "good").glob("*.png"))[TEACH_FRAMES : 2 * TEACH_FRAMES])
    _wait_banks(plant, taught.bank_id)
    assert (plant["data"] / "banks-cell2" / PART / f"v{taught.version:04d}").is_dir()  # on cell2's own disk
    _assert_gate_decides(plant, sample, taught.bank_id)
    for p in projects.values():
        p.down(volumes=True)


def _own_banks_folder(p: Project, folder: Path) -> None:
    """The box's banks folder on a disk of its own (every box here shares the host's): the rendered bind's source
    moved, its target (the path the vision settings name) kept."""
    folder.mkdir()
    os.chown(folder, UID, UID)
    doc = yaml.safe_load(p.file.read_text())
    for svc in doc["services"].values():
        for vol in svc.get("volumes", []):
            if isinstance(vol, dict) and vol.get("target", "").endswith("/banks"):
                vol["source"] = str(folder)
    p.file.write_text(yaml.safe_dump(doc, sort_keys=False))


def _teach(ctx, frames: list[Path]):
    """Through the public API as a plant engineer does it: each frame inspected at the gated station, reviewed OK,
    then TeachFromReports of those reports."""
    from edgeinspect.v1 import inspection_pb2

    with client(ctx) as c:
        for frame in frames:
            report = c.inspect(frame.read_bytes(), station=GATED, part=PART, max_new_tokens=4)
            c.call("ReviewReport", inspection_pb2.ReviewReportRequest(report_id=report.report_id,
                                                                      verdict=inspection_pb2.VERDICT_OK))  # fmt: skip
        request = inspection_pb2.TeachFromReportsRequest(station=GATED, part=PART, last_n=len(frames))
        return c.call("TeachFromReports", request, timeout_s=300)


def _wait_banks(ctx, bank_id: str | None = None) -> None:
    """Until the gateway sees every vision replica healthy and holding `bank_id` as the part's bank (None: the same
    one, whichever it is; none before a teach)."""
    from edgeinspect.v1 import inspection_pb2

    deadline = time.monotonic() + BANKS_WITHIN_S
    while True:
        with client(ctx) as c:
            st = c.call("GetClusterStatus", inspection_pb2.ClusterStatusRequest(), timeout_s=30)
        held = {r.address: (r.state, r.banks.get(PART, "")) for r in st.vision_replicas}
        states, banks = {s for s, _ in held.values()}, {b for _, b in held.values()}
        if len(held) == 2 and states == {"healthy"} and len(banks) == 1 and bank_id in (None, *banks):
            return
        assert time.monotonic() < deadline, f"not every vision replica holds {bank_id} in {BANKS_WITHIN_S}s: {held}"
        time.sleep(1)


def _assert_gate_decides(ctx, sample: Path, bank_id: str) -> None:
    """A taught frame passes on the gate alone; the sample's most severe defect is flagged at takt."""
    from edgeinspect.v1 import inspection_pb2

    defects = json.loads((sample / "defects.json").read_text())
    worst = max(defects, key=lambda name: defects[name]["severity"])
    with client(ctx) as c:
        good = c.inspect((sample / "train" / "good" / "000.png").read_bytes(), station=GATED, part=PART)
        bad = c.inspect((sample / worst).read_bytes(), station=GATED, part=PART)
    gate = inspection_pb2.DECIDED_BY_GATE
    assert good.verdict == inspection_pb2.VERDICT_OK, good.verdict_reason
    assert (good.anomaly.decided_by, good.anomaly.policy, good.anomaly.bank_id) == (gate, "gate", bank_id)
    assert not good.generated_token_ids  # no decoder step
    assert bad.verdict == inspection_pb2.VERDICT_DEFECT, bad.verdict_reason
    assert (bad.anomaly.decided_by, bad.anomaly.bank_id) == (gate, bank_id)
    assert bad.anomaly.score > bad.anomaly.threshold and bad.anomaly.regions


def _assert_console_signs_in_with_api_tokens_only(ctx) -> None:
    """The rendered console answers on its published port and admits the plant's admin token, not another."""
    import urllib.error
    import urllib.parse
    import urllib.request

    base = f"http://127.0.0.1:{ctx['inv']['plant']['ports']['console']}"
    assert urllib.request.urlopen(f"{base}/healthz", timeout=10).status == 200

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(Stay)
    for token, want in ((ctx["token"], 303), ("ei_not-a-token-of-this-plant", 401)):
        form = urllib.parse.urlencode({"token": token, "next": "/stations"}).encode()
        try:
            code = opener.open(f"{base}/login", data=form, timeout=30).status
        except urllib.error.HTTPError as err:
            code = err.code
        assert code == want, (token[:6], code)


def _inspect(ctx) -> str:
    with client(ctx) as c:
        return c.inspect(part_jpeg(), station="press-7", part="bracket").report_id


def _wait_restarted(p: Project, service: str, before: dict, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = p.state(service)
        if now["Running"] and now["StartedAt"] != before["StartedAt"]:
            return
        time.sleep(1)
    raise TimeoutError(f"{service} was not restarted by its restart policy: {p.state(service)}")


def _health_by_address(projects: list[Project]) -> list[tuple[set[str], str]]:
    """(the addresses a replica is reached at: service:port and, where published, box address:port; the engine's
    health verdict) of every service whose healthcheck asks a role's port (two vision boxes share one port)."""
    out = []
    for p in projects:
        doc = yaml.safe_load(p.file.read_text())
        for name, svc in doc["services"].items():
            test = svc.get("healthcheck", {}).get("test", [])
            if "profiles" not in svc and test[1] == "edgeinspect-healthcheck":
                port = test[-1].rsplit(":", 1)[1]
                hosts = [str(ports).rsplit(":", 2)[0] for ports in svc.get("ports", []) if str(ports).count(":") == 2]
                out.append(({f"{h}:{port}" for h in [name, *hosts]}, p.health(name)))
    return out


def _assert_status_matches_health(st: dict, projects: list[Project]) -> None:
    """Each replica the gateway's status lists is healthy exactly when the engine calls its container healthy."""
    health = _health_by_address(projects)
    replicas = [*st["stages"], *st["vision_replicas"], *st["retrieval_replicas"]]
    assert len(replicas) == len(health) - 1, (replicas, health)  # every role but the gateway itself
    for r in replicas:
        (verdict,) = [h for addresses, h in health if r["address"] in addresses]
        assert (r["state"] == "healthy") == (verdict == "healthy"), (r, health)
    assert all(h == "healthy" for _, h in health), health
