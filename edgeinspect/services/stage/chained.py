"""Chained mode's transport: a stage that computes a request sends it on to the next stage itself, on one
long-lived Forward stream per upstream stream, and relays the next stage's answers back in request order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from edgeinspect.errors import Unavailable
from edgeinspect.services.common.channel import make_channel
from edgeinspect.v1 import stage_pb2, stage_pb2_grpc


class Downstream:
    """One Forward stream to the next stage, opened on first use, for one upstream stream."""

    def __init__(self, address: str, max_message_mb: int):
        self.address = address
        self.max_message_mb = max_message_mb
        self.channel = None
        self.call = None

    async def write(self, request: stage_pb2.StepRequest) -> None:
        if self.call is None:
            self.channel = make_channel(self.address, self.max_message_mb)
            self.call = stage_pb2_grpc.DecoderStageStub(self.channel).Forward()
        await self.call.write(request)

    async def read(self) -> stage_pb2.StepResponse:
        response = await self.call.read()
        if response is grpc.aio.EOF:
            raise Unavailable(f"next stage {self.address} closed the stream")
        return response

    async def close(self) -> None:
        call, channel, self.call, self.channel = self.call, self.channel, None, None
        if call is not None:
            call.cancel()
        if channel is not None:
            await channel.close()


async def relay(
    requests: AsyncIterator[stage_pb2.StepRequest],
    downstream: Downstream,
    compute: Callable[[stage_pb2.StepRequest], Awaitable[tuple[stage_pb2.StepRequest, stage_pb2.StageTiming]]],
) -> AsyncIterator[stage_pb2.StepResponse]:
    """Computes each request (`compute`: the request for the next stage and this stage's timing) and sends it on
    at once, without waiting for the next stage's answer, so the next stage works on chunk c while this one
    computes chunk c + 1 (pipelined prefill). Answers come back from downstream in request order."""
    sent: asyncio.Queue = asyncio.Queue()  # per request sent on: its timing; then None at the end, or the error

    async def compute_and_send() -> None:
        try:
            async for request in requests:
                onward, timing = await compute(request)
                await downstream.write(onward)
                sent.put_nowait(timing)
            sent.put_nowait(None)
        except Exception as exc:  # noqa: BLE001 (ends the stream with this error after earlier answers)
            sent.put_nowait(exc)

    task = asyncio.get_running_loop().create_task(compute_and_send())
    try:
        while (item := await sent.get()) is not None:
            if isinstance(item, Exception):
                raise item
            response = await downstream.read()
            response.timings.insert(0, item)
            yield response
    finally:
        task.cancel()


async def release_downstream(address: str, max_message_mb: int, request: stage_pb2.ReleaseRequest) -> None:
    """Passes a Release on to the next stage (which passes it on in turn)."""
    async with make_channel(address, max_message_mb) as channel:
        await stage_pb2_grpc.DecoderStageStub(channel).Release(request)
