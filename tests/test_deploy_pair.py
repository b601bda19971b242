"""A gateway pair from the inventory: two gateways sharing one PostgreSQL (run by the renderer, or external),
vision and retrieval on several boxes; compose files valid against the compose spec, Kubernetes objects strictly
valid, and no DSN or password in any rendered file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from edgeinspect import certs
from edgeinspect.deploy import render
from edgeinspect.deploy.inventory import Inventory, load_inventory
from edgeinspect.deploy.planning import plan_stages
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.ingest.config import IngestSettings

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "compose" / "plant-pair.example.yaml"
CAMERAS = REPO / "compose" / "cameras.example.yaml"
BIN = Path(sys.executable).parent
K8S_VERSION = "1.33.0"
DSN_PATH = "/run/secrets/edgeinspect-store/dsn"
GATEWAYS = ["gateway-line-server", "gateway-line-server-b"]
ADDRESS = {"line-server": "10.20.8.10", "line-server-b": "10.20.8.13"}
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (Debian: kubernetes-client)")


def inventory(edit=None) -> Inventory:
    data = yaml.safe_load(PAIR.read_text())
    if edit is not None:
        edit(data)
    return Inventory.model_validate(data)


def render_to(inv: Inventory, out: Path, inventory_dir: Path = PAIR.parent) -> render.Rendering:
    """Renders every target and writes what `deploy render` writes: the files, box certificates, store secrets."""
    text = CAMERAS.read_text()
    assets = {"cell-pi": render.referenced_files(text, CAMERAS.parent)}
    rendering = render.render(inv, plan_stages(inv), render.Target.all, {"cell-pi": text}, assets)
    render.write(rendering, out)
    render.write_certs(inv, rendering, out, certs.ensure_ca(out.parent / "pki"))
    render.write_store_secrets(inv, rendering, out, inventory_dir)
    return rendering


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, render.Rendering]:
    out = tmp_path_factory.mktemp("pair") / "plant"
    return out, render_to(inventory(), out)


def services(path: Path) -> dict[str, dict]:
    return yaml.safe_load(path.read_text())["services"]


def k8s_docs(root: Path) -> list[dict]:
    docs = []
    for path in sorted(root.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def of_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_pair_compose_files_validate_against_the_compose_spec(pair):
    out, _ = pair
    files = sorted(out.glob("*/compose.yaml"))
    assert len(files) == 6  # five boxes + all-in-one
    done = subprocess.run(
        [BIN / "check-jsonschema", "--builtin-schema", "vendor.compose-spec", *files], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_gateways_with_their_own_instance_names_read_one_dsn_from_a_mounted_secret(pair):
    out, _ = pair
    password = (out / "store-pc" / "secrets" / "store" / "postgres_password").read_text().strip()
    dsns = set()
    for box, name in zip(["line-server", "line-server-b"], GATEWAYS, strict=True):
        gw = GatewaySettings.load(out / box / "config" / f"{name}.yaml")
        assert (gw.store.backend.value, str(gw.store.dsn_file), gw.store.instance) == ("postgres", DSN_PATH, name)
        assert gw.store.dsn is None
        assert gw.store.advertise == f"{ADDRESS[box]}:50051"  # where the other gateway reads this one's frames
        doc = yaml.safe_load((out / box / "compose.yaml").read_text())
        mounted = {s["target"]: s["source"] for s in doc["services"][name]["secrets"]}
        assert doc["secrets"][mounted[DSN_PATH]]["file"] == "./secrets/store/dsn"
        dsns.add((out / box / "secrets" / "store" / "dsn").read_text())
        assert (out / box / "secrets" / "store" / "dsn").stat().st_mode & 0o077 == 0
    (dsn,) = dsns  # the same database, the same credentials
    assert dsn.startswith(f"postgresql://edgeinspect:{password}@10.20.8.20:5432/edgeinspect?sslmode=verify-full")
    aio = services(out / "all-in-one" / "compose.yaml")
    for name in GATEWAYS:
        gw = GatewaySettings.load(out / "all-in-one" / "config" / f"{name}.yaml")
        assert gw.store.instance == name and str(gw.store.dsn_file) == DSN_PATH
        assert gw.store.advertise == f"{name}:50051"
        assert aio[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert [aio[n]["ports"] for n in GATEWAYS] == [["50051:50051"], ["50052:50051"]]  # one machine: two host ports
    assert "@postgres:5432/" in (out / "all-in-one" / "secrets" / "store" / "dsn").read_text()


def test_postgres_runs_on_the_database_box_only_with_its_volume_password_file_and_certificate(pair):
    out, _ = pair
    for box in ("cell-pi", "jetson-a", "line-server", "line-server-b"):
        assert "postgres" not in services(out / box / "compose.yaml"), box
        assert not (out / box / "secrets" / "store" / "postgres_password").exists(), box
    doc = yaml.safe_load((out / "store-pc" / "compose.yaml").read_text())
    pg = doc["services"]["postgres"]
    assert pg["image"] == "postgres:16" and pg["user"] == "10001:10001"
    (volume,) = pg["volumes"]
    assert volume["type"] == "volume" and volume["source"] in doc["volumes"]
    assert pg["environment"]["PGDATA"].startswith(volume["target"] + "/")
    secrets = {s["target"]: s["source"] for s in pg["secrets"]}
    assert doc["secrets"][secrets[pg["environment"]["POSTGRES_PASSWORD_FILE"]]]["file"].startswith("./secrets/")
    assert pg["ports"] == ["10.20.8.20:5432:5432"]  # the gateways on other boxes reach it; on its address only
    assert pg["healthcheck"]["test"][1] == "pg_isready"
    assert "ssl=on" in pg["command"] and "/run/secrets/edgeinspect-tls/box.key" in secrets
    assert "ports" not in services(out / "all-in-one" / "compose.yaml")["postgres"]
    # verify-full: the database box's certificate names the DSN's hosts (its address, the service name)
    from cryptography import x509

    pem = (out / "k8s" / "secrets" / "tls" / "store-pc.crt").read_bytes()
    cert = x509.load_pem_x509_certificate(pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "postgres" in san.get_values_for_type(x509.DNSName)
    assert "10.20.8.20" in [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    assert certs.roles_of(pem) == ["retrieval"]  # PostgreSQL is no plant role: the box's certificate grants none


def test_no_dsn_or_password_in_any_rendered_file(pair):
    out, rendering = pair
    password = (out / "store-pc" / "secrets" / "store" / "postgres_password").read_text().strip()
    assert len(password) >= 24
    for rel, text in rendering.files.items():
        if isinstance(text, str):
            assert password not in text and "postgresql://" not in text, rel
    for path in out.rglob("*"):
        if path.is_file() and "secrets" not in path.relative_to(out).parts:
            assert password.encode() not in path.read_bytes(), path


def test_clients_hold_both_gateways_and_gateways_every_vision_and_retrieval(pair):
    out, _ = pair
    ingest = IngestSettings.load(out / "cell-pi" / "config" / "ingest-cell-pi.yaml")
    assert ingest.gateway == "10.20.8.10:50051,10.20.8.13:50051"
    aio = IngestSettings.load(out / "all-in-one" / "config" / "ingest-cell-pi.yaml")
    assert aio.gateway == "gateway-line-server:50051,gateway-line-server-b:50051"
    k8s_ingest = yaml.safe_load((out / "k8s" / "config" / "ingest-cell-pi.yaml").read_text())
    assert k8s_ingest["gateway"] == aio.gateway
    for box, name in zip(["line-server", "line-server-b"], GATEWAYS, strict=True):
        gw = GatewaySettings.load(out / box / "config" / f"{name}.yaml")
        assert gw.vision == ["10.20.8.11:50052", "10.20.8.13:50052"]
        assert gw.retrieval == ["10.20.8.10:50053", "10.20.8.20:50053"]
        assert sorted(gw.stages) == ["10.20.8.10:50061", "10.20.8.12:50060", "10.20.8.13:50061"]
    aio_gw = GatewaySettings.load(out / "all-in-one" / "config" / "gateway-line-server.yaml")
    assert aio_gw.vision == ["vision-cell-pi:50052", "vision-line-server-b:50052"]
    assert aio_gw.retrieval == ["retrieval-line-server:50053", "retrieval-store-pc:50053"]


def test_pair_kubernetes_objects_validate_strictly_with_a_statefulset_pvc_and_per_gateway_addresses(pair):
    out, _ = pair
    root = out / "k8s"
    docs = k8s_docs(root)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert {d["kind"] for d in docs} == {"Namespace", "Deployment", "Service", "StatefulSet"}
    (sts,) = of_kind(docs, "StatefulSet").values()
    assert sts["spec"]["serviceName"] == "postgres" and sts["spec"]["replicas"] == 1
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    pod = sts["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["kubernetes.io/hostname"] == "store-pc"
    assert {"name": "data", "mountPath": "/var/lib/postgresql/data"} in pod["containers"][0]["volumeMounts"]
    services_ = of_kind(docs, "Service")
    assert services_["postgres"]["spec"]["clusterIP"] == "None"
    store = next(v for v in pod["volumes"] if v["name"] == "store")["secret"]
    assert store["secretName"] == "edgeinspect-store" and store["items"] == [
        {"key": "postgres_password", "path": "postgres_password"}
    ]
    deployments = of_kind(docs, "Deployment")
    config = {p.name: p.read_text() for p in (root / "config").glob("*.yaml")}
    for name in GATEWAYS:
        # a pair is not load-balanced: each gateway has its own Service and is published on its box's address
        assert services_[name]["spec"]["type"] == "ClusterIP"
        gw_pod = deployments[name]["spec"]["template"]["spec"]
        assert gw_pod["containers"][0]["ports"][0] == {"name": "grpc", "containerPort": 50051, "hostPort": 50051}
        store = next(v for v in gw_pod["volumes"] if v["name"] == "store")["secret"]
        assert store["items"] == [{"key": "dsn", "path": "dsn"}]
        settings = yaml.safe_load(config[f"{name}.yaml"])
        assert settings["store"]["instance"] == name and settings["store"]["dsn_file"] == DSN_PATH
        assert settings["store"]["advertise"] == f"{name}:50051"  # its own Service
    assert "LoadBalancer" not in {s["spec"].get("type") for s in services_.values()}
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    (gen,) = [g for g in kust["secretGenerator"] if g["name"] == "edgeinspect-store"]
    for entry in gen["files"]:
        assert (root / entry.split("=", 1)[1]).is_file(), entry
    assert "@postgres:5432/" in (root / "secrets" / "store" / "dsn").read_text()


@needs_kubectl
def test_pair_kustomize_builds_strictly_valid_objects_wired_to_the_store_secret(pair):
    out, _ = pair
    root = out / "k8s"
    (root / "secrets.env").write_text("EDGEINSPECT_API_TOKENS=[]\nEDGEINSPECT_API_TOKEN=not-a-token\n")
    done = subprocess.run(["kubectl", "kustomize", root], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].startswith("edgeinspect-store-")]
    assert sorted(secret["data"]) == ["dsn", "postgres_password"]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    users = {
        d["metadata"]["name"]
        for d in workloads
        for v in d["spec"]["template"]["spec"]["volumes"]
        if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]
    }
    assert users == {*GATEWAYS, "postgres"}


def test_the_password_is_made_once_and_kept_on_re_render(tmp_path):
    inv = inventory()
    render_to(inv, tmp_path / "plant")
    first = (tmp_path / "plant" / "store-pc" / "secrets" / "store" / "postgres_password").read_text()
    render_to(inv, tmp_path / "plant")
    assert (tmp_path / "plant" / "store-pc" / "secrets" / "store" / "postgres_password").read_text() == first
    assert first.strip() in (tmp_path / "plant" / "line-server-b" / "secrets" / "store" / "dsn").read_text()


def test_an_external_database_is_a_copied_dsn_file_and_no_postgres(tmp_path):
    (tmp_path / "store.dsn").write_text("host=db.plant.example dbname=reports user=gw password=sentinel-pw-81\n")

    def external(data: dict) -> None:
        data["plant"]["database"] = {"external_dsn_file": "store.dsn"}
        data["boxes"][-1]["roles"] = ["retrieval"]

    inv = inventory(external)
    rendering = render_to(inv, tmp_path / "plant", inventory_dir=tmp_path)
    out = tmp_path / "plant"
    assert "postgres" not in {i.service for i in rendering.instances}
    for rel, text in rendering.files.items():
        assert "sentinel-pw-81" not in str(text), rel
    for folder in ("line-server", "line-server-b", "all-in-one", "k8s"):
        assert "sentinel-pw-81" in (out / folder / "secrets" / "store" / "dsn").read_text(), folder
    for folder in ("cell-pi", "jetson-a", "store-pc"):
        assert not (out / folder / "secrets" / "store").exists(), folder
    gw = GatewaySettings.load(out / "line-server" / "config" / "gateway-line-server.yaml")
    assert gw.store.backend.value == "postgres" and str(gw.store.dsn_file) == DSN_PATH
    kust = yaml.safe_load((out / "k8s" / "kustomization.yaml").read_text())
    assert {"name": "edgeinspect-store", "files": ["dsn=secrets/store/dsn"]} in kust["secretGenerator"]
    assert not (out / "k8s" / "postgres.yaml").exists()


def _drop_database(data: dict) -> None:
    data["plant"].pop("database")
    data["boxes"][-1]["roles"] = ["retrieval"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop_database, "2 gateways share one report store"),
        (lambda d: d["boxes"][1]["roles"].append("database"), r"at most 1 box\(es\) with role database"),
        (lambda d: d["plant"]["database"].update(external_dsn_file="x.dsn"), "choose one"),
        (lambda d: d["plant"].pop("database"), "add a `database:` section"),
        (lambda d: d["boxes"][-1].update(roles=["database"]), "no plant certificate"),
        (lambda d: d["boxes"][-1].update(roles=["retrieval"]), "give a box role database"),
    ],
)
def test_pair_mistakes_are_refused_with_a_reason(edit, message):
    with pytest.raises(ValueError, match=message):
        inventory(edit)


def test_one_gateway_without_a_database_keeps_sqlite_on_its_box(tmp_path):
    inv = load_inventory(REPO / "compose" / "plant.example.yaml")
    text = CAMERAS.read_text()
    r = render.render(inv, plan_stages(inv), render.Target.all, {"cell-pi": text}, {})
    assert not inv.shared_store
    assert "store:" not in r.files["line-server/config/gateway.yaml"]
    assert render.write_store_secrets(inv, r, tmp_path, REPO / "compose") == []
