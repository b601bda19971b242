"""The shared server stack end to end: real grpc.aio servers on 127.0.0.1:0, real clients (ours, grpcurl)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.config import ApiToken, ServerConfig, TokenRole
from edgeinspect.errors import InvalidInput, Unavailable
from edgeinspect.services.common.auth import TokenAuthInterceptor, hash_token
from edgeinspect.services.common.channel import make_channel, wait_for_serving
from edgeinspect.services.common.context import REQUEST_ID_KEY, request_id_var
from edgeinspect.services.common.logging import configure_logging
from edgeinspect.services.common.server import RunningServer, serve_until_signal, start_server
from edgeinspect.testing import grpcurl
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, retrieval_pb2, retrieval_pb2_grpc

RETRIEVAL = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name
INSPECTION = inspection_pb2.DESCRIPTOR.services_by_name["InspectionService"].full_name
SERVICE_LOG = logging.getLogger("tests.fake_retrieval")

Starter = Callable[..., Awaitable[RunningServer]]


class FakeRetrieval(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Search: InvalidInput on an empty query, a bug on "bug", else one chunk tagged with the request id."""

    async def Search(self, request, context):
        if not request.query:
            raise InvalidInput("query is empty: send the text to search the specs for")
        if request.query == "bug":
            raise KeyError("secret-internal-detail")
        if request.query == "deadline?":
            left = context.time_remaining()
            return retrieval_pb2.SearchResponse(search_ms=-1.0 if left is None else left * 1e3)
        SERVICE_LOG.info("searching %r", request.query)
        chunk = retrieval_pb2.SpecChunk(chunk_id="c1", text=request.query)
        return retrieval_pb2.SearchResponse(chunks=[chunk], index_version=request_id_var.get())


class FakeInspection(inspection_pb2_grpc.InspectionServiceServicer):
    """InspectStream: one event, then the error named by the station (a streaming handler failing midway)."""

    async def InspectStream(self, request, context):
        yield inspection_pb2.InspectEvent()
        if request.station == "invalid":
            raise InvalidInput("station 'invalid' is not configured")


@pytest.fixture
async def start(tmp_path) -> AsyncIterator[Starter]:
    running: list[RunningServer] = []

    async def _start(
        role: str = "test", interceptors: Sequence[grpc.aio.ServerInterceptor] = (), metrics: bool = False
    ) -> RunningServer:
        cfg = ServerConfig(
            host="127.0.0.1", port=0, metrics_port=0 if metrics else None, port_file=tmp_path / f"{role}.port"
        )
        server = await start_server(
            [
                lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(FakeRetrieval(), s),
                lambda s: inspection_pb2_grpc.add_InspectionServiceServicer_to_server(FakeInspection(), s),
            ],
            [RETRIEVAL, INSPECTION],
            cfg,
            role=role,
            interceptors=interceptors,
        )
        running.append(server)
        return server

    yield _start
    for server in running:
        await server.stop(0)


def unique_role() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


async def search(port: int, query: str, **kwargs) -> retrieval_pb2.SearchResponse:
    async with make_channel(f"127.0.0.1:{port}") as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        return await stub.Search(retrieval_pb2.SearchRequest(query=query, k=3), timeout=10, **kwargs)


async def test_a_normal_search_answers_and_port_file_holds_the_bound_port(start, tmp_path):
    server = await start()
    reply = await search(server.port, "scratch on housing")
    assert [c.text for c in reply.chunks] == ["scratch on housing"]
    assert server.port > 0
    assert (tmp_path / "test.port").read_text().strip() == str(server.port)


async def test_invalid_input_becomes_invalid_argument_with_its_message(start):
    server = await start()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await search(server.port, "")
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "query is empty: send the text to search the specs for"


async def test_a_bug_becomes_internal_without_leaking_its_text(start, caplog):
    server = await start()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await search(server.port, "bug")
    assert info.value.code() is grpc.StatusCode.INTERNAL
    assert "secret-internal-detail" not in info.value.details()
    assert "KeyError" not in info.value.details()
    rid = dict(info.value.trailing_metadata())[REQUEST_ID_KEY]
    assert rid in info.value.details()  # the caller can quote it to whoever reads the server log
    assert any("secret-internal-detail" in r.exc_text for r in caplog.records if r.exc_text)


async def test_a_streaming_handler_failing_midway_keeps_its_messages_and_status(start):
    server = await start()
    async with make_channel(f"127.0.0.1:{server.port}") as channel:
        call = inspection_pb2_grpc.InspectionServiceStub(channel).InspectStream(
            inspection_pb2.InspectRequest(station="invalid"), timeout=10
        )
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for event in call:
                received.append(event)
    assert len(received) == 1
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "station 'invalid' is not configured"


async def test_request_id_travels_from_client_to_server_and_into_json_logs(start):
    stream = io.StringIO()
    configure_logging("INFO", json=True, role="retrieval", stream=stream)
    try:
        server = await start()
        token = request_id_var.set("rid-from-the-gateway")
        try:
            reply = await search(server.port, "dent near the hinge")
        finally:
            request_id_var.reset(token)
    finally:
        root = logging.getLogger()
        for handler in [h for h in root.handlers if getattr(h, "stream", None) is stream]:
            root.removeHandler(handler)
    assert reply.index_version == "rid-from-the-gateway"
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    searched = [line for line in lines if line["logger"] == "tests.fake_retrieval"]
    assert len(searched) == 1
    assert searched[0]["request_id"] == "rid-from-the-gateway"
    assert searched[0]["role"] == "retrieval"
    assert searched[0]["event"] == "searching 'dent near the hinge'"
    assert {"timestamp", "level"} <= searched[0].keys()


async def test_a_call_without_request_id_gets_a_fresh_one_returned_in_trailers(start):
    server = await start()
    async with make_channel(f"127.0.0.1:{server.port}") as channel:
        call = retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(
            retrieval_pb2.SearchRequest(query="x"), timeout=10
        )
        reply = await call
        trailers = dict(await call.trailing_metadata())
    assert len(reply.index_version) == 32
    assert trailers[REQUEST_ID_KEY] == reply.index_version


async def test_bearer_auth_rejects_missing_and_wrong_tokens_and_exempts_health(start):
    tokens = [ApiToken(name=t, role=TokenRole.admin, hash=hash_token(t)) for t in ("s3cret", "other")]
    server = await start(interceptors=[TokenAuthInterceptor(tokens, 100.0, 10)])
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await search(server.port, "x")
    assert missing.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert missing.value.details().startswith("missing bearer token")
    with pytest.raises(grpc.aio.AioRpcError) as wrong:
        await search(server.port, "x", metadata=(("authorization", "Bearer nope"),))
    assert wrong.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert wrong.value.details() == "invalid token"
    reply = await search(server.port, "x", metadata=(("authorization", "Bearer s3cret"),))
    assert reply.chunks[0].text == "x"
    async with make_channel(f"127.0.0.1:{server.port}") as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_no_tokens_and_allow_unauthenticated_admits_everyone(start):
    server = await start(interceptors=[TokenAuthInterceptor([], 100.0, 10, allow_unauthenticated=True)])
    assert (await search(server.port, "x")).chunks[0].text == "x"


async def test_health_starts_not_serving_and_flips_to_serving(start):
    server = await start()
    address = f"127.0.0.1:{server.port}"
    with pytest.raises(Unavailable, match="NOT_SERVING"):
        await wait_for_serving(address, timeout_s=0.3)
    async with make_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=RETRIEVAL), timeout=10)
        first = await watch.read()
        await server.health.set_serving(True)
        second = await watch.read()
        watch.cancel()
        overall = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert first.status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert second.status == health_pb2.HealthCheckResponse.SERVING
    assert overall.status == health_pb2.HealthCheckResponse.SERVING
    await wait_for_serving(address, timeout_s=5)


async def test_wait_for_serving_names_the_address_when_nothing_listens():
    with pytest.raises(Unavailable, match=r"127\.0\.0\.1:1 not SERVING .*UNAVAILABLE"):
        await wait_for_serving("127.0.0.1:1", timeout_s=0.3)


async def test_metrics_endpoint_counts_rpcs_by_role_method_and_code(start):
    role = unique_role()
    server = await start(role=role, metrics=True)
    await search(server.port, "x")
    with pytest.raises(grpc.aio.AioRpcError):
        await search(server.port, "")
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    labels = f'method="Search",role="{role}",service="edgeinspect.v1.RetrievalService"'
    counted = f"edgeinspect_rpc_latency_seconds_count{{{labels}}} 2.0"
    # An aborted call's status reaches the caller before the server's interceptor has counted it (abort sends it,
    # then raises through the interceptor): on a loaded box a scrape can fall between the two, so wait for it.
    deadline = time.monotonic() + 10
    while True:
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
        if counted in text or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    for code in ("OK", "INVALID_ARGUMENT"):
        assert f'edgeinspect_rpc_requests_total{{code="{code}",{labels}}} 1.0' in text
    assert counted in text
    assert "_created" not in text


async def test_an_upstream_error_passes_its_code_through_with_the_peer_named_in_the_log_only(start, caplog):
    """A server calling another (as the gateway calls retrieval) re-raises the upstream status and message; the
    upstream's address goes to the log, never to the caller (issue 15)."""
    upstream = await start(role=unique_role())
    address = f"127.0.0.1:{upstream.port}"

    class Forwarding(retrieval_pb2_grpc.RetrievalServiceServicer):
        async def Search(self, request, context):
            async with make_channel(address) as channel:
                return await retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(request)

    front = await start_server(
        [lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(Forwarding(), s)],
        [RETRIEVAL],
        ServerConfig(host="127.0.0.1", port=0),
        role="front",
    )
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await search(front.port, "")
    finally:
        await front.stop(0)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "query is empty: send the text to search the specs for"
    assert any(address in r.getMessage() for r in caplog.records if "rpc failed" in r.getMessage())


async def test_the_callers_deadline_reaches_the_next_hop_without_being_passed_by_hand(start):
    upstream = await start(role=unique_role())
    address = f"127.0.0.1:{upstream.port}"

    class Forwarding(retrieval_pb2_grpc.RetrievalServiceServicer):
        async def Search(self, request, context):
            async with make_channel(address) as channel:  # no timeout given: the inbound one applies
                return await retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(request)

    front = await start_server(
        [lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(Forwarding(), s)],
        [RETRIEVAL],
        ServerConfig(host="127.0.0.1", port=0),
        role="front",
    )
    try:
        async with make_channel(f"127.0.0.1:{front.port}") as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            bounded = await stub.Search(retrieval_pb2.SearchRequest(query="deadline?"), timeout=3.0)
            unbounded = await stub.Search(retrieval_pb2.SearchRequest(query="deadline?"))
    finally:
        await front.stop(0)
    # grpc rounds deadlines on the wire (3 s arrives as ~3.01 s), hence the slack.
    assert 0 < bounded.search_ms <= 3100
    assert unbounded.search_ms == -1.0


async def test_sigint_stops_the_server_gracefully(start):
    server = await start()
    serving = asyncio.create_task(serve_until_signal(server, grace=1.0))
    await asyncio.sleep(0.1)  # let it install its handlers
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.wait_for(serving, timeout=10)
    assert not server.health.serving
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await search(server.port, "x")
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_stock_grpcurl_lists_services_and_checks_health(start):
    server = await start()
    address = f"127.0.0.1:{server.port}"
    listed = await asyncio.to_thread(grpcurl, "-plaintext", address, "list")
    assert listed.returncode == 0, listed.stderr
    assert {RETRIEVAL, INSPECTION, "grpc.health.v1.Health"} <= set(listed.stdout.split())
    await server.health.set_serving(True)
    checked = await asyncio.to_thread(grpcurl, "-plaintext", "-d", "{}", address, "grpc.health.v1.Health/Check")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout) == {"status": "SERVING"}


async def test_grpcurl_sees_invalid_argument_from_a_real_method(start):
    server = await start()
    result = await asyncio.to_thread(
        grpcurl, "-plaintext", "-d", '{"query": ""}', f"127.0.0.1:{server.port}", f"{RETRIEVAL}/Search"
    )
    assert result.returncode != 0
    assert "InvalidArgument" in result.stderr
    assert "query is empty" in result.stderr
