"""`up --tls`: the embedded stack over mTLS (real processes, a generated CA), and who may call an internal role.

The refusals are real handshakes and real RPCs: grpcurl and grpcio clients with the stack's certificates, a
certificate from another CA, one of the wrong role, and none at all.
"""

from __future__ import annotations

import json

import grpc
import pytest

from edgeinspect import certs
from edgeinspect.assets import asset_path
from edgeinspect.services.client import InspectionClient
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.testing import grpcurl
from edgeinspect.v1 import stage_pb2, stage_pb2_grpc

REQUEST = {"station": "station-3", "part": "HSG-210", "max_new_tokens": 8}


@pytest.fixture(scope="module")
def tls_stack(tiny_checkpoint, tmp_path_factory):
    """The same stack as conftest's embedded_stack (plaintext), with --tls."""
    opts = StackOptions(workdir=tmp_path_factory.mktemp("tls-stack"), checkpoint=tiny_checkpoint, stages=2, tls=True)
    with LocalStack(opts) as stack:
        yield stack


@pytest.fixture(scope="module")
def strangers(tls_stack, tmp_path_factory):
    """Certificates the stack must refuse: another CA's gateway, the plant CA's ingest, one with no role URI."""
    out = tmp_path_factory.mktemp("strangers")
    other_ca = certs.make_ca("someone else's CA")
    plant_ca = certs.load_ca(tls_stack.creds.tls_dir)
    ca_file = tls_stack.client_ca
    made = {
        "other-ca": certs.write_issued(
            out, "other", certs.issue(other_ca, "gw", ["gateway"], ips=["127.0.0.1"]), ca_file
        ),
        "ingest": certs.write_issued(
            out, "ingest", certs.issue(plant_ca, "line", ["ingest"], ips=["127.0.0.1"]), ca_file
        ),
    }
    return made


def _report_tokens(address: str, token: str, ca=None) -> list[int]:
    with InspectionClient(address, token, ca=ca) as client:
        report = client.inspect(asset_path("part_dent.jpg").read_bytes(), **REQUEST)
    return list(report.generated_token_ids)


def test_up_tls_gives_the_same_tokens_as_plaintext(tls_stack, embedded_stack):
    plain = _report_tokens(embedded_stack.gateway_address, embedded_stack.api_token)
    secure = _report_tokens(tls_stack.gateway_address, tls_stack.api_token, tls_stack.client_ca)
    assert len(secure) >= 4
    assert secure == plain


def test_every_run_config_points_at_its_certificates_and_is_owner_only(tls_stack):
    import yaml

    for role in tls_stack.roles:
        assert role.config_path.stat().st_mode & 0o077 == 0, role.config_path
        tls = yaml.safe_load(role.config_path.read_text())["server"]["tls"]
        assert (tls["cert"], tls["key"]) == (
            str(tls_stack.creds.tls_dir / f"{role.role}.crt"),
            str(tls_stack.creds.tls_dir / f"{role.role}.key"),
        )
        assert tls["require_client_auth"] is (role.role != "gateway")
        assert (tls_stack.creds.tls_dir / f"{role.role}.key").stat().st_mode & 0o077 == 0
    gateway = yaml.safe_load(tls_stack.role("gateway").config_path.read_text())
    assert gateway["client_tls"]["cert"].endswith("gateway.crt")
    assert tls_stack.api_token not in tls_stack.role("gateway").config_path.read_text()


def test_the_public_api_refuses_a_plaintext_client(tls_stack):
    with pytest.raises(grpc.RpcError) as err:
        _report_tokens(tls_stack.gateway_address, tls_stack.api_token, ca=None)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def _stage_stats(tls_stack, *auth: str):
    return grpcurl(*auth, "-d", "{}", tls_stack.address_of("stage0"), "edgeinspect.v1.DecoderStage/Stats", timeout=30)


def test_grpcurl_with_the_ca_and_a_gateway_certificate_calls_a_stage(tls_stack):
    d = tls_stack.creds.tls_dir
    done = _stage_stats(
        tls_stack, "-cacert", str(d / "ca.crt"), "-cert", str(d / "gateway.crt"), "-key", str(d / "gateway.key")
    )
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["identity"]["role"] == "stage"


def test_grpcurl_without_a_client_certificate_or_plaintext_is_refused_at_the_handshake(tls_stack):
    log = tls_stack.role("stage0").log_path
    before = log.read_text().count("Handshake failed")
    no_cert = _stage_stats(tls_stack, "-connect-timeout", "3", "-cacert", str(tls_stack.client_ca))
    assert no_cert.returncode != 0 and "Failed to dial" in no_cert.stderr, no_cert.stderr
    plaintext = _stage_stats(tls_stack, "-connect-timeout", "3", "-plaintext")
    assert plaintext.returncode != 0 and not plaintext.stdout, plaintext.stdout
    # The refusing stage logs each failed handshake (grpc core's TLS layer, in the role's log).
    assert log.read_text().count("Handshake failed") >= before + 2


def test_grpcurl_with_an_ingest_certificate_is_permission_denied(tls_stack, strangers):
    c = strangers["ingest"]
    done = _stage_stats(tls_stack, "-cacert", str(c.ca), "-cert", str(c.cert), "-key", str(c.key))
    assert done.returncode != 0
    assert "PermissionDenied" in done.stderr and "ingest" in done.stderr, done.stderr


def _grpc_stats(address: str, cert=None, key=None, ca=None) -> stage_pb2.StageStats:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    with grpc.secure_channel(address, creds) as channel:
        return stage_pb2_grpc.DecoderStageStub(channel).Stats(stage_pb2.StatsRequest(), timeout=10)


@pytest.mark.parametrize(
    ("who", "code"),
    [
        ("ingest", grpc.StatusCode.PERMISSION_DENIED),  # the plant CA's certificate, the wrong role
        ("other-ca", grpc.StatusCode.UNAVAILABLE),  # the handshake fails: no RPC status can be sent before it
        ("none", grpc.StatusCode.UNAVAILABLE),  # no client certificate: the same
    ],
)
def test_callers_a_stage_does_not_admit_are_refused(tls_stack, strangers, who, code):
    c = strangers.get(who)
    with pytest.raises(grpc.RpcError) as err:
        _grpc_stats(tls_stack.address_of("stage1"), c.cert if c else None, c.key if c else None, tls_stack.client_ca)
    assert err.value.code() == code, err.value.details()


def test_vision_admits_the_gateway_only(tls_stack):
    d = tls_stack.creds.tls_dir
    auth = ["-cacert", str(d / "ca.crt"), "-d", "{}"]
    gw = grpcurl(
        *auth,
        "-cert",
        str(d / "gateway.crt"),
        "-key",
        str(d / "gateway.key"),
        tls_stack.address_of("vision"),
        "edgeinspect.v1.VisionService/Info",
    )
    assert gw.returncode == 0, gw.stderr
    stage = grpcurl(
        *auth,
        "-cert",
        str(d / "stage.crt"),
        "-key",
        str(d / "stage.key"),
        tls_stack.address_of("vision"),
        "edgeinspect.v1.VisionService/Info",
    )
    assert stage.returncode != 0 and "PermissionDenied" in stage.stderr, stage.stderr


def test_health_and_reflection_answer_any_plant_certificate_over_tls(tls_stack, strangers):
    c = strangers["ingest"]
    auth = ["-cacert", str(c.ca), "-cert", str(c.cert), "-key", str(c.key)]
    health = grpcurl(*auth, "-d", "{}", tls_stack.address_of("stage0"), "grpc.health.v1.Health/Check")
    assert health.returncode == 0 and "SERVING" in health.stdout, health.stderr
    listed = grpcurl(*auth, tls_stack.address_of("stage0"), "list")
    assert listed.returncode == 0 and "edgeinspect.v1.DecoderStage" in listed.stdout, listed.stderr


def test_refusals_are_logged_by_the_refusing_role(tls_stack, strangers):
    c = strangers["ingest"]
    with pytest.raises(grpc.RpcError):
        _grpc_stats(tls_stack.address_of("stage0"), c.cert, c.key, tls_stack.client_ca)
    log = tls_stack.role("stage0").log_path.read_text()
    assert "refused /edgeinspect.v1.DecoderStage/Stats" in log and "role ingest may not call the stage" in log


def test_a_wrong_role_with_a_malformed_body_is_permission_denied_before_parsing(tls_stack, strangers):
    c = strangers["ingest"]
    creds = grpc.ssl_channel_credentials(
        root_certificates=tls_stack.client_ca.read_bytes(),
        private_key=c.key.read_bytes(),
        certificate_chain=c.cert.read_bytes(),
    )
    with grpc.secure_channel(tls_stack.address_of("stage1"), creds) as channel, pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/edgeinspect.v1.DecoderStage/Stats")(b"\xff\xff\xff\x0f", timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
