"""Traces: one inspection through a real stack (every role its own process, JSONL export) is one trace, with
spans from the gateway, vision, retrieval and both stages, parented hop to hop and carrying the request id."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.assets import asset_path
from edgeinspect.config import TracingConfig
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.common.tracing import setup_tracing
from edgeinspect.stack.launcher import LocalStack, StackOptions

DECODE_EVERY = 3
NEW_TOKENS = 10
ROOT = "edgeinspect.v1.InspectionService/Inspect"


def read_spans(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_serving(address: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"{address} not SERVING within {timeout_s}s"
            time.sleep(0.3)


def trace_of(path: Path, request_id: str, timeout_s: float = 20.0) -> list[dict]:
    """The spans of the trace whose root carries `request_id`, once the root (which ends last) is written."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = read_spans(path)
        roots = [s for s in spans if s["name"] == ROOT and s["attributes"].get("edgeinspect.request_id") == request_id]
        if roots:
            return [s for s in spans if s["trace_id"] == roots[0]["trace_id"]]
        assert time.monotonic() < deadline, f"no root span with request id {request_id} in {path}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def traced(tiny_checkpoint, sample_kb, tmp_path_factory):
    """A stack of its own with tracing on in every role (JSONL, one file): vision, 2 stages, retrieval, gateway."""
    work = tmp_path_factory.mktemp("traced")
    spans = work / "spans.jsonl"
    env = {
        "EDGEINSPECT_TRACING__EXPORTER": "jsonl",
        "EDGEINSPECT_TRACING__JSONL_PATH": str(spans),
        "EDGEINSPECT_TRACING__DECODE_EVERY": str(DECODE_EVERY),
        "EDGEINSPECT_PREFILL_CHUNK_TOKENS": "32",  # several prompt chunks per prefill
    }
    opts = StackOptions(
        workdir=work, checkpoint=tiny_checkpoint, stages=2, kb_dir=sample_kb, extra_env=env, metrics=False
    )
    with LocalStack(opts) as stack:
        wait_serving(stack.address_of("retrieval"), timeout_s=180)  # the gateway serves before the index loads
        yield stack, spans


def inspect(stack) -> object:
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        image = asset_path("part_scratch.jpg").read_bytes()
        return client.inspect(image, station="s3", part="HSG-200", max_new_tokens=NEW_TOKENS)


def test_one_inspection_is_one_trace_across_every_role(traced):
    stack, path = traced
    report = inspect(stack)
    spans = trace_of(path, report.request_id)
    by_id = {s["span_id"]: s for s in spans}

    # The request id is the trace id, and every span of the trace carries it.
    assert spans[0]["trace_id"] == report.request_id
    assert {s["attributes"].get("edgeinspect.request_id") for s in spans} == {report.request_id}
    roles = Counter(s["resource"]["edgeinspect.role"] for s in spans)
    assert set(roles) == {"gateway", "vision", "retrieval", "stage"}, roles

    # One root (the gateway's inspection); every other span's parent is in the same trace.
    roots = [s for s in spans if s["parent_span_id"] is None]
    assert [r["name"] for r in roots] == [ROOT] and roots[0]["resource"]["edgeinspect.role"] == "gateway"
    asked = roots[0]["attributes"]
    assert (asked["edgeinspect.station"], asked["edgeinspect.part"]) == ("s3", "HSG-200")
    assert asked["edgeinspect.report_id"] == report.report_id and asked["edgeinspect.verdict"]
    assert all(s["parent_span_id"] in by_id for s in spans if s is not roots[0])

    def parent(span: dict) -> dict:
        return by_id[span["parent_span_id"]]

    # Vision and retrieval: their server spans are children of the gateway's client spans for them.
    encode = [s for s in spans if s["name"] == "edgeinspect.v1.VisionService/Encode"]
    assert len(encode) == 1 and parent(encode[0])["name"] == "vision encode"
    assert parent(parent(encode[0]))["name"] == ROOT
    search = [s for s in spans if s["name"] == "edgeinspect.v1.RetrievalService/Search"]
    assert search and all(parent(s)["name"] == "retrieval search" for s in search)
    assert all(s["resource"]["edgeinspect.role"] == "retrieval" for s in search)

    # Stages: each step span is the child of the gateway's client span of the same message to the same stage.
    steps = [s for s in spans if s["name"] == "stage step"]
    assert len({s["attributes"]["edgeinspect.stage"] for s in steps}) == 2
    assert len({s["resource"]["service.instance.id"] for s in steps}) == 2
    for step in steps:
        sent = parent(step)
        assert sent["name"] == "stage forward" and sent["kind"] == "CLIENT" and step["kind"] == "SERVER"
        assert sent["resource"]["edgeinspect.role"] == "gateway"
        for key in ("edgeinspect.session_id", "edgeinspect.stage", "edgeinspect.position"):
            assert step["attributes"][key] == sent["attributes"][key]
        assert step["attributes"]["edgeinspect.batch_size"] >= 1
        assert parent(sent)["name"] in ("prefill", "decode step")
    # What the gateway sent (visual tokens, hidden states) is what the stage received, byte for byte.
    for step in steps:
        assert (
            step["attributes"]["edgeinspect.codec_bytes_received"]
            == parent(step)["attributes"]["edgeinspect.codec_bytes_sent"]
        )
    assert any(s["attributes"]["edgeinspect.codec_bytes_received"] > 0 for s in steps)

    # The prefill: one span, its prompt in several chunks, each chunk through both stages.
    prefills = [s for s in spans if s["name"] == "prefill"]
    assert len(prefills) == 1 and parent(prefills[0])["name"] == ROOT
    chunks = prefills[0]["attributes"]["edgeinspect.chunks"]
    assert chunks >= 2
    chunk_steps = [s for s in steps if parent(parent(s))["name"] == "prefill"]
    assert len(chunk_steps) == 2 * chunks

    # Decode: every DECODE_EVERY-th step is traced (the first included), through both stages each.
    decodes = [s for s in spans if s["name"] == "decode step"]
    assert decodes and all(d["attributes"]["edgeinspect.decode_step"] % DECODE_EVERY == 0 for d in decodes)
    assert min(d["attributes"]["edgeinspect.decode_step"] for d in decodes) == 0
    for d in decodes:
        assert sum(1 for s in steps if parent(parent(s)) is d) == 2

    # The logs join: the gateway's report line and one line per role the inspection touched carry both ids.
    stored = [x for x in log_lines(stack, "gateway") if x.get("report_id") == report.report_id]
    assert any("stored" in x["event"] and x["trace_id"] == report.request_id for x in stored)
    expected = {"vision": "visual_tokens", "retrieval": "chunks", "stage0": "steps", "stage1": "steps"}
    deadline = time.monotonic() + 10  # a stage logs its line as the gateway closes the stream
    for name, field in expected.items():
        while True:
            mine = [x for x in log_lines(stack, name) if x.get("request_id") == report.request_id and field in x]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert mine, f"{name} logged no line for request {report.request_id}"
        assert all(x["trace_id"] == report.request_id for x in mine)
    stage_lines = [
        x for k in ("stage0", "stage1") for x in log_lines(stack, k) if x.get("request_id") == report.request_id
    ]
    assert all(x["positions"] > 0 and x["session_ids"] for x in stage_lines if "steps" in x)


def log_lines(stack, name: str) -> list[dict]:
    text = stack.role(name).log_path.read_text()
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def test_a_second_inspection_is_another_trace(traced):
    stack, path = traced
    first, second = inspect(stack), inspect(stack)
    a, b = trace_of(path, first.request_id), trace_of(path, second.request_id)
    assert a[0]["trace_id"] != b[0]["trace_id"]
    assert not {s["span_id"] for s in a} & {s["span_id"] for s in b}
    # Health probes and the gateway's polls of the stages start no traces: every root is an inspection.
    assert {s["name"] for s in read_spans(path) if s["parent_span_id"] is None} == {ROOT}


def test_jsonl_exporter_writes_one_span_per_line_with_the_request_id_as_trace_id(tmp_path):
    cfg = TracingConfig(exporter="jsonl", jsonl_path=tmp_path / "{role}.jsonl")
    tracing = setup_tracing(cfg, "unit")
    assert tracing is not None
    token = request_id_var.set("0123456789abcdef0123456789abcdef")
    try:
        with tracing.tracer.start_as_current_span("outer"), tracing.tracer.start_as_current_span("inner"):
            pass
    finally:
        request_id_var.reset(token)
    tracing.shutdown()
    inner, outer = read_spans(tmp_path / "unit.jsonl")
    assert inner["trace_id"] == outer["trace_id"] == "0123456789abcdef0123456789abcdef"
    assert inner["parent_span_id"] == outer["span_id"] and outer["parent_span_id"] is None
    assert outer["resource"]["service.name"] == "edgeinspect-unit"


def test_tracing_is_off_by_default():
    assert setup_tracing(TracingConfig(), "unit") is None


def test_ingest_starts_the_trace_and_the_gateway_joins_it(traced, tmp_path):
    """The ingest role's delivery (its real gRPC sink) opens the trace; the gateway's inspection is its child and
    the request id the gateway stores is the trace id."""
    import asyncio

    from edgeinspect.services.common.tracing import tracing_var
    from edgeinspect.services.ingest.delivery import GrpcReportSink, InspectionJob

    stack, path = traced
    tracing = setup_tracing(TracingConfig(exporter="jsonl", jsonl_path=tmp_path / "ingest.jsonl"), "ingest")
    job = InspectionJob("cam-1", "s3", "HSG-200", asset_path("part_dent.jpg").read_bytes(), time.time(), "frame-1")

    async def deliver():
        sink = GrpcReportSink(stack.gateway_address, stack.api_token, 120.0)
        try:
            return await sink.inspect(job)
        finally:
            await sink.close()

    token = tracing_var.set(tracing)
    try:
        summary = asyncio.run(deliver())
    finally:
        tracing_var.reset(token)
        tracing.shutdown()
    (sent,) = read_spans(tmp_path / "ingest.jsonl")
    assert sent["name"] == "ingest inspect" and sent["kind"] == "CLIENT" and sent["parent_span_id"] is None
    assert sent["attributes"]["edgeinspect.report_id"] == summary.report_id
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        stored = client.get(summary.report_id)
    assert stored.request_id == sent["trace_id"]
    spans = trace_of(path, stored.request_id)
    (root,) = [s for s in spans if s["name"] == ROOT]
    assert root["parent_span_id"] == sent["span_id"] and root["trace_id"] == sent["trace_id"]
    assert {s["resource"]["edgeinspect.role"] for s in spans} == {"gateway", "vision", "retrieval", "stage"}


def test_otlp_exporter_delivers_spans_to_a_collector(tmp_path):
    """A real OTLP/gRPC receiver (the collector's TraceService) gets the spans with their ids and resource."""
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            received.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        tracing = setup_tracing(TracingConfig(exporter="otlp", endpoint=f"http://127.0.0.1:{port}"), "unit")
        assert tracing is not None
        with tracing.tracer.start_as_current_span("collected") as span:
            trace_id = span.get_span_context().trace_id
        tracing.shutdown()  # flushes the batch
    finally:
        server.stop(0)
    spans = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.name for s in spans] == ["collected"]
    assert int.from_bytes(spans[0].trace_id, "big") == trace_id
    resource = {a.key: a.value.string_value for a in received[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "edgeinspect-unit"
