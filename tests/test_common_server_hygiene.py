"""The shared server stack refuses what it must: a taken port, bytes that are no message, details too long for a
trailer; RESOURCE_EXHAUSTED carries the retry pushback. Real grpc.aio servers on 127.0.0.1, real clients."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import grpc
import pytest

from edgeinspect.config import ServerConfig
from edgeinspect.errors import InvalidInput, ResourceExhausted, Unavailable
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.context import REQUEST_ID_KEY
from edgeinspect.services.common.errors import MAX_DETAILS_CHARS, RETRY_PUSHBACK_KEY
from edgeinspect.services.common.server import RunningServer, start_server
from edgeinspect.v1 import retrieval_pb2, retrieval_pb2_grpc, stage_pb2, stage_pb2_grpc

RETRIEVAL = retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name
STAGE = stage_pb2.DESCRIPTOR.services_by_name["DecoderStage"].full_name


class EchoRetrieval(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Search: "full" is RESOURCE_EXHAUSTED; any other query is refused, echoed back in the message."""

    async def Search(self, request, context):
        if request.query == "full":
            raise ResourceExhausted("index busy: 4 of 4 searches running", retry_after_ms=250)
        raise InvalidInput(f"no such part: {request.query}")


class CountingStage(stage_pb2_grpc.DecoderStageServicer):
    """Forward: one answer per request, holding the number of steps it had."""

    async def Forward(self, request_iterator, context):
        async for request in request_iterator:
            yield stage_pb2.StepResponse(results=[stage_pb2.SessionResult(cached_length=len(request.steps))])


async def _start(port: int = 0) -> RunningServer:
    return await start_server(
        [
            lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(EchoRetrieval(), s),
            lambda s: stage_pb2_grpc.add_DecoderStageServicer_to_server(CountingStage(), s),
        ],
        [RETRIEVAL, STAGE],
        ServerConfig(host="127.0.0.1", port=port),
        role="test",
    )


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    running = await _start()
    yield running
    await running.stop(0)


async def test_a_second_server_on_a_taken_port_fails_naming_the_port(server):
    with pytest.raises(Unavailable, match=f"port {server.port} is in use"):
        second = await _start(server.port)
        await second.stop(0)  # only reached if the bind wrongly succeeded


async def test_a_port_held_by_another_program_fails_the_start_naming_it():
    with socket.socket() as sock:  # a plain listener without SO_REUSEPORT, as any other program's
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(Unavailable, match=f"port {port} is in use"):
            await _start(port)


async def _raw_unary(port: int, method: str, payload: bytes) -> grpc.aio.AioRpcError:
    async with make_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(payload, timeout=10)
    return info.value


@pytest.mark.parametrize("payload", [b"\xff\xff\xff\xff", b"\x0a\xff\x01abc", b"\x12" * 7])
async def test_bytes_that_are_no_message_are_invalid_argument_naming_the_message(server, payload):
    err = await _raw_unary(server.port, f"/{RETRIEVAL}/Search", payload)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "the request is not a valid edgeinspect.v1.SearchRequest message"
    assert REQUEST_ID_KEY in dict(err.trailing_metadata())
    async with make_channel(f"127.0.0.1:{server.port}") as channel:  # the server serves the next good request
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(retrieval_pb2.SearchRequest(query="x"))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and info.value.details() == "no such part: x"


async def test_a_malformed_message_in_a_stream_ends_it_invalid_argument_after_the_good_ones(server):
    good = stage_pb2.StepRequest(steps=[stage_pb2.SessionStep(session_id="a")]).SerializeToString()
    async with make_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_stream(f"/{STAGE}/Forward", request_serializer=None, response_deserializer=None)(
            timeout=10
        )
        await call.write(good)
        assert stage_pb2.StepResponse.FromString(await call.read()).results[0].cached_length == 1
        await call.write(b"\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "the request is not a valid edgeinspect.v1.StepRequest message"


async def test_a_huge_echoed_value_is_cut_to_a_bounded_message(server):
    async with make_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(
                retrieval_pb2.SearchRequest(query="Z" * (1 << 20)), timeout=10
            )
    err = info.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT  # not a transport error about trailer size
    assert len(err.details()) <= MAX_DETAILS_CHARS
    assert err.details().startswith("no such part: ZZZ") and f"{(1 << 20) + 14} characters" in err.details()


async def test_resource_exhausted_carries_the_retry_pushback_and_the_request_id(server):
    async with make_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(
                retrieval_pb2.SearchRequest(query="full"), timeout=10
            )
    err = info.value
    trailers = dict(err.trailing_metadata())
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == "index busy: 4 of 4 searches running"
    assert trailers[RETRY_PUSHBACK_KEY] == "250" and trailers[REQUEST_ID_KEY]
