"""Rendered deployment files run as they are: limits and requests that fit the boxes, log rotation, each role's
own healthcheck, camera and Hailo devices, referenced files copied, replicas wired, and (with Debian's kubectl)
a kustomize build whose ConfigMap name follows its content."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from edgeinspect import certs
from edgeinspect.deploy import render
from edgeinspect.deploy.inventory import GIB, OS_RESERVE_GIB, Inventory
from edgeinspect.deploy.planning import plan_stages
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.stage.settings import StageSettings

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "compose" / "plant.example.yaml"
CAMERAS = REPO / "compose" / "cameras.example.yaml"
K8S_VERSION = "1.33.0"
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (Debian: kubernetes-client)")


def inventory(edit=None) -> Inventory:
    data = yaml.safe_load(EXAMPLE.read_text())
    if edit is not None:
        edit(data)
    return Inventory.model_validate(data)


def render_to(inv: Inventory, out: Path, target: render.Target = render.Target.all) -> render.Rendering:
    text = CAMERAS.read_text()
    assets = {"cell-pi": render.referenced_files(text, CAMERAS.parent)}
    rendering = render.render(inv, plan_stages(inv), target, {"cell-pi": text}, assets)
    render.write(rendering, out)
    return rendering


@pytest.fixture(scope="module")
def plant(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plant")
    render_to(inventory(), out)
    return out


def compose_services(root: Path, profiles: bool = False) -> dict[str, dict]:
    """{folder/service: service} of the roles (`profiles`: the optional Prometheus and Grafana as well)."""
    out = {}
    for path in sorted(root.glob("*/compose.yaml")):
        for name, svc in yaml.safe_load(path.read_text())["services"].items():
            if profiles or "profiles" not in svc:
                out[f"{path.parent.name}/{name}"] = svc
    return out


def mib(quantity: str) -> int:
    """MiB of a Kubernetes quantity (`Mi`) or a compose byte value (`m`, what Compose v1 reads)."""
    assert quantity.endswith(("Mi", "m")), quantity
    return int(quantity.removesuffix("Mi").removesuffix("m"))


def test_every_compose_service_has_memory_and_cpu_limits_and_rotated_logs(plant):
    services = compose_services(plant)
    assert len(services) == 14  # 6 per-box services + the all-in-one's 6, a console beside each gateway
    for name, svc in services.items():
        assert 0 < mib(svc["mem_reservation"]) <= mib(svc["mem_limit"]), name
        assert 0 < svc["cpus"] <= 8 and svc["cpu_shares"] > 0, name
    everything = compose_services(plant, profiles=True)
    assert len(everything) == 18  # + Prometheus and Grafana beside the gateway and in the all-in-one
    for name, svc in everything.items():
        assert mib(svc["mem_limit"]) > 0 and svc["cpus"] > 0, name
        assert svc["logging"] == {"driver": "json-file", "options": {"max-size": "10m", "max-file": "3"}}, name
    # a stage may use what its box leaves it; on the 16 GiB Jetson that is below the box
    assert mib(services["jetson-a/stage-0"]["mem_limit"]) < 16 * 1024
    box_limits = sum(mib(s["mem_reservation"]) for n, s in services.items() if n.startswith("line-server/"))
    assert box_limits < (32 - OS_RESERVE_GIB) * 1024


def test_every_role_checks_its_own_health_and_ingest_never_the_image_default(plant):
    for name, svc in compose_services(plant).items():
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD", name
        if name.endswith("/console"):
            assert "http://127.0.0.1:8080/healthz" in test[-1], name
        elif "/ingest-" in name:
            assert "http://127.0.0.1:9108/v2/health/ready" in test[-1], name
            assert not any("50051" in part for part in test), name
        else:
            assert test[1] == "edgeinspect-healthcheck" and test[-1].startswith("127.0.0.1:"), name


def test_usb_camera_and_hailo_get_their_devices_and_the_background_picture_is_copied(plant):
    services = compose_services(plant)
    ingest = services["cell-pi/ingest-cell-pi"]
    assert ingest["devices"] == ["/dev/video0:/dev/video0"] and ingest["group_add"] == ["44"]
    assert "devices" not in services["cell-pi/vision"]  # the example's vision runs on the Pi's CPU
    picture = (REPO / "compose" / "press-7-empty.jpg").read_bytes()
    for folder in ("cell-pi", "all-in-one", "k8s"):
        assert (plant / folder / "config" / "press-7-empty.jpg").read_bytes() == picture, folder
    pod = yaml.safe_load((plant / "k8s" / "ingest-cell-pi.yaml").read_text())["spec"]["template"]["spec"]
    assert {"name": "video-0", "hostPath": {"path": "/dev/video0", "type": "CharDevice"}} in pod["volumes"]
    assert {"name": "video-0", "mountPath": "/dev/video0"} in pod["containers"][0]["volumeMounts"]


def test_a_hailo_vision_box_gets_the_device_and_the_hailo_image(tmp_path):
    def hailo(data: dict) -> None:
        data["plant"]["vision_hef"] = "tower.hef"
        data["boxes"][0]["hailo"] = True

    render_to(inventory(hailo), tmp_path)
    vision = compose_services(tmp_path)["cell-pi/vision"]
    assert vision["devices"] == ["/dev/hailo0:/dev/hailo0"] and vision["image"].endswith("-hailo")


def test_a_missing_referenced_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="press-7-empty.jpg"):
        render.referenced_files(CAMERAS.read_text(), tmp_path)


def k8s_deployments(root: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(root.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Deployment":
                out[doc["metadata"]["name"]] = doc
    return out


def test_k8s_requests_fit_every_node_and_every_container_has_limits_and_probes(plant):
    inv = inventory()
    requested: dict[str, int] = {}
    for name, dep in k8s_deployments(plant / "k8s").items():
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        res = c["resources"]
        assert set(res["requests"]) == set(res["limits"]) == {"memory", "cpu"}, name
        assert mib(res["requests"]["memory"]) <= mib(res["limits"]["memory"]), name
        assert int(res["requests"]["cpu"].removesuffix("m")) <= int(res["limits"]["cpu"].removesuffix("m")), name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c, (name, probe)
        box = pod["nodeSelector"]["kubernetes.io/hostname"]
        requested[box] = requested.get(box, 0) + mib(res["requests"]["memory"])
    assert set(requested) == {b.name for b in inv.boxes}
    for box in inv.boxes:  # the scheduler places every pod: requests below the node's memory less the OS
        assert requested[box.name] * 2**20 < (box.memory_gb - OS_RESERVE_GIB) * GIB, box.name
    ingest = k8s_deployments(plant / "k8s")["ingest-cell-pi"]["spec"]["template"]["spec"]["containers"][0]
    assert ingest["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "metrics"}
    assert {"name": "metrics", "containerPort": 9108} in ingest["ports"]


def test_no_yaml_anchors_in_any_rendered_file(plant):
    for path in plant.rglob("*.yaml"):
        text = path.read_text()
        assert "&id0" not in text and "*id0" not in text, path


def with_replica(data: dict) -> None:
    """A second box holding a copy of line-server's layer range."""
    data["boxes"][2]["replicas"] = ["line-server-b"]
    data["boxes"].append(
        {"name": "line-server-b", "address": "10.20.7.13", "roles": ["stage"], "memory_gb": 32, "cpus": 8}
    )


def test_replicas_serve_the_same_range_and_the_gateway_is_given_every_endpoint(tmp_path):
    inv = inventory(with_replica)
    r = render_to(inv, tmp_path)
    assert [i.service for i in r.instances if i.stage] == ["stage-0", "stage-1", "stage-1-r1"]
    primary = StageSettings.load(tmp_path / "line-server" / "config" / "stage-1.yaml")
    copy = StageSettings.load(tmp_path / "line-server-b" / "config" / "stage-1-r1.yaml")
    assert (copy.layer_start, copy.layer_end) == (primary.layer_start, primary.layer_end)
    assert copy.server.port == primary.server.port
    gw = GatewaySettings.load(tmp_path / "line-server" / "config" / "gateway.yaml")
    assert sorted(gw.stages) == ["10.20.7.10:50061", "10.20.7.12:50060", "10.20.7.13:50061"]
    aio = GatewaySettings.load(tmp_path / "all-in-one" / "config" / "gateway.yaml")
    assert sorted(aio.stages) == ["stage-0:50060", "stage-1-r1:50061", "stage-1:50061"]
    k8s_gw = yaml.safe_load((tmp_path / "k8s" / "config" / "gateway.yaml").read_text())
    assert sorted(k8s_gw["stages"]) == sorted(aio.stages)
    dep = k8s_deployments(tmp_path / "k8s")["stage-1-r1"]
    assert dep["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "line-server-b"
    assert (tmp_path / "k8s" / "stage-1-r1.yaml").read_text().count("kind: Service\n") == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["boxes"][2].update(replicas=["nowhere"]), "not a box with role stage"),
        (lambda d: d["boxes"][2].update(replicas=["line-server"]), "another box"),
        (lambda d: d["boxes"][0].update(replicas=["jetson-a"]), "runs no decoder stage"),
    ],
)
def test_replica_mistakes_are_refused_with_a_reason(edit, message):
    with pytest.raises(ValueError, match=message):
        inventory(edit)


def kustomize(inv: Inventory, out: Path) -> list[dict]:
    """`kubectl kustomize` over a render with real box certificates and a secrets.env, as a plant has them."""
    rendering = render_to(inv, out, render.Target.k8s)
    render.write_certs(inv, rendering, out, certs.ensure_ca(out / "pki"))
    (out / "k8s" / "secrets.env").write_text("EDGEINSPECT_API_TOKENS=[]\nEDGEINSPECT_API_TOKEN=not-a-token\n")
    done = subprocess.run(["kubectl", "kustomize", out / "k8s"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def configmap_names(docs: list[dict]) -> tuple[str, set[str]]:
    """(the generated ConfigMap's name, the ConfigMap names the Deployments mount)."""
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    used = {
        v["configMap"]["name"]
        for d in docs
        if d["kind"] == "Deployment"
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    }
    return cm["metadata"]["name"], used


@needs_kubectl
def test_kustomize_renders_schema_valid_objects_and_a_config_change_rolls_the_pods(tmp_path):
    docs = kustomize(inventory(with_replica), tmp_path / "a")
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "Deployment", "Namespace", "Secret", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    name, used = configmap_names(docs)
    assert name.startswith("edgeinspect-config-") and used == {name}
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert "press-7-empty.jpg" in cm["binaryData"] and "gateway.yaml" in cm["data"]
    assert "stage-1-r1" in {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}

    same, _ = configmap_names(kustomize(inventory(with_replica), tmp_path / "b"))
    assert same == name  # the name follows the content, not the run

    def louder(data: dict) -> None:
        with_replica(data)
        data["plant"]["log_level"] = "DEBUG"

    changed, used = configmap_names(kustomize(inventory(louder), tmp_path / "c"))
    assert changed != name and used == {changed}
