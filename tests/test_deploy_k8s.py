"""The kustomize base for k3s: valid manifests (offline schema check), probes on grpc.health.v1, one Deployment
per layer range pinned to its box, configuration and secrets wired by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from edgeinspect.deploy import render
from edgeinspect.deploy.inventory import load_inventory
from edgeinspect.deploy.planning import plan_stages
from edgeinspect.services.console.settings import ConsoleSettings
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.stage.settings import StageSettings

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "compose" / "plant.example.yaml"
K8S_VERSION = "1.33.0"


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> tuple[Path, list[dict]]:
    inv = load_inventory(EXAMPLE)
    cams = {"cell-pi": (REPO / "compose" / "cameras.example.yaml").read_text()}
    out = tmp_path_factory.mktemp("k8s")
    render.write(render.render(inv, plan_stages(inv), render.Target.k8s, cams), out)
    docs = []
    for path in sorted((out / "k8s").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out / "k8s", docs + [generated_configmap(out / "k8s")]


def generated_configmap(root: Path) -> dict:
    """The ConfigMap kustomize's configMapGenerator makes from k8s/config/ (without its hash suffix; the kubectl
    tests in test_deploy_k8s_kustomize.py check the real one)."""
    import base64

    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    (gen,) = kust["configMapGenerator"]
    data, binary = {}, {}
    for rel in gen["files"]:
        raw = (root / rel).read_bytes()
        try:
            data[Path(rel).name] = raw.decode()
        except UnicodeDecodeError:
            binary[Path(rel).name] = base64.b64encode(raw).decode()
    doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data}
    if binary:
        doc["binaryData"] = binary
    return doc


def of_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_every_manifest_validates_offline_against_the_kubernetes_schema(manifests):
    _, docs = manifests
    assert {d["kind"] for d in docs} == {"Namespace", "ConfigMap", "Deployment", "Service"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_misspelled_probe(manifests):
    _, docs = manifests
    bad = yaml.safe_load(yaml.safe_dump(of_kind(docs, "Deployment")["gateway"]))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {"grcp": {"port": 50051}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_one_deployment_per_layer_range_with_mtls_health_probes_pinned_to_its_box(manifests):
    _, docs = manifests
    deployments = of_kind(docs, "Deployment")
    config = of_kind(docs, "ConfigMap")["edgeinspect-config"]["data"]
    stages = sorted(n for n in deployments if n.startswith("stage-"))
    assert stages == ["stage-0", "stage-1"]
    ranges = []
    for name in stages:
        pod = deployments[name]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        port = container["ports"][0]["containerPort"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            # kubelet's gRPC probe speaks no TLS: grpc.health.v1 is asked by the image's probe over mTLS
            command = container[probe]["exec"]["command"]
            assert command[0] == "edgeinspect-healthcheck" and command[-1] == f"127.0.0.1:{port}"
            assert {"--ca", "--cert", "--key"} <= set(command)
        assert set(pod["nodeSelector"]) == {"edgeinspect.io/box-type", "kubernetes.io/hostname"}
        cfg_name = Path(container["args"][container["args"].index("--config") + 1]).name
        settings = StageSettings.model_validate(yaml.safe_load(config[cfg_name]))
        assert settings.server.port == port
        ranges.append((settings.layer_start, settings.layer_end))
    assert ranges[0][0] == 0 and ranges[-1][1] == 24 and ranges[0][1] == ranges[1][0]
    assert deployments["vision"]["spec"]["template"]["spec"]["nodeSelector"]["edgeinspect.io/box-type"] == "rpi5"


def test_gateway_reaches_every_peer_through_a_service_and_tokens_come_from_the_secret(manifests):
    root, docs = manifests
    services = of_kind(docs, "Service")
    config = of_kind(docs, "ConfigMap")["edgeinspect-config"]["data"]
    gateway = GatewaySettings.model_validate(yaml.safe_load(config["gateway.yaml"]))
    for address in [*gateway.vision, *gateway.retrieval, *gateway.stages]:
        name, port = address.split(":")
        assert int(port) in [p["port"] for p in services[name]["spec"]["ports"]], address
        selector = services[name]["spec"]["selector"]
        pod_labels = of_kind(docs, "Deployment")[name]["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in root.glob("*.yaml") if p.name != "kustomization.yaml")
    generated = next(g for g in kust["secretGenerator"] if "envs" in g)
    for name in ("gateway", "ingest-cell-pi"):
        env = of_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]["containers"][0]["env"]
        refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in env if "valueFrom" in e]
        assert refs == [generated["name"]]
    assert "api_tokens" not in config["gateway.yaml"]


def test_every_pod_mounts_its_boxs_certificate_and_every_internal_channel_is_mtls(manifests):
    root, docs = manifests
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    tls_secrets = {g["name"]: g["files"] for g in kust["secretGenerator"] if "files" in g}
    config = of_kind(docs, "ConfigMap")["edgeinspect-config"]["data"]
    for name, dep in of_kind(docs, "Deployment").items():
        pod = dep["spec"]["template"]["spec"]
        box = pod["nodeSelector"]["kubernetes.io/hostname"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == f"edgeinspect-tls-{box}"
        assert f"box.key=secrets/tls/{box}.key" in tls_secrets[f"edgeinspect-tls-{box}"]
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["tls"]["mountPath"] == "/run/secrets/edgeinspect-tls" and mounts["tls"]["readOnly"]
        settings = yaml.safe_load(config[f"{name}.yaml"])
        if name.startswith("ingest-") or name == "console":
            assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # no key for a client
            client_tls = settings["client_tls" if name == "console" else "gateway_tls"]
            assert client_tls == {"ca": "/run/secrets/edgeinspect-tls/ca.crt"}
            continue
        tls = settings["server"]["tls"]
        assert tls["cert"] == "/run/secrets/edgeinspect-tls/box.crt"
        assert tls["require_client_auth"] is (name != "gateway")
    gateway = yaml.safe_load(config["gateway.yaml"])
    assert gateway["client_tls"]["key"] == "/run/secrets/edgeinspect-tls/box.key"
    for text in config.values():
        assert "PRIVATE KEY" not in text and "sha256:" not in text


def test_the_console_runs_beside_the_gateway_as_in_compose(manifests):
    _, docs = manifests
    deployments, services = of_kind(docs, "Deployment"), of_kind(docs, "Service")
    gateway, console = (deployments[n]["spec"]["template"]["spec"] for n in ("gateway", "console"))
    (container,) = console["containers"]
    assert (
        container["image"] == gateway["containers"][0]["image"] and console["nodeSelector"] == gateway["nodeSelector"]
    )
    assert container["args"] == ["serve", "console", "--config", "/etc/edgeinspect/console.yaml"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert not [e for e in container["env"] if "valueFrom" in e]  # operators sign in with their own API tokens
    config = of_kind(docs, "ConfigMap")["edgeinspect-config"]["data"]
    settings = ConsoleSettings.model_validate(yaml.safe_load(config["console.yaml"]))
    port = settings.server.port
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    assert (
        settings.gateway
        == f"gateway:{GatewaySettings.model_validate(yaml.safe_load(config['gateway.yaml'])).server.port}"
    )
    spec = services["console"]["spec"]
    assert spec["type"] == "LoadBalancer" and spec["ports"] == [{"name": "http", "port": port, "targetPort": "http"}]
    assert spec["selector"].items() <= deployments["console"]["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_console_on_the_generated_config_and_ca(tmp_path):
    """`kubectl kustomize` of a `deploy render --ca` output (no cluster: a client-side build only)."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "edgeinspect.cli", "deploy", "render", "-i", str(EXAMPLE), "-o",
                           str(out), "--target", "k8s", "--ca", str(tmp_path / "pki")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    built = subprocess.run(["kubectl", "kustomize", str(out / "k8s")], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    pod = of_kind(docs, "Deployment")["console"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert ("ConfigMap", volumes["config"]["configMap"]["name"]) in names  # the hashed name kustomize generated
    assert ("Secret", volumes["tls"]["secret"]["secretName"]) in names and ("Service", "console") in names
