"""Public API tokens on a real gateway process: roles, revocation, fail-closed start, per-token rate, and a table
of every error status the public API returns, none of which may leak an address, port, path or exception name.

The gateways here are extra processes in front of the session's embedded stack (its vision and stages), each
with its own token list, so the embedded stack itself stays as every other test knows it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from edgeinspect.assets import asset_path
from edgeinspect.config import ApiToken, ServerConfig, write_yaml
from edgeinspect.services.common.auth import hash_token
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

TOKENS = {  # name -> (role, token, extra fields)
    "line-3": ("inspect", "ei_test-inspect", {}),
    "qa": ("read", "ei_test-read", {}),
    # the error table fires its cases back to back: a fast refill keeps the limiter out of it (burst is 2 here)
    "ops": ("admin", "ei_test-admin", {"rate_per_s": 1000.0}),
    "old": ("inspect", "ei_test-revoked", {"revoked": True}),
    "slow": ("read", "ei_test-slow", {"rate_per_s": 0.2}),
}
START_S = 120


def _entries() -> list[ApiToken]:
    return [ApiToken(name=n, role=r, hash=hash_token(t), **kw) for n, (r, t, kw) in TOKENS.items()]


def _token(name: str) -> str:
    return TOKENS[name][1]


class Gateway:
    """One gateway process from a settings object; `address` once it bound its port."""

    def __init__(self, cfg: GatewaySettings, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "gateway.yaml"
        self.log = folder / "gateway.log"
        self.port_file = folder / "gateway.port"
        cfg.server = ServerConfig(host="127.0.0.1", port=0, port_file=self.port_file, grace_s=1.0)
        cfg.db_path = folder / "reports.sqlite"
        write_yaml(cfg, self.config)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edgeinspect.services.gateway", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.address = ""

    def wait_bound(self) -> str:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            if self.port_file.is_file() and self.port_file.read_text().strip():
                self.address = f"127.0.0.1:{int(self.port_file.read_text())}"
                return self.address
            time.sleep(0.1)
        raise AssertionError(f"the gateway did not bind within {START_S}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _settings(embedded_stack, **update) -> GatewaySettings:
    cfg = GatewaySettings.load(embedded_stack.role("gateway").config_path)
    return cfg.model_copy(update=update)


@pytest.fixture(scope="module")
def gateway(embedded_stack, tmp_path_factory):
    gw = Gateway(
        _settings(embedded_stack, api_tokens=_entries(), token_burst=2, token_rate_per_s=50.0),
        tmp_path_factory.mktemp("gw-tokens"),
    )
    try:
        gw.wait_bound()
        _wait_serving(gw.address)
        yield gw
    finally:
        gw.stop()


def _wait_serving(address: str) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + START_S
    with grpc.insecure_channel(address) as ch:
        while time.monotonic() < deadline:
            try:
                if health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise AssertionError(f"{address} not SERVING within {START_S}s")


def _call(address: str, method: str, request, token: str | None, timeout: float = 60):
    with grpc.insecure_channel(address) as ch:
        stub = inspection_pb2_grpc.InspectionServiceStub(ch)
        md = [("authorization", f"Bearer {token}")] if token else []
        return getattr(stub, method).with_call(request, metadata=md, timeout=timeout)


def _inspect_request(image: bytes | None = None, max_new_tokens: int = 4) -> inspection_pb2.InspectRequest:
    return inspection_pb2.InspectRequest(
        image=asset_path("part_ok.jpg").read_bytes() if image is None else image, max_new_tokens=max_new_tokens
    )


def _refused(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value


def test_a_read_token_cannot_inspect_but_lists_and_gets(gateway):
    err = _refused(lambda: _call(gateway.address, "Inspect", _inspect_request(), _token("qa")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err.details()
    assert "read token may not call Inspect" in err.details()
    report, _ = _call(gateway.address, "Inspect", _inspect_request(), _token("line-3"))
    listed, _ = _call(gateway.address, "ListReports", inspection_pb2.ListReportsRequest(), _token("qa"))
    assert report.report_id in [r.report_id for r in listed.reports]
    got, _ = _call(
        gateway.address, "GetReport", inspection_pb2.GetReportRequest(report_id=report.report_id), _token("qa")
    )
    assert got.report_id == report.report_id


def test_an_inspect_token_inspects_and_an_admin_token_may_do_everything(gateway):
    report, _ = _call(gateway.address, "Inspect", _inspect_request(), _token("line-3"))
    assert report.report_id and len(report.generated_token_ids) > 0
    again, _ = _call(gateway.address, "Inspect", _inspect_request(), _token("ops"))
    assert again.report_id
    listed, _ = _call(gateway.address, "ListReports", inspection_pb2.ListReportsRequest(), _token("ops"))
    assert len(listed.reports) >= 2


@pytest.mark.parametrize(
    ("token", "words"),
    [(None, "missing bearer token"), ("ei_nobody-has-this", "invalid token"), (_token("old"), "revoked")],
)
def test_missing_unknown_and_revoked_tokens_are_unauthenticated(gateway, token, words):
    err = _refused(lambda: _call(gateway.address, "ListReports", inspection_pb2.ListReportsRequest(), token))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert words in err.details()


def test_a_token_over_its_rate_gets_pushback_and_another_token_is_unaffected(gateway):
    request = inspection_pb2.ListReportsRequest()
    for _ in range(2):  # the burst
        _call(gateway.address, "ListReports", request, _token("slow"))
    err = _refused(lambda: _call(gateway.address, "ListReports", request, _token("slow")))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    pushback = dict(err.trailing_metadata())["grpc-retry-pushback-ms"]
    assert 1000 <= int(pushback) <= 5000  # 0.2 calls/s: about 5 s until the next one
    for _ in range(2):  # the same burst, from another token, at the same moment
        _call(gateway.address, "ListReports", request, _token("qa"))


def test_a_gateway_with_no_tokens_refuses_to_start(embedded_stack, tmp_path):
    gw = Gateway(_settings(embedded_stack, api_tokens=[]), tmp_path)
    try:
        assert gw.proc.wait(START_S) == 1
    finally:
        gw.stop()
    log = gw.log.read_text()
    assert "no api_tokens configured" in log and "allow_unauthenticated" in log
    assert not gw.port_file.exists()


@pytest.fixture(scope="module")
def open_gateway(embedded_stack, tmp_path_factory):
    """allow_unauthenticated with no tokens; its vision is an address where nothing listens (UNAVAILABLE)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    gw = Gateway(
        _settings(embedded_stack, api_tokens=[], allow_unauthenticated=True, vision=dead, upstream_timeout_s=5),
        tmp_path_factory.mktemp("gw-open"),
    )
    try:
        gw.wait_bound()
        yield gw
    finally:
        gw.stop()


def test_allow_unauthenticated_serves_callers_without_a_token(open_gateway):
    listed, _ = _call(open_gateway.address, "ListReports", inspection_pb2.ListReportsRequest(), None)
    assert list(listed.reports) == []
    assert "allow_unauthenticated is set" in open_gateway.log.read_text()


def _raw_inspect(address: str, payload: bytes, token: str):
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary("/edgeinspect.v1.InspectionService/Inspect")
        return call(payload, metadata=[("authorization", f"Bearer {token}")], timeout=30)


# Every status the public API answers with, each caused for real.
ERROR_CASES = {
    "UNAUTHENTICATED": lambda g, o: _call(g.address, "ListReports", inspection_pb2.ListReportsRequest(), "ei_wrong"),
    "PERMISSION_DENIED": lambda g, o: _call(g.address, "Inspect", _inspect_request(), _token("qa")),
    "RESOURCE_EXHAUSTED": lambda g, o: [
        _call(g.address, "ListReports", inspection_pb2.ListReportsRequest(), _token("slow")) for _ in range(4)
    ],
    "INVALID_ARGUMENT:image": lambda g, o: _call(
        g.address, "Inspect", _inspect_request(b"not an image"), _token("ops")
    ),
    "INVALID_ARGUMENT:bytes": lambda g, o: _raw_inspect(g.address, b"\xff\xff\xff\x0f", _token("ops")),
    "INVALID_ARGUMENT:page": lambda g, o: _call(
        g.address, "ListReports", inspection_pb2.ListReportsRequest(page_size=10**6), _token("ops")
    ),
    "NOT_FOUND": lambda g, o: _call(
        g.address, "GetReport", inspection_pb2.GetReportRequest(report_id="r-x"), _token("ops")
    ),
    "UNAVAILABLE": lambda g, o: _call(o.address, "Inspect", _inspect_request(), None),
    # a deadline far below the work asked for (four gRPC hops, 64 tokens): a fast box finished 4 tokens in 50 ms
    "DEADLINE_EXCEEDED": lambda g, o: _call(
        g.address, "Inspect", _inspect_request(max_new_tokens=64), _token("ops"), timeout=0.01
    ),
    "UNIMPLEMENTED": lambda g, o: grpc.insecure_channel(g.address).unary_unary(
        "/edgeinspect.v1.InspectionService/Nope"
    )(b"", timeout=10),
}
LEAKS = {
    "loopback address": re.compile(r"127\.0\.0\.1|localhost|::1"),
    "an address or port": re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b|:\d{2,5}\b|ipv[46]:"),
    "a file path": re.compile(r"(?<![\w/])(?:/[\w.@+~-]+){2,}"),
    "a Python exception name": re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception)\b|Traceback"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_no_error_the_public_api_returns_leaks_internals(gateway, open_gateway, case):
    err = _refused(lambda: ERROR_CASES[case](gateway, open_gateway))
    assert err.code().name == case.split(":")[0], err.details()
    details = err.details() or ""
    assert details, "a refusal says why"
    for what, pattern in LEAKS.items():
        assert not pattern.search(details), f"{case}: {what} in {details!r}"


# Authentication before parsing: bytes that are no InspectRequest (a truncated varint) reach the parser only after
# the caller checks passed, so an unauthenticated caller cannot probe the parser.
GARBAGE = b"\xff\xff\xff\x0f"


def _raw(address: str, method: str, payload: bytes, token: str | None):
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary(f"/edgeinspect.v1.InspectionService/{method}")  # no serializers: bytes as they are
        return call(payload, metadata=[("authorization", f"Bearer {token}")] if token else [], timeout=30)


@pytest.mark.parametrize("token", [None, "ei_nobody-has-this", _token("old")])
def test_a_malformed_body_without_a_valid_token_is_unauthenticated(gateway, token):
    err = _refused(lambda: _raw(gateway.address, "Inspect", GARBAGE, token))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err.details()
    assert "InspectRequest" not in (err.details() or "")


def test_a_malformed_body_with_an_inspect_token_is_invalid_argument(gateway):
    err = _refused(lambda: _raw(gateway.address, "Inspect", GARBAGE, _token("line-3")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "not a valid edgeinspect.v1.InspectRequest" in err.details()


@pytest.mark.parametrize(
    ("method", "token"), [("ReviewReport", "line-3"), ("AddToGoodSet", "line-3"), ("Inspect", "qa")]
)
def test_a_malformed_body_to_a_method_the_role_may_not_call_is_permission_denied(gateway, method, token):
    err = _refused(lambda: _raw(gateway.address, method, GARBAGE, _token(token)))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err.details()
    assert f"may not call {method}" in err.details()
