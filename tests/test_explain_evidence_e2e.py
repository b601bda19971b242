"""The VLM sees what the gate saw (issue 65), through the real gateway (every role its own process, tiny checkpoint,
a bank taught through the vision node): the explanation of a flagged part is asked with three images (the frame, the
flagged region cut from the full-resolution frame, the nearest good frame the gate passed), and its greedy tokens are
transformers' own generate() given the same three images and the same prompt text in one process."""

from __future__ import annotations

import io
import json

import grpc
import pytest
import test_anomaly_gate_e2e as gate_e2e
from PIL import Image
from test_anomaly_gate_e2e import ADMIN, GATED, NEW_TOKENS, PART, VLM_STATION, call, explained, inspect

from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_text
from edgeinspect.services.gateway import evidence, gate
from edgeinspect.services.gateway.prompt import prompt_digest
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, vision_pb2, vision_pb2_grpc

pytestmark = pytest.mark.timeout(900)
sample, api = gate_e2e.sample, gate_e2e.api  # the fixtures: the drawn part's sample set, the API stub

# The reference is unconstrained generate(), and the wire carries fp32: the same numbers as one process.
UNCONSTRAINED = {"EDGEINSPECT_STRUCTURED_OUTPUT": "false"}


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory, sample):
    opts = StackOptions(workdir=tmp_path_factory.mktemp("evidence"), checkpoint=tiny_checkpoint, stages=2,
                        codec="fp32", api_token=ADMIN, extra_env=UNCONSTRAINED, anomaly="vlm",
                        gate_stations=(GATED,))  # fmt: skip
    with LocalStack(opts) as s:
        frames = [p.read_bytes() for p in sorted((sample / "train" / "good").glob("*.png"))]
        with grpc.insecure_channel(s.address_of("vision")) as channel:
            teach = vision_pb2_grpc.VisionServiceStub(channel).Teach
            teach(vision_pb2.TeachRequest(part=PART, frames=frames), timeout=300)
        yield s


def reference_tokens(ckpt_path, report: inspection_pb2.DefectReport, images: list[bytes]) -> tuple[list[int], str]:
    """transformers' generate() of the prompt the gateway should have built for this report, and its digest."""
    ckpt = open_checkpoint(ckpt_path)
    processor, model = load_processor(ckpt), load_reference_model(ckpt)
    a = report.anomaly
    regions = [vision_pb2.AnomalyRegion(x=r.x, y=r.y, width=r.width, height=r.height) for r in a.regions]
    score = vision_pb2.AnomalyScore(score=a.score, threshold=a.threshold, band_low=a.ok_cut, regions=regions)
    said = gate.gate_instruction(score)
    context = "\n".join(f"[{c.doc_id} / {c.section}] {c.text}" for c in report.references)
    captions = evidence.Evidence([], list(report.model.images)).captions
    text = prompt_text(processor, build_messages(f"{DEFAULT_INSTRUCTION}\n{said}", context, captions=captions))
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    inputs = processor(text=text, images=pil, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    eos = ckpt.text_config.eos_token_id
    tokens = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    return tokens, prompt_digest(inputs["input_ids"][0].tolist(), "")


def contains(outer: inspection_pb2.BoundingBox, inner: inspection_pb2.BoundingBox, eps: float = 1e-3) -> bool:
    return (
        outer.x <= inner.x + eps
        and outer.y <= inner.y + eps
        and inner.x + inner.width <= outer.x + outer.width + eps
        and inner.y + inner.height <= outer.y + outer.height + eps
    )


def test_a_flagged_parts_explanation_sees_the_crop_and_a_good_frame_and_equals_generate(stack, api, sample):
    good_path = sample / "test" / "good" / "000.png"
    good, _ = inspect(api, good_path, GATED)  # passed by the gate, its frame kept: the reference to be
    assert good.verdict == inspection_pb2.VERDICT_OK and good.anomaly.decided_by == inspection_pb2.DECIDED_BY_GATE
    labels = json.loads((sample / "defects.json").read_text())
    name = next(n for n, label in labels.items() if label["severity"] == 3)
    frame = (sample / name).read_bytes()

    decision, _ = inspect(api, sample / name, GATED)
    assert decision.explanation == inspection_pb2.EXPLANATION_PENDING and decision.anomaly.regions
    report = explained(api, decision.report_id)
    assert report.explanation == inspection_pb2.EXPLANATION_DONE, report.explanation_error

    shown = report.model.images
    assert [p.role for p in shown] == ["frame", "crop", "reference"]
    assert shown[2].report_id == good.report_id
    crop = shown[1].box
    assert all(contains(crop, r) for r in report.anomaly.regions), (crop, report.anomaly.regions)
    x0, y0, x1, y1 = labels[name]["box"]  # the drawn defect lies in the crop
    assert crop.x <= x0 and crop.y <= y0 and x1 <= crop.x + crop.width and y1 <= crop.y + crop.height
    assert any(t.stage == "vision_evidence" for t in report.timings)

    cut = evidence.crop(frame, report.anomaly.regions)
    assert cut is not None and cut[1] == crop  # the same cut from the same full-resolution bytes
    stored = call(api, "GetReportImage", inspection_pb2.GetReportImageRequest(report_id=good.report_id))
    assert stored.data == good_path.read_bytes()
    tokens, digest = reference_tokens(stack.checkpoint, report, [frame, cut[0], stored.data])
    assert report.model.prompt_sha256 == digest, "the gateway's 3-image prompt ids are not the processor's"
    assert len(report.generated_token_ids) >= 4
    assert list(report.generated_token_ids) == tokens


def test_an_unflagged_request_and_a_station_without_a_gate_show_the_frame_alone(stack, api, sample):
    labels = json.loads((sample / "defects.json").read_text())
    name = next(n for n, label in labels.items() if label["severity"] == 3)
    report, _ = inspect(api, sample / name, VLM_STATION)  # the ordinary VLM report
    assert report.generated_token_ids and not report.model.images
    assert not [t for t in report.timings if t.stage == "vision_evidence"]
