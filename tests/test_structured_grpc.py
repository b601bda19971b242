"""Constrained reports through the real stack (vision, 2 stages, retrieval over the sample specs, gateway as
processes): the oracle against transformers' generate() with the same constraint as a logits processor, the part's
defect classes only, and UNCERTAIN when the budget cannot hold the object."""

from __future__ import annotations

import io
import json

import grpc
import jsonschema
import pytest
from PIL import Image
from transformers import LogitsProcessorList
from vision_images import varied_png

from edgeinspect.assets import asset_path
from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.grammar import grammar_cache_for, logits_processor
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_text
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.gateway.reports.report_text import REASON_TRUNCATED
from edgeinspect.services.gateway.reports.schema import build_report_grammar, schema_instruction
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.v1 import inspection_pb2, retrieval_pb2, retrieval_pb2_grpc

SPEC_CHUNKS = 3  # GatewaySettings.spec_chunks default
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, sample_kb, tmp_path_factory):
    opts = StackOptions(
        workdir=tmp_path_factory.mktemp("structured"),
        checkpoint=tiny_checkpoint,
        stages=2,
        codec="fp32",
        kb_dir=sample_kb,
    )
    with LocalStack(opts) as s:
        yield s


def gateway_chunks(stack, part: str) -> list[retrieval_pb2.SpecChunk]:
    """The chunks the gateway retrieves for a request with this part and no station or prompt."""
    query = " ".join(x for x in (part, "visual defects acceptance limits") if x)
    with grpc.insecure_channel(stack.address_of("retrieval")) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        resp = stub.Search(retrieval_pb2.SearchRequest(query=query, k=SPEC_CHUNKS, filters={"product": part}))
        if not resp.chunks:
            resp = stub.Search(retrieval_pb2.SearchRequest(query=query, k=SPEC_CHUNKS))
    return list(resp.chunks)


def inspect(stack, image: bytes, part: str, budget: int) -> inspection_pb2.DefectReport:
    with InspectionClient(stack.gateway_address, stack.api_token) as client:
        return client.inspect(image, part=part, max_new_tokens=budget)


def test_reports_validate_against_the_schema_and_name_only_the_parts_classes(stack):
    for seed, part in enumerate(["CVR-310", "PCB-410", "HSG-210"]):
        report = inspect(stack, varied_png(96 + 16 * seed, 64, seed), part, 200)
        grammar = build_report_grammar(gateway_chunks(stack, part), part, 200)
        obj = json.loads(report.raw_text)
        jsonschema.validate(obj, grammar.schema)
        assert grammar.vocabulary.from_specs
        assert {d.defect_class for d in report.defects} <= set(grammar.vocabulary.classes)
        assert report.verdict != inspection_pb2.VERDICT_UNSPECIFIED
        assert report.references and report.raw_text


def test_distributed_constrained_tokens_equal_generate_with_the_constraint_as_logits_processor(stack, tiny_checkpoint):
    part, budget = "CVR-310", 160
    image = asset_path("part_scratch.jpg").read_bytes()
    report = inspect(stack, image, part, budget)

    chunks = gateway_chunks(stack, part)
    grammar = build_report_grammar(chunks, part, budget)
    ckpt = open_checkpoint(tiny_checkpoint)
    processor = load_processor(ckpt)
    model = load_reference_model(ckpt)
    context = "\n".join(f"[{c.doc_id} / {c.section}] {c.text}" for c in chunks)
    instruction = f"{DEFAULT_INSTRUCTION}\n{schema_instruction(grammar.vocabulary)}"
    text = prompt_text(processor, build_messages(instruction, context))
    inputs = processor(text=text, images=Image.open(io.BytesIO(image)).convert("RGB"), return_tensors="pt")
    prompt_len = inputs["input_ids"].shape[1]
    assert report.prompt_tokens == prompt_len
    constraint = grammar_cache_for(ckpt).constraint(grammar.text)
    out = model.generate(
        **inputs,
        max_new_tokens=budget,
        do_sample=False,
        logits_processor=LogitsProcessorList([logits_processor(constraint, prompt_len)]),
    )
    expected = out[0, prompt_len:].tolist()
    assert list(report.generated_token_ids) == expected
    assert expected[-1] == ckpt.text_config.eos_token_id and len(expected) > 20


def test_a_budget_too_small_for_the_object_is_uncertain_with_the_reason(stack):
    report = inspect(stack, varied_png(80, 80, 3), "CVR-310", 12)
    assert len(report.generated_token_ids) == 12
    assert report.verdict == inspection_pb2.VERDICT_UNCERTAIN
    assert report.verdict_reason == REASON_TRUNCATED
    assert not report.defects and report.description == ""
    assert report.raw_text.startswith('{"verdict":')  # kept for audit, as generated


def test_inspect_cli_prints_a_table_by_default_and_json_with_the_flag(stack, tmp_path):
    from typer.testing import CliRunner

    from edgeinspect.cli import app

    image = tmp_path / "part.png"
    image.write_bytes(varied_png(72, 72, 9))
    common = ["inspect", str(image), "--gateway", stack.gateway_address, "--token", stack.api_token]
    common += ["--part", "CVR-310", "--max-new-tokens", "200"]
    runner = CliRunner()
    table = runner.invoke(app, common, terminal_width=200)
    assert table.exit_code == 0, table.output
    for row in ("verdict", "reference", "timings", "CVR-310"):
        assert row in table.output
    as_json = runner.invoke(app, [*common, "--json"])
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.output)
    assert report["verdict"].startswith("VERDICT_") and json.loads(report["raw_text"])["verdict"]
