"""The deployment renderer wires the line: the plant's outputs into the gateway's settings, the ingest box's
OPC UA port published, its cycle journal and outboxes on the frames volume."""

from __future__ import annotations

from pathlib import Path

import yaml

from edgeinspect.deploy import render
from edgeinspect.deploy.inventory import Role, load_inventory
from edgeinspect.deploy.topology import StagePlacement
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.ingest.config import IngestSettings
from edgeinspect.services.outputs.config import OutputsConfig

REPO = Path(__file__).resolve().parents[1]


def test_outputs_and_the_opcua_port_reach_the_rendered_files(tmp_path):
    inv = load_inventory(REPO / "compose" / "plant.example.yaml")
    outputs = OutputsConfig(mqtt={"url": "mqtts://broker.plant:8883", "node": "gateway"})
    inv = inv.model_copy(update={"plant": inv.plant.model_copy(update={"outputs": outputs})})
    boxes = inv.boxes_with(Role.stage)
    splits = [0, 14, 24]
    stages = [StagePlacement(k, boxes[k], splits[k], splits[k + 1]) for k in range(len(boxes))]
    cameras = yaml.safe_load((REPO / "compose" / "cameras.example.yaml").read_text())
    cameras["opcua"] = {"host": "0.0.0.0", "port": 4840}
    cameras["outputs"] = {"webhooks": [{"url": "http://mes.plant/hook", "secret": "s" * 32}]}
    cameras["cameras"][0]["line"] = {"result_deadline_ms": 1500, "on_uncertain": "recheck"}
    r = render.render(inv, stages, render.Target.compose, {"cell-pi": yaml.safe_dump(cameras)})
    render.write(r, tmp_path)

    gateway = GatewaySettings.load(next(tmp_path.glob("[!a]*/config/gateway.yaml")))
    assert gateway.outputs.mqtt is not None and gateway.outputs.mqtt.url == "mqtts://broker.plant:8883"
    ingest_path = next(tmp_path.glob("cell-pi/config/ingest*.yaml"))
    ingest = IngestSettings.load(ingest_path)
    frames = Path(inv.plant.frames_dir)
    assert ingest.opcua.journal == frames / "line" / "cycles.sqlite"
    assert ingest.outputs.outbox_dir == frames / "line" / "outbox"
    assert ingest.cameras[0].line.result_deadline_ms == 1500
    compose = yaml.safe_load((tmp_path / "cell-pi" / "compose.yaml").read_text())
    (service,) = [s for name, s in compose["services"].items() if name.startswith("ingest")]
    assert any(p.endswith("4840:4840") for p in service["ports"])


def test_the_k3s_ingest_pod_serves_the_line_on_its_box_address(tmp_path):
    """The PLC (OPC UA) and the line's trigger reach ingest at the box it is pinned to, as compose publishes them."""
    inv = load_inventory(REPO / "compose" / "plant.example.yaml")
    boxes = inv.boxes_with(Role.stage)
    splits = [0, 14, 24]
    stages = [StagePlacement(k, boxes[k], splits[k], splits[k + 1]) for k in range(len(boxes))]
    cameras = yaml.safe_load((REPO / "compose" / "cameras.example.yaml").read_text())
    cameras["opcua"] = {"host": "0.0.0.0", "port": 4840}
    cameras.setdefault("trigger", {})["port"] = 8091
    r = render.render(inv, stages, render.Target.k8s, {"cell-pi": yaml.safe_dump(cameras)})
    render.write(r, tmp_path)
    manifest = tmp_path / "k8s" / "ingest-cell-pi.yaml"
    (deployment,) = [d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "Deployment"]
    ports = {p["name"]: p for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["opcua"] == {"name": "opcua", "containerPort": 4840, "hostPort": 4840, "protocol": "TCP"}
    assert ports["trigger"]["hostPort"] == ports["trigger"]["containerPort"] == 8091
    assert "hostPort" not in ports["metrics"]  # scraped inside the cluster, never published
