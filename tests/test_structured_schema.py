"""The report schema: vocabulary from the part's specs, bounds that fit the token budget, complete-object parsing."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeinspect.services.gateway.reports.report_text import REASON_TRUNCATED
from edgeinspect.services.gateway.reports.schema import (
    DEFAULT_CLASSES,
    DEFAULT_SEVERITIES,
    MIN_LIMITS,
    OTHER,
    REASON_INCOMPLETE,
    ReportLimits,
    build_report_grammar,
    limits_for_budget,
    max_report_bytes,
    parse_structured,
    report_schema,
    vocabulary_for_part,
)
from edgeinspect.v1 import inspection_pb2, retrieval_pb2


def chunk(product: str, classes: list[str], severities: list[str] = ()) -> retrieval_pb2.SpecChunk:
    return retrieval_pb2.SpecChunk(product=product, defect_classes=classes, severities=list(severities))


CHUNKS = [
    chunk("CVR-310", ["short shot", "sink mark", "Flash"], ["major", "minor"]),
    chunk("ASM-100, HSG-210, CVR-310", ["missing screw", "flash"], ["critical", "major", "minor"]),
    chunk("PCB-410", ["solder bridge"], ["critical"]),
    chunk("all", ["corrosion", "Other"], ["major"]),
]


def test_vocabulary_takes_the_classes_of_the_parts_own_and_general_specs_plus_other():
    vocab = vocabulary_for_part(CHUNKS, "CVR-310")
    assert vocab.classes == ("short shot", "sink mark", "Flash", "missing screw", "corrosion", OTHER)
    assert vocab.severities == ("major", "minor", "critical")
    assert vocab.from_specs
    assert "solder bridge" not in vocab.classes


def test_without_specs_for_the_part_the_default_vocabulary_is_used():
    for chunks, part in (([], ""), ([CHUNKS[2]], "CVR-310")):
        vocab = vocabulary_for_part(chunks, part)
        assert vocab.classes == (*DEFAULT_CLASSES, OTHER)
        assert vocab.severities == DEFAULT_SEVERITIES
        assert not vocab.from_specs


def test_the_largest_object_the_schema_admits_is_what_max_report_bytes_says():
    vocab = vocabulary_for_part(CHUNKS, "CVR-310")
    limits = ReportLimits(2, 5, 7, 9)
    largest = {
        "verdict": "UNCERTAIN",
        "defects": [{"class": "missing screw", "severity": "critical", "location": "x" * 5, "evidence": "y" * 7}] * 2,
        "description": "z" * 9,
    }
    jsonschema.validate(largest, report_schema(vocab, limits))
    assert max_report_bytes(vocab, limits) == len(json.dumps(largest, separators=(",", ":")))
    too_long = {**largest, "description": "z" * 10}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(too_long, report_schema(vocab, limits))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**largest, "defects": largest["defects"] * 2}, report_schema(vocab, limits))


@given(budget=st.integers(min_value=1, max_value=4000), part=st.sampled_from(["CVR-310", "PCB-410", "", "X"]))
def test_the_schema_fits_any_budget_that_can_hold_the_smallest_report(budget, part):
    grammar = build_report_grammar(CHUNKS, part, budget)
    minimal = max_report_bytes(grammar.vocabulary, MIN_LIMITS) + 1
    if budget >= minimal:
        assert grammar.max_tokens <= budget
    else:
        assert grammar.limits == MIN_LIMITS


def test_limits_grow_with_the_budget_up_to_the_defaults():
    vocab = vocabulary_for_part([], "")
    small, large = limits_for_budget(vocab, 200), limits_for_budget(vocab, 5000)
    assert small.description < large.description and large == ReportLimits()


def test_free_text_cannot_hold_quotes_backslashes_or_control_characters():
    schema = report_schema(vocabulary_for_part([], ""))
    # (Not a trailing newline: Python's re, which jsonschema uses, lets `$` match before one; ECMA and xgrammar don't.)
    for bad in ('say "hi"', "back\\slash", "tab\there", "new\nline"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"verdict": "OK", "defects": [], "description": bad}, schema)


def test_a_complete_object_becomes_the_report_fields():
    raw = json.dumps(
        {
            "verdict": "DEFECT",
            "defects": [{"class": "sink mark", "severity": "minor", "location": "rib 3", "evidence": "shadow"}],
            "description": "one sink mark",
        }
    )
    parsed = parse_structured(raw, truncated=False)
    assert parsed.verdict == inspection_pb2.VERDICT_DEFECT
    assert parsed.defects == [
        {"defect_class": "sink mark", "severity": "minor", "location": "rib 3", "evidence": "shadow"}
    ]
    assert parsed.description == "one sink mark" and parsed.verdict_reason == ""


def test_a_cut_off_object_is_uncertain_with_the_reason_and_nothing_half_filled():
    raw = '{"verdict":"DEFECT","defects":[{"class":"sink mark","severity":"mi'
    parsed = parse_structured(raw, truncated=True)
    assert parsed.verdict == inspection_pb2.VERDICT_UNCERTAIN
    assert parsed.verdict_reason == REASON_TRUNCATED
    assert parsed.defects == [] and parsed.description == ""
    assert parse_structured(raw, truncated=False).verdict_reason == REASON_INCOMPLETE
    assert parse_structured("", truncated=False).verdict == inspection_pb2.VERDICT_UNCERTAIN


def test_an_ok_report_lists_no_defects_and_a_defect_report_at_least_one():
    schema = report_schema(vocabulary_for_part([], ""))
    one = [{"class": "dent", "severity": "minor", "location": "edge", "evidence": "shadow"}]
    jsonschema.validate({"verdict": "OK", "defects": [], "description": ""}, schema)
    jsonschema.validate({"verdict": "DEFECT", "defects": one, "description": ""}, schema)
    jsonschema.validate({"verdict": "UNCERTAIN", "defects": [], "description": ""}, schema)
    for contradiction in ({"verdict": "OK", "defects": one}, {"verdict": "DEFECT", "defects": []}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**contradiction, "description": ""}, schema)
