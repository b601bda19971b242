"""The gateway grounds reports in the plant's specs: references from the sample knowledge base."""

from __future__ import annotations

from edgeinspect.assets import asset_path
from edgeinspect.rag import sample_kb_dir
from edgeinspect.services.client import InspectionClient
from edgeinspect.stack.launcher import LocalStack, StackOptions


def test_report_on_the_embedded_default_carries_spec_references(tiny_checkpoint, sample_kb, tmp_path):
    doc_ids = {p.stem for p in sample_kb_dir().iterdir()}
    opts = StackOptions(workdir=tmp_path, checkpoint=tiny_checkpoint, stages=2, kb_dir=sample_kb)
    with LocalStack(opts) as stack, InspectionClient(stack.gateway_address, stack.api_token) as client:
        report = client.inspect(
            asset_path("part_scratch.jpg").read_bytes(),
            part="HSG-210",
            station="press-7",
            prompt="Scratch on the housing flange: is it within the acceptance limit?",
            max_new_tokens=4,
        )
    assert report.references, "no spec references in the report"
    for ref in report.references:
        assert ref.doc_id in doc_ids, f"{ref.doc_id} is not a document of the sample knowledge base"
        assert ref.index_version and ref.section and ref.score > 0
    assert any("HSG" in ref.doc_id for ref in report.references)
    assert any(t.stage == "retrieval" for t in report.timings)
