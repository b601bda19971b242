"""HTTP health in the KServe v2 / Triton convention on every role's metrics port: /v2/health/live answers while
the process does, /v2/health/ready is 200 exactly when the role's grpc.health.v1 status is SERVING (the real
embedded stack: a gateway whose stages die goes NOT_SERVING, and its ready endpoint with it)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.services.common.metrics import serve_metrics
from edgeinspect.stack.launcher import LocalStack, StackOptions

SERVING = health_pb2.HealthCheckResponse.SERVING


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def grpc_status(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3).status
        except grpc.RpcError:
            return health_pb2.HealthCheckResponse.UNKNOWN


def health_url(stack: LocalStack, name: str, which: str) -> str:
    return stack.metrics_url(name).removesuffix("/metrics") + f"/v2/health/{which}"


def test_ready_follows_the_readiness_callable_and_metrics_stay_served():
    state = {"ready": False}
    running = serve_metrics(0, "127.0.0.1", ready=lambda: state["ready"])
    base = f"http://127.0.0.1:{running.port}"
    try:
        assert http_status(f"{base}/v2/health/live") == 200
        assert http_status(f"{base}/v2/health/ready") == 503
        state["ready"] = True
        assert http_status(f"{base}/v2/health/ready") == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as reply:
            assert b"edgeinspect_rpc_requests" in reply.read()
    finally:
        running.close()


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory):
    opts = StackOptions(workdir=tmp_path_factory.mktemp("health"), checkpoint=tiny_checkpoint, stages=2)
    with LocalStack(opts) as s:
        yield s


def test_every_role_serves_live_and_ready_agreeing_with_grpc_health(stack):
    for role in stack.roles:
        assert grpc_status(stack.address_of(role.name)) == SERVING, role.name
        assert http_status(health_url(stack, role.name, "live")) == 200, role.name
        assert http_status(health_url(stack, role.name, "ready")) == 200, role.name


def test_gateway_ready_flips_to_503_when_its_stages_die_and_back_when_they_return(stack):
    gateway = stack.address_of("gateway")
    killed = time.monotonic()
    stack.kill("stage0")
    stack.kill("stage1")
    while http_status(health_url(stack, "gateway", "ready")) == 200:
        assert time.monotonic() - killed < 4.0, "gateway still ready 4 s after both stages died"  # target: 2 s
        time.sleep(0.05)
    flipped = time.monotonic() - killed
    assert grpc_status(gateway) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert http_status(health_url(stack, "gateway", "live")) == 200  # alive, only not ready
    print(f"gateway NOT_SERVING / ready 503 {flipped:.2f} s after the first kill")

    stack.restart("stage0")
    stack.restart("stage1")
    deadline = time.monotonic() + 60
    while http_status(health_url(stack, "gateway", "ready")) != 200:
        assert time.monotonic() < deadline, "gateway not ready again 60 s after its stages returned"
        time.sleep(0.2)
    assert grpc_status(gateway) == SERVING
