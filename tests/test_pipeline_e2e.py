"""End to end over loopback gRPC: every role its own OS process, compared against transformers' generate()."""

from __future__ import annotations

import io
import time

import grpc
import pytest
import torch
from PIL import Image

from edgeinspect import PROTOCOL_VERSION, codec
from edgeinspect.assets import asset_path
from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_text
from edgeinspect.services.client import InspectionClient
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.testing import grpcurl
from edgeinspect.v1 import common_pb2, inspection_pb2, inspection_pb2_grpc, stage_pb2, stage_pb2_grpc

NEW_TOKENS = 12
IMAGES = ["part_scratch.jpg", "part_dent.jpg"]
# The references are unconstrained generate(): the gateway's report-schema constraint is off here (it has its own
# oracle in test_structured_reports.py).
UNCONSTRAINED = {"EDGEINSPECT_STRUCTURED_OUTPUT": "false"}


def reference_tokens(ckpt_path, image_bytes: bytes, n: int) -> list[int]:
    ckpt = open_checkpoint(ckpt_path)
    processor = load_processor(ckpt)
    model = load_reference_model(ckpt)
    text = prompt_text(processor, build_messages(DEFAULT_INSTRUCTION))
    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    inputs = processor(text=text, images=image, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=n, do_sample=False)
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    eos = ckpt.text_config.eos_token_id
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def references(tiny_checkpoint):
    return {name: reference_tokens(tiny_checkpoint, asset_path(name).read_bytes(), NEW_TOKENS) for name in IMAGES}


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory):
    opts = StackOptions(
        workdir=tmp_path_factory.mktemp("stack"),
        checkpoint=tiny_checkpoint,
        stages=2,
        codec="fp32",
        # Small prefill chunks: the prompt flows through the stages pipelined, and must still give generate()'s tokens.
        extra_env=UNCONSTRAINED | {"EDGEINSPECT_PREFILL_CHUNK_TOKENS": "16"},
    )
    with LocalStack(opts) as s:
        yield s


def inspect(stack, name, **kw):
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        return client.inspect(asset_path(name).read_bytes(), max_new_tokens=NEW_TOKENS, **kw)


def test_two_stage_report_tokens_equal_generate(stack, references):
    for name in IMAGES:
        report = inspect(stack, name, station="s3", part="HSG-200")
        assert list(report.generated_token_ids) == references[name]
        assert report.model.checkpoint_fingerprint == open_checkpoint(stack.checkpoint).fingerprint
        assert len(report.model.partition) == 2
    # Same part, same spec context: the second frame started from the stages' cached prompt prefix.
    for k in range(2):
        assert _stage_stub(stack, k).Stats(stage_pb2.StatsRequest()).prefix_hits >= 1


@pytest.mark.parametrize("stages,wire", [(3, "fp32"), (3, "fp16")])
def test_three_stages_and_fp16_on_the_wire_keep_the_tokens(tiny_checkpoint, tmp_path, references, stages, wire):
    opts = StackOptions(
        workdir=tmp_path,
        checkpoint=tiny_checkpoint,
        stages=stages,
        codec=wire,
        extra_env=UNCONSTRAINED,
    )
    with LocalStack(opts) as s:
        for name in IMAGES:
            assert list(inspect(s, name).generated_token_ids) == references[name]


def test_stream_delivers_deltas_then_the_stored_report(stack):
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        request = inspection_pb2.InspectRequest(image=asset_path("part_ok.jpg").read_bytes(), max_new_tokens=NEW_TOKENS)
        events = list(client.stub.InspectStream(request, metadata=client.metadata, timeout=120))
        deltas, report = [e.delta for e in events[:-1]], events[-1].report
        assert all(e.HasField("delta") for e in events[:-1]) and events[-1].HasField("report")
        text = "".join(d.text for d in deltas)
        ids = [i for d in deltas for i in d.token_ids]
        assert report.raw_text.startswith(text)
        # Every token id reaches the caller exactly once and in order (held-back ones ride with a later delta).
        assert ids == list(report.generated_token_ids[: len(ids)])
        assert client.get(report.report_id) == report


def test_idempotency_key_returns_the_same_report(stack):
    first = inspect(stack, "part_ok.jpg", idempotency_key="cam1-000123")
    again = inspect(stack, "part_dent.jpg", idempotency_key="cam1-000123")
    assert again.report_id == first.report_id and again == first


def _call(stack, method, request, token="__default__"):
    token = stack.api_token if token == "__default__" else token
    with grpc.insecure_channel(stack.gateway_address) as ch:
        stub = inspection_pb2_grpc.InspectionServiceStub(ch)
        md = [("authorization", f"Bearer {token}")] if token else []
        return getattr(stub, method)(request, metadata=md, timeout=60)


def _expect(code, fn):
    with pytest.raises(grpc.RpcError) as err:
        fn()
    assert err.value.code() == code, err.value.details()
    return err.value.details()


def _good(stack):
    assert inspect(stack, "part_ok.jpg").report_id


@pytest.mark.parametrize(
    "image,needle",
    [
        (b"", "empty"),
        (asset_path("part_ok.jpg").read_bytes()[:2000], "truncated"),
        (b"this is not an image at all" * 10, "not an image"),
    ],
)
def test_bad_images_are_invalid_argument_and_the_service_stays_up(stack, image, needle):
    details = _expect(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: _call(stack, "Inspect", inspection_pb2.InspectRequest(image=image))
    )
    assert needle in details.lower()
    _good(stack)


def test_unknown_report_id_is_not_found(stack):
    _expect(
        grpc.StatusCode.NOT_FOUND, lambda: _call(stack, "GetReport", inspection_pb2.GetReportRequest(report_id="x"))
    )
    _good(stack)


@pytest.mark.parametrize("token", ["", "wrong-token"])
def test_missing_or_wrong_token_is_unauthenticated(stack, token):
    request = inspection_pb2.GetReportRequest(report_id="x")
    _expect(grpc.StatusCode.UNAUTHENTICATED, lambda: _call(stack, "GetReport", request, token=token))
    _good(stack)


def _stage_stub(stack, k):
    return stage_pb2_grpc.DecoderStageStub(grpc.insecure_channel(stack.address_of(f"stage{k}")))


def _forward(stub, *steps):
    return list(stub.Forward(iter([stage_pb2.StepRequest(steps=list(steps))]), timeout=30))


def _hidden_frame(width, rows=2, **tamper):
    frame = codec.encode_frame(torch.zeros(rows, width), codec.Codec.fp32)
    for key, value in tamper.items():
        if key == "shape":
            del frame.shape[:]
            frame.shape.extend(value)
        else:
            setattr(frame, key, value)
    return frame


@pytest.mark.parametrize(
    "tamper,needle",
    [
        ({"shape": [2, 7]}, "shape"),
        ({"dtype": "int64"}, "dtype"),
        ({"payload": b"\0" * 12}, "bytes"),
        ({"crc32": 12345}, "checksum"),
    ],
)
def test_bad_tensor_frames_sent_to_a_stage_are_invalid_argument(stack, tamper, needle):
    width = open_checkpoint(stack.checkpoint).text_config.hidden_size
    stub = _stage_stub(stack, 1)
    step = stage_pb2.SessionStep(session_id="bad", position=0, hidden=_hidden_frame(width, **tamper))
    details = _expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: _forward(stub, step))
    assert needle in details.lower()
    good = stage_pb2.SessionStep(session_id="good", position=0, hidden=_hidden_frame(width))
    assert _forward(stub, good)[0].results[0].cached_length == 2
    _good(stack)


def test_a_step_at_a_wrong_position_is_refused(stack):
    stub = _stage_stub(stack, 0)

    def steps():
        yield stage_pb2.StepRequest(steps=[stage_pb2.SessionStep(session_id="p", position=0, input_ids=[5, 6])])
        yield stage_pb2.StepRequest(steps=[stage_pb2.SessionStep(session_id="p", position=7, input_ids=[8])])

    details = _expect(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(stub.Forward(steps(), timeout=30)))
    assert "position 7" in details
    _good(stack)


def test_a_peer_with_another_checkpoint_is_refused(stack):
    ckpt = open_checkpoint(stack.checkpoint)
    stub = _stage_stub(stack, 0)
    stats = stub.Stats(stage_pb2.StatsRequest(), timeout=10)
    request = stage_pb2.HandshakeRequest(
        client=common_pb2.PeerIdentity(
            protocol_version=PROTOCOL_VERSION,
            checkpoint_fingerprint="0123456789abcdef",
            tokenizer_fingerprint=ckpt.tokenizer_fingerprint,
        ),
        expect_layer_start=stats.identity.layer_start,
        expect_layer_end=stats.identity.layer_end,
    )
    details = _expect(grpc.StatusCode.FAILED_PRECONDITION, lambda: stub.Handshake(request, timeout=10))
    assert "checkpoint fingerprint 0123456789abcdef" in details
    _good(stack)


def assert_cancelling_releases_every_stage(stack, stages: int) -> None:
    with grpc.insecure_channel(stack.gateway_address) as ch:
        stub = inspection_pb2_grpc.InspectionServiceStub(ch)
        request = inspection_pb2.InspectRequest(image=asset_path("part_ok.jpg").read_bytes(), max_new_tokens=2000)
        call = stub.InspectStream(request, metadata=[("authorization", f"Bearer {stack.api_token}")])
        for event in call:
            if event.HasField("delta"):
                break
        call.cancel()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        live = [_stage_stub(stack, k).Stats(stage_pb2.StatsRequest(), timeout=5).sessions for k in range(stages)]
        if live == [0] * stages:
            break
        time.sleep(0.05)
    assert live == [0] * stages, f"sessions still held 2 s after cancellation: {live}"


def test_cancelling_a_stream_releases_the_session_on_every_stage(stack):
    for _ in range(3):  # the release must not depend on when the stage's handler is collected
        assert_cancelling_releases_every_stage(stack, 2)


def test_a_killed_gateway_keeps_acknowledged_reports(stack):
    report = inspect(stack, "part_scratch.jpg")
    stack.kill("gateway")
    stack.restart("gateway")
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        assert client.get(report.report_id) == report


def test_grpcurl_lists_every_role_and_gets_serving(stack):
    for role in ("vision", "stage0", "stage1", "gateway"):
        address = stack.address_of(role)
        listed = grpcurl("-plaintext", address, "list")
        assert "grpc.health.v1.Health" in listed.stdout and "edgeinspect.v1." in listed.stdout
        health = grpcurl("-plaintext", "-d", "{}", address, "grpc.health.v1.Health/Check")
        assert "SERVING" in health.stdout


def test_verify_agrees_with_the_cluster_and_catches_another_checkpoint(stack, tmp_path):
    from edgeinspect.models.tiny import TinySpec, make_tiny
    from edgeinspect.stack.verify import verify

    image = asset_path("part_dent.jpg").read_bytes()
    good = verify(stack.gateway_address, stack.api_token, stack.checkpoint, image, "Inspect the part.", 8)
    assert good.agree and len(good.cluster_tokens) > 0 and good.prompt_token_ids
    other = make_tiny(tmp_path / "other", TinySpec(seed=5))
    bad = verify(stack.gateway_address, stack.api_token, other, image, "Inspect the part.", 8)
    assert not bad.agree
