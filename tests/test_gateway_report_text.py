"""Generated text -> report fields: both prompted forms, gibberish, cut-off output, bounds, never raising."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinspect.services.gateway.reports.report_text import (
    MAX_DEFECTS,
    MAX_DESCRIPTION,
    REASON_NO_VERDICT,
    REASON_TRUNCATED,
    parse_report_text,
)
from edgeinspect.v1 import inspection_pb2

OK, DEFECT, UNCERTAIN = inspection_pb2.VERDICT_OK, inspection_pb2.VERDICT_DEFECT, inspection_pb2.VERDICT_UNCERTAIN
SCRATCH = {"defect_class": "scratch", "severity": "minor", "location": "upper left edge", "evidence": "a bright line"}


def test_line_form_defect_report():
    parsed = parse_report_text(
        "Verdict: DEFECT. Defect class: scratch. Severity: minor. Location: upper left edge. "
        "Evidence: a bright line. Description: One scratch near the edge."
    )
    assert parsed.verdict == DEFECT
    assert parsed.defects == [SCRATCH]
    assert parsed.description == "One scratch near the edge."
    assert parsed.verdict_reason == ""


def test_line_form_with_markdown_bullets_and_two_defects():
    parsed = parse_report_text(
        "**Verdict:** Defect\n- **Defect class:** dent\n- Severity: major\n- Location: center\n"
        "- Evidence: a shadow\n- Defect class: burr\n- Severity: minor\n"
    )
    assert parsed.verdict == DEFECT
    assert parsed.defects == [
        {"defect_class": "dent", "severity": "major", "location": "center", "evidence": "a shadow"},
        {"defect_class": "burr", "severity": "minor", "location": "", "evidence": ""},
    ]


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("verdict: ok", OK),
        ("VERDICT: Ok.", OK),
        ("Verdict: pass", OK),
        ("Verdict: no defects found.", OK),
        ("Verdict: defective", DEFECT),
        ("verdict = DEFECT", DEFECT),
        ('{"verdict": "VERDICT_DEFECT"}', DEFECT),
        ("Verdict: uncertain", UNCERTAIN),
    ],
)
def test_verdicts_are_case_insensitive(text, verdict):
    assert parse_report_text(text).verdict == verdict


def test_ok_verdict_keeps_the_sentence_after_it_as_description():
    parsed = parse_report_text("Verdict: OK. The part looks clean.")
    assert (parsed.verdict, parsed.defects, parsed.description) == (OK, [], "The part looks clean.")


def test_json_form_inside_prose_and_a_code_fence():
    body = {
        "verdict": "defect",
        "defects": [
            {"class": "scratch", "severity": "minor", "location": "upper left edge", "evidence": "a bright line"}
        ],
        "description": "a scratch",
    }
    parsed = parse_report_text(f"Here is the report:\n```json\n{json.dumps(body)}\n```\nDone.")
    assert (parsed.verdict, parsed.defects, parsed.description) == (DEFECT, [SCRATCH], "a scratch")


def test_json_takes_the_object_with_a_verdict_even_when_nested():
    parsed = parse_report_text('{"report": {"Verdict": "OK", "defects": [], "description": "clean"}}')
    assert (parsed.verdict, parsed.description) == (OK, "clean")


def test_json_with_odd_value_types_is_read_as_text():
    parsed = parse_report_text('{"verdict": "DEFECT", "defects": ["chip", {"class": 3, "severity": null}]}')
    assert parsed.verdict == DEFECT
    assert [d["defect_class"] for d in parsed.defects] == ["chip", "3"]


def test_python_style_quotes_are_read():
    parsed = parse_report_text("{'verdict': 'DEFECT', 'defects': [{'class': 'chip', 'severity': 'major'}]}")
    assert parsed.verdict == DEFECT
    assert parsed.defects[0]["defect_class"] == "chip" and parsed.defects[0]["severity"] == "major"


def test_cut_off_json_keeps_a_complete_verdict_and_the_defect_so_far():
    parsed = parse_report_text('{"verdict": "DEFECT", "defects": [{"class": "scratch", "severity": "mi', truncated=True)
    assert parsed.verdict == DEFECT
    assert parsed.defects[0]["defect_class"] == "scratch"


@pytest.mark.parametrize("text", ['{"verdict": "DEF', "Verdict:", "The part shows", ""])
def test_truncated_without_a_complete_verdict_is_uncertain_with_the_budget_reason(text):
    parsed = parse_report_text(text, truncated=True)
    assert parsed.verdict == UNCERTAIN
    assert parsed.verdict_reason == REASON_TRUNCATED


def test_gibberish_is_uncertain_with_the_text_as_description():
    text = "  ĠqwertyĠzz <unk> 12 }{ ] asd asd asd  "
    parsed = parse_report_text(text)
    assert parsed.verdict == UNCERTAIN
    assert parsed.verdict_reason == REASON_NO_VERDICT
    assert parsed.description == text.strip()
    assert parsed.defects == []


def test_unknown_verdict_word_is_uncertain_and_named_in_the_reason():
    parsed = parse_report_text("Verdict: maybe. Description: hard to say.")
    assert parsed.verdict == UNCERTAIN
    assert "'maybe" in parsed.verdict_reason
    assert parsed.description == "hard to say."


def test_model_uncertain_says_so():
    parsed = parse_report_text("Verdict: UNCERTAIN. Description: glare hides the surface.")
    assert (parsed.verdict, parsed.verdict_reason) == (UNCERTAIN, "the model reported UNCERTAIN")


def test_none_defect_under_ok_is_dropped():
    parsed = parse_report_text("Verdict: OK. Defect class: none. Severity: n/a.")
    assert (parsed.verdict, parsed.defects) == (OK, [])


def test_ok_with_a_real_defect_listed_is_uncertain():
    parsed = parse_report_text("Verdict: OK. Defect class: crack. Severity: major.")
    assert parsed.verdict == UNCERTAIN
    assert "OK" in parsed.verdict_reason and parsed.defects[0]["defect_class"] == "crack"


def test_lengths_and_defect_count_are_bounded():
    defect = {"class": "c" * 100, "severity": "s" * 100, "location": "l" * 300, "evidence": "e" * 300}
    text = json.dumps({"verdict": "DEFECT", "defects": [defect] * 40, "description": "d" * 3000})
    parsed = parse_report_text(text)
    assert len(parsed.defects) == MAX_DEFECTS
    assert len(parsed.defects[0]["defect_class"]) == 64 and len(parsed.defects[0]["severity"]) == 64
    assert len(parsed.defects[0]["location"]) == 256 and len(parsed.defects[0]["evidence"]) == 256
    assert len(parsed.description) == MAX_DESCRIPTION
    assert len(parse_report_text("x" * 100_000).description) == MAX_DESCRIPTION


def test_line_form_defect_count_is_bounded():
    text = "Verdict: DEFECT. " + "Defect class: dent. Severity: minor. " * 100
    assert len(parse_report_text(text).defects) == MAX_DEFECTS


def test_deeply_nested_json_does_not_raise():
    parsed = parse_report_text("{" + '"a":[' * 5000 + '{"verdict": "OK"}')
    assert parsed.verdict in (OK, UNCERTAIN)


_labels = st.sampled_from(
    ["Verdict:", "verdict=", "Defect class:", "class:", "Severity:", "Location:", "Evidence:", "Description:", "{", '"']
)
_words = st.sampled_from(["OK", "DEFECT", "uncertain", "none", "no defects", "scratch", ".", "\n", "}", "[", "\\"])


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=400), truncated=st.booleans())
def test_any_text_gives_a_valid_bounded_report(text, truncated):
    _check_valid(parse_report_text(text, truncated=truncated))


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.one_of(_labels, _words, st.text(max_size=20)), max_size=40), truncated=st.booleans())
def test_label_soup_gives_a_valid_bounded_report(parts, truncated):
    _check_valid(parse_report_text(" ".join(parts), truncated=truncated))


def _check_valid(parsed):
    assert parsed.verdict in (OK, DEFECT, UNCERTAIN)
    assert (parsed.verdict == UNCERTAIN) == bool(parsed.verdict_reason)
    assert len(parsed.description) <= MAX_DESCRIPTION and len(parsed.defects) <= MAX_DEFECTS
    for defect in parsed.defects:
        assert set(defect) == {"defect_class", "severity", "location", "evidence"}
        assert all(isinstance(v, str) for v in defect.values())
        assert len(defect["defect_class"]) <= 64 and len(defect["location"]) <= 256
