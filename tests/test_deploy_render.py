"""Inventory -> compose files and role settings: schema-valid, every reference resolves, secrets stay out."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgeinspect.deploy import render
from edgeinspect.deploy import tls as deploy_tls
from edgeinspect.deploy.inventory import Inventory, Role, load_inventory
from edgeinspect.deploy.topology import StagePlacement
from edgeinspect.services.console.settings import ConsoleSettings
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.ingest.config import IngestSettings
from edgeinspect.services.retrieval.settings import RetrievalSettings
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.services.vision.settings import VisionSettings

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "compose" / "plant.example.yaml"
SETTINGS = {
    "vision": VisionSettings,
    "stage": StageSettings,
    "retrieval": RetrievalSettings,
    "gateway": GatewaySettings,
}
ROLE_CLASSES = {**SETTINGS, "ingest": IngestSettings, "console": ConsoleSettings}
BIN = Path(sys.executable).parent
CAMERAS = (REPO / "compose" / "cameras.example.yaml").read_text()


def placements(inv: Inventory, splits: list[int]) -> list[StagePlacement]:
    """Stage k on the k-th decoder box, layers [splits[k], splits[k+1])."""
    boxes = inv.boxes_with(Role.stage)
    return [StagePlacement(k, boxes[k], splits[k], splits[k + 1]) for k in range(len(boxes))]


@pytest.fixture
def example() -> Inventory:
    return load_inventory(EXAMPLE)


@pytest.fixture
def rendered(example, tmp_path) -> Path:
    cams = {"cell-pi": CAMERAS}
    r = render.render(example, placements(example, [0, 14, 24]), render.Target.compose, cams)
    render.write(r, tmp_path)
    return tmp_path


def compose_files(root: Path) -> list[Path]:
    return sorted(root.glob("*/compose.yaml"))


def test_rendered_compose_files_validate_against_the_compose_spec(rendered):
    files = compose_files(rendered)
    assert len(files) == 4  # three boxes + all-in-one
    done = subprocess.run(
        [BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", *files], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="needs Debian's docker-compose (tools/docker_engine.sh)"
)
def test_rendered_compose_files_load_in_compose_v1_under_the_project_name_of_their_env_file(rendered):
    """Compose v1 (1.29, what Debian packages) checks its own schema, stricter than the spec: no top-level `name`."""
    for file in compose_files(rendered):
        done = subprocess.run(["docker-compose", "-f", file, "config"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (file, done.stderr)
        assert "COMPOSE_PROJECT_NAME=edgeinspect-line-7" in (file.parent / ".env").read_text()
        doc = yaml.safe_load(file.read_text())
        assert "name" not in doc
        for svc in doc["services"].values():  # docker-py parses these itself: b, k, m, g only (no Kubernetes `Mi`)
            assert re.fullmatch(r"\d+m", svc["mem_limit"]), svc["mem_limit"]


def test_compose_spec_check_rejects_a_broken_file(tmp_path):
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  gateway:\n    image: x\n    depends_on: {vision: {condition: when_ready}}\n")
    done = subprocess.run(
        [BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", bad], capture_output=True, text=True
    )
    assert done.returncode != 0


def _config_of(service: dict) -> str:
    command = service["command"]
    return command[command.index("--config") + 1]


def test_every_depends_on_volume_secret_and_config_reference_resolves(rendered, example):
    for path in compose_files(rendered):
        doc = yaml.safe_load(path.read_text())
        services = doc["services"]
        for name, svc in services.items():
            for dep in svc.get("depends_on", {}):
                assert dep in services, f"{path}: {name} depends on missing {dep}"
                assert "healthcheck" in services[dep], f"{path}: {dep} has no healthcheck to wait on"
            targets = set()
            for vol in svc["volumes"]:
                targets.add(vol["target"])
                if vol["type"] == "volume":
                    assert vol["source"] in doc.get("volumes", {}), f"{path}: undeclared volume {vol['source']}"
                elif vol["source"].startswith("./"):
                    assert (path.parent / vol["source"]).exists(), f"{path}: {vol['source']} was not rendered"
                else:
                    assert Path(vol["source"]).is_relative_to(example.plant.data_dir), vol["source"]
            if "observability" in svc.get("profiles", []):  # Prometheus and Grafana: no role settings
                continue
            config = Path(_config_of(svc))
            assert str(config.parent) in targets, f"{path}: {name}'s --config folder is not mounted"
            assert (path.parent / "config" / config.name).is_file(), f"{path}: {config.name} was not rendered"
            role_text = (path.parent / "config" / config.name).read_text()
            for secret in svc.get("secrets", []):
                assert secret["source"] in doc["secrets"], f"{path}: undeclared secret {secret['source']}"
                if secret["target"].startswith(deploy_tls.MOUNT):  # a TLS file: the role's settings name it
                    assert secret["target"] in role_text, f"{path}: {name} mounts {secret['target']} but never uses it"
                    continue
                field = secret["target"].removeprefix("EDGEINSPECT_").lower()
                role_settings = ROLE_CLASSES[name.split("-")[0]]
                assert field in role_settings.model_fields, f"{path}: {secret['target']} sets no setting of {name}"
            # every role checks its own health: gRPC roles their port, ingest its metrics port's HTTP health
            test = svc["healthcheck"]["test"]
            server = yaml.safe_load(role_text)["server"]
            if name == "console":  # HTTP: its own page answers
                assert f"http://127.0.0.1:{server['port']}/healthz" in test[-1], f"{path}: {name} healthcheck"
            elif "port" in server:
                assert test[-1] == f"127.0.0.1:{server['port']}", f"{path}: {name} healthcheck"
            else:
                assert f"http://127.0.0.1:{server['metrics_port']}/v2/health/ready" in test[-1], f"{path}: {name}"
        for secret in doc.get("secrets", {}).values():
            assert secret["file"].startswith("./secrets/")


def _served_by_boxes(root: Path) -> dict[str, str]:
    """{box:port: service} of every server the per-box compose files in `root` run and publish."""
    out = {}
    for path in compose_files(root):
        if path.parent.name == render.ALL_IN_ONE:
            continue
        doc = yaml.safe_load(path.read_text())
        box = path.parent.name
        for name, svc in doc["services"].items():
            if svc.get("command", [""])[0] != "serve":
                continue
            cfg = yaml.safe_load((path.parent / "config" / Path(_config_of(svc)).name).read_text())
            port = cfg["server"]["port"]
            assert cfg["server"]["host"] == "0.0.0.0"  # inside the container; published on the box's address only
            assert any(p.endswith(f"{port}:{port}") for p in svc["ports"]), f"{box}/{name} does not publish {port}"
            out[f"{box}:{port}"] = name
    return out


def test_every_address_in_the_settings_reaches_the_role_it_names(rendered, example):
    address_of = {b.name: b.address for b in example.boxes}
    served = {}
    for key, service in _served_by_boxes(rendered).items():
        box, port = key.split(":")
        served[f"{address_of[box]}:{port}"] = service
    gateway = GatewaySettings.load(rendered / "line-server" / "config" / "gateway.yaml")
    assert [served[a] for a in gateway.vision] == ["vision"]
    assert [served[a] for a in gateway.retrieval] == ["retrieval"]
    assert [served[s] for s in gateway.stages] == ["stage-0", "stage-1"]
    assert gateway.codec.value == example.plant.codec.value
    stage_boxes = {b.name for b in example.boxes if "stage" in b.roles}
    assert gateway.micro_batches == len(stage_boxes)  # one micro-batch group per memory bus holding stages


def test_the_inventorys_anomaly_policies_reach_every_gateway(example, tmp_path):
    anomaly = {"default": {"policy": "vlm"}, "stations": {"press-7": {"policy": "gate", "vlm_may_clear": True}}}
    data = example.model_dump(mode="json")
    data["plant"]["anomaly"] = anomaly
    inv = Inventory.model_validate(data)  # as a plant engineer's file is
    render.write(render.render(inv, placements(inv, [0, 14, 24]), render.Target.all, {"cell-pi": CAMERAS}), tmp_path)
    for folder in ("line-server", "all-in-one"):
        gate = GatewaySettings.load(tmp_path / folder / "config" / "gateway.yaml").anomaly
        assert gate.default.policy == "vlm" and gate.for_station("press-7").policy == "gate", folder
        assert gate.for_station("press-7").vlm_may_clear and gate.for_station("press-8").policy == "vlm"
    example_gateway = render.render(
        example, placements(example, [0, 14, 24]), render.Target.compose, {"cell-pi": CAMERAS}
    )
    assert "anomaly:" not in example_gateway.files["line-server/config/gateway.yaml"]  # unset: the gateway's defaults


def test_the_inventorys_part_regions_reach_every_vision_box(example, tmp_path):
    data = example.model_dump(mode="json")
    data["plant"]["regions"] = {"HSG-210": [400, 300, 1600, 1200]}
    inv = Inventory.model_validate(data)
    render.write(render.render(inv, placements(inv, [0, 14, 24]), render.Target.all, {"cell-pi": CAMERAS}), tmp_path)
    configs = sorted(tmp_path.rglob("config/vision*.yaml"))
    assert configs
    for path in configs:
        assert VisionSettings.load(path).anomaly.regions == {"HSG-210": (400, 300, 1600, 1200)}, path


def test_stages_sharing_one_box_batch_as_one_group(rendered):
    gateway = GatewaySettings.load(rendered / "all-in-one" / "config" / "gateway.yaml")
    assert len(gateway.stages) >= 2 and gateway.micro_batches == 1


def test_all_in_one_names_peers_by_service_and_publishes_only_the_gateway(rendered):
    doc = yaml.safe_load((rendered / "all-in-one" / "compose.yaml").read_text())
    published = [n for n, s in doc["services"].items() if "ports" in s and "profiles" not in s]
    assert published == ["gateway", "console"]  # the API and the console, for the operators
    for name in ("prometheus", "grafana"):  # the optional observability profile: on this machine only
        assert all(p.startswith("127.0.0.1:") for p in doc["services"][name]["ports"]), name
    gateway = GatewaySettings.load(rendered / "all-in-one" / "config" / "gateway.yaml")
    for address in [*gateway.vision, *gateway.retrieval, *gateway.stages]:
        name, port = address.split(":")
        cfg = yaml.safe_load((rendered / "all-in-one" / "config" / f"{name}.yaml").read_text())
        assert name in doc["services"] and cfg["server"]["port"] == int(port)


def test_rendered_settings_load_with_the_role_classes_and_cover_every_layer(rendered, example):
    ranges = []
    for path in sorted(rendered.glob("[!a]*/config/*.yaml")):
        role = path.stem.split("-")[0]
        settings = ROLE_CLASSES[role].load(path)
        if role == "ingest":
            assert settings.gateway == "10.20.7.10:50051"
            assert settings.max_in_flight >= 2 * len(example.boxes_with(Role.stage))  # keeps every stage busy
            continue
        assert settings.server.port > 0
        if role == "stage":
            ranges.append((settings.layer_start, settings.layer_end))
            assert settings.weights.value == example.plant.weights.value
    assert sorted(ranges) == [(0, 14), (14, 24)]


def test_ingest_keeps_two_inspections_per_stage_in_flight_unless_told_otherwise(example, tmp_path):
    cameras = "\n".join(line for line in CAMERAS.splitlines() if not line.startswith("max_in_flight"))
    r = render.render(example, placements(example, [0, 14, 24]), render.Target.compose, {"cell-pi": cameras})
    render.write(r, tmp_path)
    paths = list(tmp_path.glob("[!a]*/config/ingest*.yaml"))  # not the all-in-one folder
    assert paths
    for path in paths:
        assert IngestSettings.load(path).max_in_flight == 2 * len(example.boxes_with(Role.stage))


def test_secrets_and_the_renderers_environment_stay_out_of_rendered_files(example, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINSPECT_API_TOKENS", '["sentinel-token-5f2c"]')
    monkeypatch.setenv("EDGEINSPECT_LOG_LEVEL", "DEBUG")
    r = render.render(example, placements(example, [0, 14, 24]), render.Target.all, {"cell-pi": CAMERAS})
    for rel, text in r.files.items():
        assert "sentinel-token-5f2c" not in text, rel
        assert "DEBUG" not in text, rel
    monkeypatch.delenv("EDGEINSPECT_API_TOKENS")
    render.write(r, tmp_path)
    assert GatewaySettings.load(tmp_path / "line-server" / "config" / "gateway.yaml").api_tokens == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["boxes"][2]["roles"].remove("gateway"), r"at least 1 box\(es\) with role gateway"),
        (lambda d: d["boxes"][1].update(address="10.20.7.10"), "addresses must be unique"),
        (lambda d: d["boxes"][0].update(hailo=True), "vision_hef"),  # a Hailo vision box without its compiled tower
        (lambda d: d["boxes"][0].pop("cameras"), "cameras"),
        (lambda d: d["boxes"][1].update(memory_gb=1), "leaves nothing for a stage"),
        (lambda d: d["plant"].update(chained=True), "chained mode was retired: .*; remove `chained`"),
    ],
)
def test_inventory_mistakes_are_refused_with_a_reason(edit, message):
    data = yaml.safe_load(EXAMPLE.read_text())
    edit(data)
    with pytest.raises(ValueError, match=message):
        inv = Inventory.model_validate(data)
        [b.stage_budget_bytes() for b in inv.boxes_with(Role.stage)]


@pytest.mark.parametrize(
    ("path", "key"), [("jetson-a/config/stage-0.yaml", "next_stage"), ("line-server/config/gateway.yaml", "chained")]
)
def test_a_role_config_that_still_chains_is_refused_with_what_to_do(rendered, monkeypatch, path, key):
    cls = StageSettings if key == "next_stage" else GatewaySettings
    config = rendered / path
    var = f"EDGEINSPECT_{key.upper()}"
    monkeypatch.setenv(var, "10.20.7.10:50061")
    with pytest.raises(ValueError, match=f"chained mode was retired: .*; remove {var} from the environment"):
        cls.load(config)
    monkeypatch.delenv(var)
    original = config.read_text()
    config.write_text(original + f"{key}: 10.20.7.10:50061\n")
    with pytest.raises(ValueError, match=f"chained mode was retired: .*; remove `{key}`"):
        cls.load(config)
    config.write_text(original + f"{key}: null\n")  # what older rendered configs hold: asks for nothing, read as is
    assert not hasattr(cls.load(config), key)


def test_internal_ports_and_metrics_are_published_on_the_boxs_own_address_only(example, tmp_path):
    boxes = [
        b.model_copy(update={"metrics_address": "10.99.0.12"}) if b.name == "jetson-a" else b for b in example.boxes
    ]
    inv = example.model_copy(update={"boxes": boxes})
    render.write(
        render.render(inv, placements(inv, [0, 14, 24]), render.Target.compose, {"cell-pi": CAMERAS}), tmp_path
    )
    for box in inv.boxes:
        doc = yaml.safe_load((tmp_path / box.name / "compose.yaml").read_text())
        for name, svc in doc["services"].items():
            for mapping in svc.get("ports", []):
                host, port, _ = mapping.rsplit(":", 2) if mapping.count(":") == 2 else ("", *mapping.split(":"))
                if (name, port) in (("gateway", "50051"), ("console", "8080")):
                    assert host == "", "the public API and the console are published on every interface"
                elif int(port) >= 51000:  # metrics
                    assert host == (box.metrics_address or box.address), mapping
                else:
                    assert host == box.address, f"{box.name}/{name}: {mapping}"
    stage = yaml.safe_load((tmp_path / "jetson-a" / "compose.yaml").read_text())["services"]["stage-0"]
    assert "10.99.0.12:51060:51060" in stage["ports"] and "10.20.7.12:50060:50060" in stage["ports"]
