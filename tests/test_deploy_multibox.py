"""Several boxes on one machine: a network namespace per box, veth pairs to a bridge in the test's own hub
namespace, links shaped with tbf. The plant is rendered from an inventory and every role starts from its rendered
configuration; an inspection over the shaped links produces the same tokens as the same plant on loopback."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from edgeinspect.deploy.labrun import EDGEINSPECT, PlantRun, role_env
from edgeinspect.deploy.netns import Lab, unavailable_reason

pytestmark = pytest.mark.netns
REASON = unavailable_reason()
if REASON:
    pytest.skip(f"multi-box tests {REASON}", allow_module_level=True)

TOKEN = "lab-token-1"


def serve_available() -> bool:
    return subprocess.run([EDGEINSPECT, "serve", "--help"], capture_output=True).returncode == 0


@pytest.fixture
def lab_factory(request):
    """Builds labs and plant runs; the finalizer stops every process, then deletes every namespace."""
    made: list[Lab] = []
    runs: list[PlantRun] = []

    def cleanup() -> None:
        for run in runs:
            run.stop()
        for lab in made:
            lab.down()

    request.addfinalizer(cleanup)

    def lab(names: list[str], rate: str = "1gbit") -> Lab:
        made.append(Lab(names, rate))
        return made[-1].up()

    lab.runs = runs
    return lab


def test_shaped_link_carries_about_a_gigabit_and_no_more(lab_factory):
    lab = lab_factory(["a", "b"])
    gbit = lab.throughput_bps("a", "b", 48 << 20)
    lab.shape("100mbit")
    mbit100 = lab.throughput_bps("a", "b", 6 << 20)
    print(f"\nthroughput a->b: 1gbit-shaped {gbit / 1e9:.3f} Gbit/s, 100mbit-shaped {mbit100 / 1e6:.1f} Mbit/s")
    # Upper bounds only: shaping caps the rate whatever the machine's load; the lower side is noise.
    assert 0 < gbit < 1.1e9
    assert 0 < mbit100 < 1.1e8


def test_lab_teardown_kills_what_runs_inside_and_removes_namespaces_and_links():
    lab = Lab(["a", "b"]).up()
    names = list(lab.namespaces)
    # A process left running inside would keep its namespace (and the lab's addresses) alive after the name.
    left = lab.popen("a", ["sleep", "300"])
    lab.down()
    assert left.wait(timeout=10) == -9
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert names and not any(n in listed for n in names)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "br0" not in links and "port0" not in links


def inventory(data_dir: Path, addresses: dict[str, str]) -> dict:
    """Three boxes: gateway + vision on `front`, one decoder stage on each of `s0` and `s1`."""
    box = {"memory_gb": 8, "link_gbps": 1}
    return {
        "plant": {
            "name": "lab",
            "data_dir": str(data_dir),
            "checkpoint": "tiny",
            "weights": "fp32",
            "codec": "fp16",
            "max_new_tokens": 12,
            "kv_budget_mb": 256,
        },
        "boxes": [
            {"name": "front", "address": addresses["front"], "roles": ["gateway", "vision"], **box},
            {"name": "s0", "address": addresses["s0"], "roles": ["stage"], **box},
            {"name": "s1", "address": addresses["s1"], "roles": ["stage"], **box},
        ],
    }


def plant_data(root: Path, checkpoint: Path, onnx: Path) -> Path:
    """A plant's data folder as the deployment guide lays it out: the checkpoint, and the vision export in cache/."""
    data_dir = root / "data"
    for sub in ("checkpoints", "kb", "reports", "cache", "frames"):
        (data_dir / sub).mkdir(parents=True)
    (data_dir / "checkpoints" / "tiny").symlink_to(checkpoint)
    # The rendered vision settings name cache/<checkpoint>-vision.onnx; exported once here, not by both plants'
    # vision nodes on first start at the same time.
    shutil.copy(onnx, data_dir / "cache" / "tiny-vision.onnx")
    return data_dir


def render_plant(tmp: Path, data_dir: Path, addresses: dict[str, str], name: str) -> Path:
    inv = tmp / f"{name}.yaml"
    inv.write_text(yaml.safe_dump(inventory(data_dir, addresses)))
    out = tmp / name
    argv = [EDGEINSPECT, "deploy", "render", "-i", inv, "-o", out, "--checkpoint", data_dir / "checkpoints" / "tiny"]
    argv += ["--ca", tmp / "pki"]  # the plant CA in the test's folder, not in the working directory
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def start_plant(lab: Lab, runs: list, rendered: Path, netns_of: dict[str, str], logs: Path) -> PlantRun:
    run = PlantRun(lab, rendered, role_env([TOKEN]), logs)
    runs.append(run)
    run.start(netns_of)
    return run


def inspect_and_stop(run: PlantRun, rendered: Path, client_box: str, image: Path) -> dict:
    gateway = yaml.safe_load((rendered / "front" / "config" / "gateway.yaml").read_text())
    result = run.inspect(client_box, f"127.0.0.1:{gateway['server']['port']}", image, TOKEN)
    run.stop()
    return result


@pytest.mark.skipif(not serve_available(), reason="`edgeinspect serve` (the roles' servers) is not available yet")
def test_inspection_over_gigabit_boxes_matches_loopback(lab_factory, tiny_checkpoint, tmp_path):
    from edgeinspect.assets import asset_path
    from edgeinspect.models.onnx_export import export_vision_onnx

    image = Path(asset_path("part_scratch.jpg"))
    onnx = export_vision_onnx(tiny_checkpoint, tmp_path / "tiny-vision.onnx")

    # Loopback: the same plant in one namespace, boxes at 127.0.0.x.
    loop = lab_factory(["loop"])
    loop_addresses = {"front": "127.0.0.1", "s0": "127.0.0.2", "s1": "127.0.0.3"}
    loop_rendered = render_plant(
        tmp_path, plant_data(tmp_path / "loop", tiny_checkpoint, onnx), loop_addresses, "loopback"
    )
    # The plant over three boxes, every link shaped to 1 Gbit/s.
    boxes = lab_factory(["front", "s0", "s1"], rate="1gbit")
    addresses = {b: boxes.address(b) for b in boxes.names}
    rendered = render_plant(tmp_path, plant_data(tmp_path / "boxes", tiny_checkpoint, onnx), addresses, "boxes")

    # Both plants start together (separate namespaces, so the same ports); each inspects while the other is idle.
    loop_run = start_plant(
        loop, lab_factory.runs, loop_rendered, dict.fromkeys(loop_addresses, "loop"), tmp_path / "logs-loop"
    )
    boxes_run = start_plant(boxes, lab_factory.runs, rendered, {b: b for b in boxes.names}, tmp_path / "logs-boxes")
    loop_run.wait_healthy(timeout_s=300)
    boxes_run.wait_healthy(timeout_s=300)
    looped = inspect_and_stop(loop_run, loop_rendered, "loop", image)
    shaped = inspect_and_stop(boxes_run, rendered, "front", image)

    stages = sorted((rendered / "s0" / "config").glob("stage-*.yaml")) + sorted(
        (rendered / "s1" / "config").glob("stage-*.yaml")
    )
    assert len(stages) == 2  # one layer range per decoder box
    for name, r in (("loopback", looped), ("1 Gbit/s boxes", shaped)):
        per = f"{r['per_token_s'] * 1e3:.1f}" if r["per_token_s"] is not None else "-"
        print(f"\n{name}: TTFT {r['ttft_s'] * 1e3:.0f} ms, {per} ms/token, {r['tokens']} tokens, {r['verdict']}")
    # The shaped run really went through the decoder boxes' addresses.
    assert [p.split("=", 1)[1].split(":")[0] for p in shaped["partition"]] == [addresses["s0"], addresses["s1"]]
    assert shaped["tokens"] > 0
    assert shaped["token_ids"] == looped["token_ids"]
