"""Hypothesis fuzz of the public InspectionService and of every internal service, against real servers in their
own processes (the embedded stack: gateway, vision, two stages; plus a retrieval node over the sample specs).

Each method gets generated well-typed messages (every field at its edges: descriptor-driven, tests/fuzz_protos.py)
and raw bytes on the wire. Every answer must carry an expected status (never INTERNAL or UNKNOWN) and details
without exception class names or our addresses; after each batch the server serves a good request. Examples are
derandomized, so a run is reproducible and a case that fails in another owner's code is pinned as a strict xfail
(naming the owner and the input) until that fix flips it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
import pytest
from fuzz_protos import EXCEPTION_NAME, messages, raw_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinspect.config import ServerConfig, write_yaml
from edgeinspect.services.common.channel import wait_for_serving
from edgeinspect.services.common.errors import RETRY_PUSHBACK_KEY
from edgeinspect.services.retrieval.settings import RetrievalSettings
from edgeinspect.v1 import (
    inspection_pb2,
    retrieval_pb2,
    retrieval_pb2_grpc,
    stage_pb2,
    stage_pb2_grpc,
    vision_pb2,
    vision_pb2_grpc,
)

pytestmark = pytest.mark.e2e

EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # the fuzz's own 20 s bound on one call
    grpc.StatusCode.UNAVAILABLE,  # e.g. a gateway hop refused; a crash shows in the good request after the batch
}
CALL_TIMEOUT_S = 20.0

SERVICES = {
    "gateway": inspection_pb2.DESCRIPTOR.services_by_name["InspectionService"],
    "vision": vision_pb2.DESCRIPTOR.services_by_name["VisionService"],
    "stage0": stage_pb2.DESCRIPTOR.services_by_name["DecoderStage"],
    "stage1": stage_pb2.DESCRIPTOR.services_by_name["DecoderStage"],
    "retrieval": retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"],
}
TARGETS = [
    *(("gateway", m.name) for m in SERVICES["gateway"].methods),
    ("vision", "Encode"),
    ("vision", "Info"),
    *(("stage0", m) for m in ("Handshake", "Forward", "Stats", "Release")),
    ("stage1", "Forward"),
    ("retrieval", "Search"),
    ("retrieval", "Stats"),
]
# Cases the fuzz finds failing in code this suite's owner does not own: (role, method, kind) -> reason. Each is
# strict: the owner's fix turns it into a pass, which fails here until the entry is removed.
KNOWN: dict[tuple[str, str, str], str] = {}


@dataclass
class Cluster:
    addresses: dict[str, str]
    token: str

    @property
    def ports(self) -> list[str]:
        return [a.rsplit(":", 1)[1] for a in self.addresses.values()]


@pytest.fixture(scope="module")
def retrieval_node(sample_kb, tmp_path_factory):
    folder = tmp_path_factory.mktemp("retrieval-fuzz")
    cfg = RetrievalSettings(
        kb_dir=sample_kb, log_json=False, server=ServerConfig(host="127.0.0.1", port=0, port_file=folder / "port")
    )
    write_yaml(cfg, folder / "retrieval.yaml")
    with (folder / "retrieval.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinspect.services.retrieval", "--config", str(folder / "retrieval.yaml")],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while not (folder / "port").is_file():
            assert proc.poll() is None, (folder / "retrieval.log").read_text()
            assert time.monotonic() < deadline, "retrieval node wrote no port file"
            time.sleep(0.1)
        address = f"127.0.0.1:{(folder / 'port').read_text().strip()}"
        asyncio.run(wait_for_serving(address, 180))  # health SERVING: the index is loaded
        with grpc.insecure_channel(address) as channel:
            _good("retrieval", channel, "")
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def cluster(embedded_stack, retrieval_node) -> Cluster:
    stack = embedded_stack
    addresses = {
        "gateway": stack.gateway_address,
        "vision": stack.address_of("vision"),
        "stage0": stack.stage_endpoints(0)[0],
        "stage1": stack.stage_endpoints(1)[0],
        "retrieval": retrieval_node,
    }
    return Cluster(addresses, stack.api_token)


def _metadata(role: str, token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),) if role == "gateway" and token else ()


def _good(role: str, channel: grpc.Channel, token: str) -> None:
    """One good request the role must answer OK (it still serves after what the fuzz sent)."""
    if role == "gateway":
        request = inspection_pb2.ListReportsRequest(page_size=1)
        err = _call(channel, role, "ListReports", request, token, raw=False)
        assert err is None, f"gateway: a good ListReports failed after the fuzz: {err.code().name} {err.details()}"
    elif role == "vision":
        vision_pb2_grpc.VisionServiceStub(channel).Info(vision_pb2.InfoRequest(), timeout=CALL_TIMEOUT_S)
    elif role.startswith("stage"):
        stats = stage_pb2_grpc.DecoderStageStub(channel).Stats(stage_pb2.StatsRequest(), timeout=CALL_TIMEOUT_S)
        assert stats.identity.checkpoint_fingerprint
    else:
        request = retrieval_pb2.SearchRequest(query="scratch on the housing", k=1)
        retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(request, timeout=CALL_TIMEOUT_S)


def _check(err: grpc.RpcError | None, cluster: Cluster, what: str) -> None:
    if err is None:
        return
    code, details = err.code(), err.details() or ""
    assert code in EXPECTED, f"{what}: {code.name} {details!r}"
    assert not EXCEPTION_NAME.search(details), f"{what}: exception name in details {details!r}"
    assert "127.0.0.1" not in details and not any(f":{p}" in details for p in cluster.ports), (
        f"{what}: an address in details {details!r}"
    )


def _pushback_s(err: grpc.RpcError | None) -> float | None:
    if err is None or err.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    ms = dict(err.trailing_metadata() or ()).get(RETRY_PUSHBACK_KEY)
    return None if ms is None else min(int(ms) / 1e3, 2.0)


def _call(channel: grpc.Channel, role: str, method: str, payload, token: str, raw: bool):
    """Sends one request, again after the server's pushback when it says it is full (the gateway rate-limits
    each token: a fuzz that ignored it would test the limiter only); returns the last RpcError or None."""
    for _ in range(8):
        err = _call_once(channel, role, method, payload, token, raw)
        if (wait := _pushback_s(err)) is None:
            return err
        time.sleep(wait)
    return err


def _call_once(channel: grpc.Channel, role: str, method: str, payload, token: str, raw: bool):
    """Sends one request (a message, a list of them for client streams, or raw bytes); returns the RpcError."""
    desc = SERVICES[role].methods_by_name[method]
    path = f"/{SERVICES[role].full_name}/{method}"
    serializer = None if raw else (lambda m: m.SerializeToString())
    md = _metadata(role, token)
    try:
        if desc.client_streaming:
            items = payload if isinstance(payload, list) else [payload]
            call = channel.stream_stream(path, request_serializer=serializer, response_deserializer=None)
            for _ in call(iter(items), metadata=md, timeout=CALL_TIMEOUT_S):
                pass
        elif desc.server_streaming:
            call = channel.unary_stream(path, request_serializer=serializer, response_deserializer=None)
            for _ in call(payload, metadata=md, timeout=CALL_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path, request_serializer=serializer, response_deserializer=None)(
                payload, metadata=md, timeout=CALL_TIMEOUT_S
            )
    except grpc.RpcError as err:
        return err
    return None


def _strategy(role: str, method: str, kind: str) -> st.SearchStrategy:
    desc = SERVICES[role].methods_by_name[method]
    one = raw_bytes() if kind == "raw" else messages(desc.input_type)
    return st.lists(one, min_size=1, max_size=3) if desc.client_streaming else one


def _fuzz(cluster: Cluster, role: str, method: str, kind: str, examples: int) -> None:
    channel = grpc.insecure_channel(cluster.addresses[role], options=[("grpc.max_receive_message_length", 64 << 20)])
    sent = 0
    try:

        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(payload=_strategy(role, method, kind), with_token=st.booleans() if role == "gateway" else st.just(True))
        def one(payload, with_token: bool) -> None:
            nonlocal sent
            err = _call(channel, role, method, payload, cluster.token if with_token else "", kind == "raw")
            _check(err, cluster, f"{role}.{method} {kind} {payload!r:.300}")
            sent += 1
            if sent % 50 == 0:
                _good(role, channel, cluster.token)

        one()
        _good(role, channel, cluster.token)  # the batch is over: the server still serves
    finally:
        channel.close()


def _cases(typed: int, raw: int) -> list:
    cases = []
    for role, method in TARGETS:
        for kind, n in (("typed", typed), ("raw", raw)):
            reason = KNOWN.get((role, method, kind))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(role, method, kind, n, marks=marks, id=f"{role}.{method}.{kind}"))
    return cases


@pytest.mark.parametrize(("role", "method", "kind", "examples"), _cases(typed=20, raw=6))
def test_fuzzed_requests_get_expected_statuses_and_the_server_serves_on(cluster, role, method, kind, examples):
    _fuzz(cluster, role, method, kind, examples)


@pytest.mark.slow
@pytest.mark.parametrize(("role", "method", "kind", "examples"), _cases(typed=220, raw=60))
def test_fuzzed_requests_at_volume(cluster, role, method, kind, examples):
    _fuzz(cluster, role, method, kind, examples)
