"""The security pieces on their own: certificates and `edgeinspect certs`, the token bucket, the method table,
redaction (also of a real upstream connection error), current_caller, and retrieval's and a stage's caller
admission."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess

import grpc
import pytest

from edgeinspect import certs
from edgeinspect.config import ApiToken, ServerConfig, TLSConfig, TokenRole
from edgeinspect.services.common.auth import (
    METHOD_ROLES,
    TokenAuthInterceptor,
    TokenBucket,
    allowed,
    current_caller,
    hash_token,
)
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.common.errors import details_for
from edgeinspect.services.common.redact import redact
from edgeinspect.services.common.server import start_server
from edgeinspect.services.stage.servicer import DecoderStageServicer
from edgeinspect.v1 import retrieval_pb2, retrieval_pb2_grpc, stage_pb2, stage_pb2_grpc

SVC = "/edgeinspect.v1.InspectionService/"


def test_a_box_certificate_carries_its_roles_and_is_signed_by_the_ca():
    from cryptography import x509

    ca = certs.make_ca()
    box = certs.issue(ca, "jetson-a", ["stage", "gateway"], hosts=["jetson-a.plant"], ips=["10.0.0.7"])
    assert certs.roles_of(box.cert) == ["stage", "gateway"]
    cert = x509.load_pem_x509_certificate(box.cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"jetson-a", "jetson-a.plant"}
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert 824 < certs.days_left(box.cert) <= 825
    with pytest.raises(ValueError, match="roles must be"):
        certs.issue(ca, "x", ["root"])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`edgeinspect ARGS` in this process (typer's runner: the same app, without a Python start per call)."""
    from typer.testing import CliRunner

    from edgeinspect.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_certs_cli_init_issue_check_and_expiry(tmp_path):
    pki = tmp_path / "pki"
    assert _cli("certs", "init", "--out", str(pki)).returncode == 0
    assert (pki / "ca.key").stat().st_mode & 0o077 == 0
    done = _cli("certs", "issue", "--ca", str(pki), "--role", "stage", "--host", "ipc-1", "--ip", "10.0.0.9")
    assert done.returncode == 0, done.stderr
    assert certs.roles_of((pki / "ipc-1.crt").read_bytes()) == ["stage"]
    assert (pki / "ipc-1.key").stat().st_mode & 0o077 == 0
    ok = _cli("certs", "check", "--ca", str(pki))
    assert ok.returncode == 0 and "ipc-1" in ok.stdout
    near = _cli("certs", "check", "--ca", str(pki), "--warn-days", "900")
    assert near.returncode == 1 and "expiring within 900 days" in near.stderr
    # An expired certificate: issued by hand with a validity that ended yesterday.
    expired = _expired(certs.load_ca(pki))
    (tmp_path / "old.crt").write_bytes(expired)
    gone = _cli("certs", "check", str(tmp_path / "old.crt"))
    assert gone.returncode == 1


def _expired(ca: certs.Issued) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=10))
        .not_valid_after(now - dt.timedelta(days=1))
        .sign(serialization.load_pem_private_key(ca.key, None), hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_token_create_prints_the_token_once_and_a_hash_line_that_validates():
    import json

    done = _cli("token", "create", "--role", "inspect", "--name", "line-3")
    assert done.returncode == 0, done.stderr
    token = next(line.strip() for line in done.stdout.splitlines() if line.strip().startswith("ei_"))
    entry = json.loads(done.stdout.strip().splitlines()[-1].lstrip(" -"))
    parsed = ApiToken.model_validate(entry)
    assert parsed.hash == hash_token(token) and parsed.role is TokenRole.inspect
    assert done.stdout.count(token) == 1


def test_token_bucket_allows_the_burst_then_the_rate():
    bucket = TokenBucket(rate=2.0, burst=3)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) == 0.0  # one refilled
    assert bucket.take(0.5) == pytest.approx(0.5)
    assert bucket.take(100.0) == 0.0  # refilled to the burst, never beyond
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]


@pytest.mark.parametrize(
    ("method", "role", "ok"),
    [
        (SVC + "Inspect", TokenRole.inspect, True),
        (SVC + "InspectStream", TokenRole.inspect, True),
        (SVC + "ListReports", TokenRole.inspect, True),
        (SVC + "Inspect", TokenRole.read, False),
        (SVC + "InspectStream", TokenRole.read, False),
        (SVC + "GetReport", TokenRole.read, True),
        (SVC + "ListReports", TokenRole.read, True),
        (SVC + "SomeOperatorRpcAddedLater", TokenRole.admin, True),
        (SVC + "SomeOperatorRpcAddedLater", TokenRole.inspect, False),
        ("/other.Service/Call", TokenRole.admin, False),
        ("/grpc.health.v1.Health/Check", TokenRole.read, True),
    ],
)
def test_method_table_defaults_to_deny(method, role, ok):
    assert allowed(method, role) is ok
    assert all(m.startswith("/edgeinspect.") for m in METHOD_ROLES)


@pytest.mark.parametrize(
    "text",
    [
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:39575: Connection refused",
        "127.0.0.1:39575: not an image",
        "stage stage-1:50061 closed the stream",
        "[::1]:50051 refused",
        "cannot open /var/lib/edgeinspect/reports/reports.sqlite",
        "DecodeError while parsing",
        "ValueError: bad",
    ],
)
def test_redaction_removes_addresses_paths_and_exception_names(text):
    assert redact("layers [3,5) of stage [gateway] at position 12") == "layers [3,5) of stage [gateway] at position 12"
    clean = redact(text)
    for leak in ("127.0.0.1", "39575", "50061", "::1", "/var/lib", "DecodeError", "ValueError", "stage-1:"):
        assert leak not in clean, clean


async def test_a_real_upstream_connection_error_reaches_the_caller_without_its_address():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    async with make_channel(dead) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await retrieval_pb2_grpc.RetrievalServiceStub(channel).Stats(retrieval_pb2.IndexStatsRequest(), timeout=5)
    assert "127.0.0.1" in (err.value.details() or "") + err.value.debug_error_string()
    rid = request_id_var.set("rid-42")
    try:
        details = details_for(err.value)
    finally:
        request_id_var.reset(rid)
    assert "127.0.0.1" not in details and dead.split(":")[1] not in details
    assert "rid-42" in details and "unavailable" in details


class _Retrieval(retrieval_pb2_grpc.RetrievalServiceServicer):
    async def Stats(self, request, context):
        caller = current_caller()
        return retrieval_pb2.IndexStats(index_version=f"{caller.name}/{caller.role.value}" if caller else "nobody")


async def test_current_caller_names_the_token_holder(tmp_path):
    tokens = [ApiToken(name="qa-console", role=TokenRole.admin, hash=hash_token("ei_x"))]
    running = await start_server(
        [lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(_Retrieval(), s)],
        [],
        ServerConfig(),
        role="gateway",
        interceptors=[TokenAuthInterceptor(tokens, 10.0, 5)],
    )
    try:
        async with make_channel(f"127.0.0.1:{running.port}") as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            reply = await stub.Stats(retrieval_pb2.IndexStatsRequest(), metadata=[("authorization", "Bearer ei_x")])
        assert reply.index_version == "qa-console/admin"
    finally:
        await running.stop(0)


def _role_certificates(tmp_path, roles: tuple[str, ...]):
    """One plant CA and a certificate per role; returns role -> its TLSConfig."""
    ca = certs.make_ca()
    ca_file = certs.write_ca(tmp_path / "ca", ca).cert
    paths = {r: certs.write_issued(tmp_path, r, certs.issue(ca, r, [r], ips=["127.0.0.1"]), ca_file) for r in roles}

    def tls(role: str) -> TLSConfig:
        return TLSConfig(cert=paths[role].cert, key=paths[role].key, ca=ca_file)

    return tls


async def test_retrieval_admits_the_gateway_and_refuses_a_stage(tmp_path):
    tls = _role_certificates(tmp_path, ("retrieval", "gateway", "stage"))
    running = await start_server(
        [lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(_Retrieval(), s)],
        [],
        ServerConfig(tls=tls("retrieval")),
        role="retrieval",
    )
    address = f"127.0.0.1:{running.port}"
    try:
        async with make_channel(address, tls=tls("gateway")) as channel:
            await retrieval_pb2_grpc.RetrievalServiceStub(channel).Stats(retrieval_pb2.IndexStatsRequest(), timeout=10)
        async with make_channel(address, tls=tls("stage")) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await retrieval_pb2_grpc.RetrievalServiceStub(channel).Stats(
                    retrieval_pb2.IndexStatsRequest(), timeout=10
                )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "role stage may not call the retrieval" in err.value.details()
    finally:
        await running.stop(0)
    await asyncio.sleep(0)


async def test_a_stage_admits_the_gateway_and_refuses_another_stage(tmp_path):
    """The gateway drives every stage: no stage calls another (chained mode was retired)."""
    tls = _role_certificates(tmp_path, ("stage", "gateway"))
    running = await start_server(
        [lambda s: stage_pb2_grpc.add_DecoderStageServicer_to_server(DecoderStageServicer(None), s)],
        [],
        ServerConfig(tls=tls("stage")),
        role="stage",
    )
    address = f"127.0.0.1:{running.port}"
    try:
        for caller, code in (("gateway", grpc.StatusCode.UNAVAILABLE), ("stage", grpc.StatusCode.PERMISSION_DENIED)):
            async with make_channel(address, tls=tls(caller)) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as err:  # admitted, the gateway hears the stage is loading
                    await stage_pb2_grpc.DecoderStageStub(channel).Stats(stage_pb2.StatsRequest(), timeout=10)
            assert err.value.code() == code, (caller, err.value.details())
        assert "role stage may not call the stage" in err.value.details()
    finally:
        await running.stop(0)
    await asyncio.sleep(0)
