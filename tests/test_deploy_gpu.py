"""GPU boxes in the inventory: the planner gives a GPU box the layers its bandwidth earns within its memory, and the
renderer hands the GPU to its vision and stage roles (compose device reservation, or the NVIDIA runtime on a
Jetson; Kubernetes nvidia.com/gpu and the nvidia runtime class) with their device set to cuda."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from edgeinspect.deploy import render
from edgeinspect.deploy.inventory import Inventory, load_inventory
from edgeinspect.deploy.planning import plan_stages
from edgeinspect.models.planner import GpuSpec

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "compose" / "plant.example.yaml"
CAMERAS = {"cell-pi": (REPO / "compose" / "cameras.example.yaml").read_text()}
BIN = Path(sys.executable).parent
K8S_VERSION = "1.33.0"
ORIN_NX = {"memory_gb": 16, "bandwidth_gb_s": 102, "unified": True}
L4 = {"memory_gb": 24, "bandwidth_gb_s": 300}


def with_gpus(inv: Inventory, gpus: dict[str, dict], vision_on: str | None = None) -> Inventory:
    """The inventory with `gpus` fitted by box name; `vision_on`: vision moved from the Hailo box to that box."""
    data = inv.model_dump(mode="json")
    for box in data["boxes"]:
        if box["name"] in gpus:
            box["gpu"] = gpus[box["name"]]
        if vision_on and "vision" in box["roles"]:
            box["roles"].remove("vision")
        if box["name"] == vision_on:
            box["roles"].append("vision")
    return Inventory.model_validate(data)


@pytest.fixture(scope="module")
def gpu_plant() -> Inventory:
    return with_gpus(load_inventory(EXAMPLE), {"jetson-a": ORIN_NX, "line-server": L4}, vision_on="line-server")


@pytest.fixture(scope="module")
def rendered(gpu_plant, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-plant")
    render.write(render.render(gpu_plant, plan_stages(gpu_plant), render.Target.all, CAMERAS), out)
    return out


def services(rendered: Path, box: str) -> dict[str, dict]:
    return yaml.safe_load((rendered / box / "compose.yaml").read_text())["services"]


def settings(rendered: Path, box: str, service: str) -> dict:
    return yaml.safe_load((rendered / box / "config" / f"{service}.yaml").read_text())


def test_a_jetsons_gpu_earns_it_more_layers_than_its_arm_cores():
    plain = load_inventory(EXAMPLE)
    cpu_plan = {p.box.name: p for p in plan_stages(plain)}
    gpu_plan = {p.box.name: p for p in plan_stages(with_gpus(plain, {"jetson-a": ORIN_NX}))}
    cpu_layers = cpu_plan["jetson-a"].layer_end - cpu_plan["jetson-a"].layer_start
    assert gpu_plan["jetson-a"].layer_end - gpu_plan["jetson-a"].layer_start > cpu_layers


def test_a_small_gpu_limits_the_layers_its_box_is_given():
    plain = load_inventory(EXAMPLE)
    # 3 GiB card: less the CUDA context (1 GiB) and the KV budget (1 GiB), about 1 GiB of bf16 layers (~0.1 GB each)
    small = with_gpus(plain, {"line-server": {"memory_gb": 3, "bandwidth_gb_s": 300}})
    placed = {p.box.name: p for p in plan_stages(small)}["line-server"]
    assert placed.weight_bytes <= 1 * 2**30 and placed.layer_end - placed.layer_start < 12


def test_gpu_compose_files_validate_against_the_compose_spec(rendered):
    files = sorted(rendered.glob("*/compose.yaml"))
    done = subprocess.run(
        [BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", *files], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_jetson_stage_gets_the_nvidia_runtime_and_runs_on_cuda(rendered, gpu_plant):
    (stage,) = [s for name, s in services(rendered, "jetson-a").items() if name.startswith("stage")]
    assert stage["runtime"] == "nvidia" and "deploy" not in stage
    assert stage["image"] == gpu_plant.plant.gpu_image
    (name,) = [n for n in services(rendered, "jetson-a") if n.startswith("stage")]
    assert settings(rendered, "jetson-a", name)["device"] == "cuda"


def test_a_discrete_gpu_is_reserved_for_vision_and_the_stage_only(rendered, gpu_plant):
    svcs = services(rendered, "line-server")
    reservation = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    for name, svc in svcs.items():
        on_gpu = name == "vision" or name.startswith("stage")
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        assert devices == ([reservation] if on_gpu else None), name
        assert "runtime" not in svc
        if on_gpu:
            assert svc["image"] == gpu_plant.plant.gpu_image, name
        if on_gpu:
            assert settings(rendered, "line-server", name)["device"] == "cuda"
        elif name in ("gateway", "retrieval"):
            assert "device" not in settings(rendered, "line-server", name)


def test_cpu_boxes_render_without_any_gpu_wiring(rendered):
    for name, svc in services(rendered, "cell-pi").items():
        assert "runtime" not in svc and "deploy" not in svc, name


def test_k8s_gives_gpu_roles_one_nvidia_gpu_and_the_nvidia_runtime_class(rendered):
    docs = []
    for path in sorted((rendered / "k8s").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    gpu_roles = {n for n in deployments if n == "vision" or n.startswith("stage")}
    assert len(gpu_roles) == 3  # vision and the two stages: every stage box has a GPU here
    for name, dep in deployments.items():
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
        pod = dep["spec"]["template"]["spec"]
        limits = pod["containers"][0]["resources"]["limits"]
        if name in gpu_roles:
            assert limits["nvidia.com/gpu"] == "1" and pod["runtimeClassName"] == "nvidia", name
        else:
            assert "nvidia.com/gpu" not in limits and "runtimeClassName" not in pod, name


def test_the_gpu_entry_is_validated():
    with pytest.raises(ValueError, match="bandwidth_gb_s"):
        with_gpus(load_inventory(EXAMPLE), {"jetson-a": {"memory_gb": 16}})
    assert GpuSpec(**ORIN_NX).unified
