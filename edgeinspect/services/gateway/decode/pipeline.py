"""The wire side of one session on one route: Forward streams to the route's stages, steps and pipelined prefill.

The gateway drives every stage (Petals-style): it relays each stage's hidden-state frame, untouched, to the next,
so a failure is always pinned on the stage that failed.
A stage that errors, closes its stream or does not answer within the step's bound raises StageFailure naming it,
so the recovery owner (services/gateway/decode/session.py) knows which endpoint to ban. Nothing here retries.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import grpc

from edgeinspect import codec
from edgeinspect.errors import InvalidInput
from edgeinspect.services.common.context import deadline_remaining, outgoing_metadata
from edgeinspect.services.common.errors import error_code_of
from edgeinspect.services.common.stage_wire import next_stage_step
from edgeinspect.services.gateway.decode.routing import Endpoint
from edgeinspect.services.gateway.decode.step_spans import (
    StepSpans,
    traced_prefill,
    traced_read,
    traced_step,
    traced_write,
)
from edgeinspect.v1 import stage_pb2, tensor_pb2

MAX_KNOWN_PREFIXES = 1024
EOF = grpc.aio.EOF  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's grpc.aio stub omits EOF
# Statuses that say "this stage box is gone or broken", as opposed to "this request is wrong".
STAGE_FAILURE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.NOT_FOUND,  # the stage lost our session (restarted, re-planned)
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


class StageFailure(Exception):
    """Endpoint `endpoint` failed this step: `reason` says how (status, closed stream, stall)."""

    def __init__(self, endpoint: Endpoint, reason: str, code: grpc.StatusCode | None = None):
        super().__init__(f"stage {endpoint.name}: {reason}")
        self.endpoint = endpoint
        self.reason = reason
        self.code = code


class StageRefused(Exception):
    """A stage answered RESOURCE_EXHAUSTED (its KV budget cannot hold the session): not a failure, but full."""

    def __init__(self, endpoint: Endpoint, details: str, retry_after_ms: int):
        super().__init__(details)
        self.endpoint = endpoint
        self.retry_after_ms = retry_after_ms


class PrefixMissed(Exception):
    """A stage no longer holds the prompt prefix this session wanted to start from."""


@dataclass
class StepResult:
    token_id: int
    timings: list[stage_pb2.StageTiming] = field(default_factory=list)
    wire_ms: float = 0.0
    forced_token_ids: list[int] = field(default_factory=list)  # jump-forward: what the grammar forces after token_id

    @property
    def tokens(self) -> list[int]:
        """The step's new tokens: the sampled one, then the forced ones (the next step feeds them all)."""
        return [self.token_id, *self.forced_token_ids]


class MicroBatchGroups:
    """Open sessions per micro-batch group: by default one group per stage, so S groups occupy S stages at once.
    Where stages share one memory bus, one group (lockstep) reads the weights once per pass and can be faster."""

    def __init__(self, groups: int):
        self.sessions = [0] * max(1, groups)

    def join(self) -> int:
        group = min(range(len(self.sessions)), key=self.sessions.__getitem__)
        self.sessions[group] += 1
        return group

    def leave(self, group: int) -> None:
        self.sessions[group] -= 1


class PrefixBook:
    """Prompt prefixes the stages are believed to hold (a stage that evicted one says so and it is forgotten)."""

    def __init__(self) -> None:
        self.known: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self.known

    def remember(self, key: str) -> None:
        self.known[key] = None
        self.known.move_to_end(key)
        while len(self.known) > MAX_KNOWN_PREFIXES:
            self.known.popitem(last=False)

    def forget(self, key: str) -> None:
        self.known.pop(key, None)


def prefix_key(ids: list[int]) -> str:
    """The prefix cache key of a prompt prefix: a hash of its token ids (the stages are bound to one checkpoint)."""
    return hashlib.sha256(array("q", ids).tobytes()).hexdigest()[:32]


@dataclass
class WireOptions:
    codec: codec.Codec
    zstd: bool


class RouteSession:
    """One session's Forward streams through one route; closing them releases the session on every stage."""

    def __init__(self, route: list[Endpoint], session_id: str, opts: WireOptions, group: int, max_positions: int):
        self.route = route
        self.session_id = session_id
        self.opts = opts
        self.group = group
        self.max_positions = max_positions
        self.position = 0
        self.spans = StepSpans()  # tracing: the steps' client spans waiting for their answers (step_spans.py)
        # The request id and the inspection's deadline, passed by hand: these channels have no interceptors.
        self.calls = [ep.stub.Forward(metadata=outgoing_metadata(), timeout=deadline_remaining()) for ep in self.route]

    def cancel(self) -> None:
        for call in self.calls:  # cancellation ends the stage streams, which release the session
            call.cancel()

    async def close(self) -> None:
        """Ends the streams cleanly (the stages release at end of stream)."""
        try:
            for call in self.calls:
                await call.done_writing()
            for call in self.calls:
                while await call.read() is not EOF:  # read(), not `async for`: one API style per call
                    pass
        except grpc.aio.AioRpcError:
            self.cancel()  # a stage that died after the last step: nothing is left to release there

    def _request(self, step: stage_pb2.SessionStep) -> stage_pb2.StepRequest:
        return stage_pb2.StepRequest(
            steps=[step], output_codec=codec.codec_to_proto(self.opts.codec), output_zstd=self.opts.zstd
        )

    def _new_step(self, ids: list[int], position: int, **fields) -> stage_pb2.SessionStep:
        step = stage_pb2.SessionStep(
            session_id=self.session_id, position=position, input_ids=ids, micro_batch=self.group, **fields
        )
        if position == 0 or fields.get("prefix") is not None and position == fields["prefix"].length:
            step.max_positions = self.max_positions  # the session's first step: stages reserve its KV
        return step

    @traced_read
    async def _read(self, k: int, timeout_s: float) -> stage_pb2.StepResponse:
        ep = self.route[k]
        try:
            response = await asyncio.wait_for(self.calls[k].read(), timeout_s)
        except TimeoutError:
            raise StageFailure(ep, f"stalled: no answer within {timeout_s:.1f} s") from None
        except grpc.aio.AioRpcError as exc:
            raise _classify(ep, exc) from None
        if response is EOF:
            raise StageFailure(ep, "closed the stream")
        return response

    @traced_write
    async def _write(self, k: int, request: stage_pb2.StepRequest) -> None:
        try:
            await self.calls[k].write(request)
        except grpc.aio.AioRpcError as exc:
            raise _classify(self.route[k], exc) from None
        except asyncio.InvalidStateError:
            raise StageFailure(self.route[k], "stream already closed") from None

    @traced_step
    async def step(
        self,
        input_ids: list[int],
        visual_tokens: tensor_pb2.TensorFrame | None,
        sampling: stage_pb2.SamplingParams | None,
        timeout_s: float,
        prefix: stage_pb2.PrefixRef | None = None,
        return_logits: bool = False,
    ) -> StepResult:
        """One step through every stage in turn (a decode step, or a prompt sent whole)."""
        step = self._new_step(input_ids, self.position, prefix=prefix, return_logits=return_logits)
        if sampling is not None:
            step.sampling.CopyFrom(sampling)
        if visual_tokens is not None:
            step.visual_tokens.CopyFrom(visual_tokens)
        t0 = time.perf_counter()
        timings: list[stage_pb2.StageTiming] = []
        response = None
        for k in range(len(self.calls)):
            await self._write(k, self._request(step))
            response = await self._read(k, timeout_s)
            timings.extend(response.timings)
            if k + 1 < len(self.calls):
                step = next_stage_step(step, response.results[0].hidden)
        total_ms = (time.perf_counter() - t0) * 1e3
        self.position += len(input_ids)
        self.last_response = response
        result = StepResult(response.results[0].token_id, timings, total_ms - sum(t.compute_ms for t in timings))
        result.forced_token_ids = self._forced(response, sampling)
        return result

    @traced_prefill
    async def prefill(
        self,
        chunks: list[tuple[list[int], tensor_pb2.TensorFrame | None]],
        sampling: stage_pb2.SamplingParams | None,
        timeout_s: float,
        prefix: stage_pb2.PrefixRef | None,
    ) -> StepResult:
        """Prompt chunks from the session's position on, flowing through the stages overlapped: stage k+1 runs chunk c
        while stage k runs chunk c+1, so time to first token approaches 1/S of a whole-prompt step plus one chunk
        per stage. Only the last chunk is sampled from."""
        if len(chunks) == 1:
            ids, frame = chunks[0]
            return await self.step(ids, frame, sampling, timeout_s, prefix)
        steps, position = [], self.position
        for k, (ids, frame) in enumerate(chunks):
            last = k == len(chunks) - 1
            step = self._new_step(ids, position, prefill_chunk=not last, prefix=prefix)
            if last and sampling is not None:
                step.sampling.CopyFrom(sampling)
            if frame is not None:
                step.visual_tokens.CopyFrom(frame)
            steps.append(step)
            position += len(ids)
        t0 = time.perf_counter()
        timings: list[stage_pb2.StageTiming] = []
        responses: list[stage_pb2.StepResponse] = []

        async def feed_first() -> None:
            for step in steps:  # stage 0 reads them one by one as it finishes each chunk
                await self._write(0, self._request(step))

        async def relay(k: int) -> None:
            """Reads stage k's answers in order and hands each chunk's hidden states to stage k + 1."""
            for step in steps:
                response = await self._read(k, timeout_s)
                timings.extend(response.timings)
                if k + 1 == len(self.calls):
                    responses.append(response)
                else:
                    await self._write(k + 1, self._request(next_stage_step(step, response.results[0].hidden)))

        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the other relays
                group.create_task(feed_first())
                for k in range(len(self.calls)):
                    group.create_task(relay(k))
        except BaseExceptionGroup as failed:
            raise primary_error(failed.exceptions) from None
        total_ms = (time.perf_counter() - t0) * 1e3
        self.position = position
        # Stages overlap, so "not computing" is wall time minus the critical path's compute, not minus the sum.
        busiest = max(sum(t.compute_ms for t in timings if t.stage == name) for name in {t.stage for t in timings})
        result = StepResult(responses[-1].results[0].token_id, timings, max(total_ms - busiest, 0.0))
        result.forced_token_ids = self._forced(responses[-1], sampling)
        return result

    def _forced(self, response: stage_pb2.StepResponse, sampling: stage_pb2.SamplingParams | None) -> list[int]:
        """The last stage's jump-forward tokens, never more than asked for: its grammar matcher has accepted them
        all, so a stage that sent more would hold a state the caches do not (answered as that stage's failure)."""
        forced = list(response.results[0].forced_token_ids)
        asked = sampling.max_forced_tokens if sampling is not None else 0
        if len(forced) > asked:
            raise StageFailure(self.route[-1], f"returned {len(forced)} forced tokens, {asked} asked for")
        return forced


def primary_error(errors) -> BaseException:
    """The error that ended a prefill's relays: a prefix miss or a full stage over the failures it caused in the
    other relays (a write to a stream the error already closed)."""
    for kind in (PrefixMissed, StageRefused):
        for exc in errors:
            if isinstance(exc, kind):
                return exc
    return next((e for e in errors if not isinstance(e, asyncio.CancelledError)), errors[0])


def _classify(ep: Endpoint, exc: grpc.aio.AioRpcError) -> Exception:
    """A stage's error as the recovery owner needs it: a failure of the box, a full box, a prefix miss, or an
    error in what we sent (re-raised as is: another route would refuse it too)."""
    code = exc.code()
    if error_code_of(exc) == "prefix_cache_miss":
        return PrefixMissed(exc.details())
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        pushback = 1000
        for key, value in exc.trailing_metadata() or ():
            if key == "grpc-retry-pushback-ms":
                pushback = int(value)
        return StageRefused(ep, exc.details() or "stage full", pushback)
    if code in STAGE_FAILURE_CODES:
        return StageFailure(ep, f"{code.name}: {exc.details() or ''}".rstrip(": "), code)
    return exc


def prompt_chunks(
    input_ids: list[int],
    frame: tensor_pb2.TensorFrame | None,
    chunk_tokens: int,
    image_token_id: int,
) -> list[tuple[list[int], tensor_pb2.TensorFrame | None]]:
    """Splits a prompt into chunks of at most `chunk_tokens` ids, each with the visual tokens of its own image
    placeholders. A prompt that fits one chunk travels with the frame as received; otherwise each chunk gets its
    rows cut from the frame's codec bytes (codec.split_rows: the same values, no decode in the gateway)."""
    if chunk_tokens <= 0 or len(input_ids) <= chunk_tokens:
        return [(list(input_ids), frame)]
    parts = [list(input_ids[s : s + chunk_tokens]) for s in range(0, len(input_ids), chunk_tokens)]
    if frame is None:
        return [(ids, None) for ids in parts]
    check_visual_count(tuple(frame.shape), input_ids, image_token_id)
    counts = [sum(1 for i in ids if i == image_token_id) for ids in parts]
    rows = iter(codec.split_rows(frame, [n for n in counts if n], name="visual tokens"))
    return [(ids, next(rows) if n else None) for ids, n in zip(parts, counts, strict=True)]


def check_visual_count(shape: tuple[int, ...], input_ids: list[int], image_token_id: int) -> None:
    """The one check that the visual tokens fill the prompt's image placeholders exactly."""
    slots = sum(1 for i in input_ids if i == image_token_id)
    if len(shape) != 2 or shape[0] != slots:
        raise InvalidInput(f"visual tokens {list(shape)} do not fit the prompt's {slots} image placeholders")
