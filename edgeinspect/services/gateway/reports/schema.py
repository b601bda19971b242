"""The report schema the model fills, built per inspection from the specs of the inspected part.

Pure functions. The schema names only the defect classes and severities of the part's specifications (plus
`other`), and bounds every count and length so that the largest object it admits fits the token budget: with a
byte-level tokenizer a token is at least one byte, so the bytes of the largest object bound its tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edgeinspect.models.grammar import canonical_schema, schema_id
from edgeinspect.services.gateway.reports.report_text import (
    MAX_CLASS,
    REASON_TRUNCATED,
    ParsedReport,
    parse_report_text,
)
from edgeinspect.v1 import inspection_pb2

VERDICTS = ("OK", "DEFECT", "UNCERTAIN")
OTHER = "other"
DEFAULT_SEVERITIES = ("critical", "major", "minor")
# Used when no retrieval node is configured or no spec covers the part.
DEFAULT_CLASSES = (
    "scratch",
    "dent",
    "crack",
    "burr",
    "porosity",
    "contamination",
    "corrosion",
    "discolouration",
    "deformation",
    "missing feature",
)
MAX_CLASSES = 64
ALL_PRODUCTS = "all"
# Printable ASCII except '"' and '\': no escapes, so each character is one byte. xgrammar ignores maxLength next
# to a pattern, so the bound lives in the pattern's quantifier.
TEXT_CHARS = r"[ !#-\[\]-~]"
REASON_INCOMPLETE = "the model's output is not a complete report object"


@dataclass(frozen=True)
class Vocabulary:
    classes: tuple[str, ...]  # ends with "other"
    severities: tuple[str, ...]
    from_specs: bool


@dataclass(frozen=True)
class ReportLimits:
    max_defects: int = 3
    location: int = 48
    evidence: int = 96
    description: int = 160


DEFAULT_LIMITS = ReportLimits()
MIN_LIMITS = ReportLimits(max_defects=1, location=4, evidence=8, description=8)


@dataclass(frozen=True)
class ReportGrammar:
    """What the gateway sends with a session: the schema, its canonical text and id, and its token bound."""

    schema: dict
    text: str
    grammar_id: str
    vocabulary: Vocabulary
    limits: ReportLimits
    max_tokens: int  # the largest admitted object, in tokens, plus the EOS


def _clean_terms(values: Iterable[str]) -> list[str]:
    """Stripped, bounded, de-duplicated (case-insensitively) in first-seen order."""
    seen, out = set(), []
    for value in values:
        term = " ".join(str(value).split())[:MAX_CLASS]
        if term and term.lower() not in seen:
            seen.add(term.lower())
            out.append(term)
    return out


def chunk_products(chunk) -> list[str]:
    """SpecChunk.product is the front matter's product list joined with ', '."""
    return [p.strip() for p in chunk.product.split(",") if p.strip()]


def vocabulary_for_part(chunks: Sequence, part: str) -> Vocabulary:
    """Defect classes and severities of the retrieved chunks that cover the part (all of them when no part is
    given); the default vocabulary when none names any class."""
    wanted = {part.strip().lower(), ALL_PRODUCTS}
    relevant = [c for c in chunks if not part.strip() or wanted & {p.lower() for p in chunk_products(c)}]
    classes = _clean_terms(x for c in relevant for x in c.defect_classes)
    severities = _clean_terms(x for c in relevant for x in c.severities)
    from_specs = bool(classes)
    if not classes:
        classes = list(DEFAULT_CLASSES)
    classes = [c for c in classes if c.lower() != OTHER][: MAX_CLASSES - 1] + [OTHER]
    return Vocabulary(tuple(classes), tuple(severities or DEFAULT_SEVERITIES), from_specs)


def _text(n: int) -> dict:
    return {"type": "string", "pattern": f"^{TEXT_CHARS}{{0,{n}}}$"}


def report_schema(vocab: Vocabulary, limits: ReportLimits = DEFAULT_LIMITS) -> dict:
    """JSON Schema of the report object, properties in the order the model writes them. One branch per verdict, so
    that an OK report lists no defects and a DEFECT report at least one (a contradiction cannot be written)."""
    defect = {
        "type": "object",
        "properties": {
            "class": {"enum": list(vocab.classes)},
            "severity": {"enum": list(vocab.severities)},
            "location": _text(limits.location),
            "evidence": _text(limits.evidence),
        },
        "required": ["class", "severity", "location", "evidence"],
        "additionalProperties": False,
    }

    def branch(verdict: str, min_items: int, max_items: int) -> dict:
        return {
            "type": "object",
            "properties": {
                "verdict": {"enum": [verdict]},
                "defects": {"type": "array", "items": defect, "minItems": min_items, "maxItems": max_items},
                "description": _text(limits.description),
            },
            "required": ["verdict", "defects", "description"],
            "additionalProperties": False,
        }

    n = limits.max_defects
    return {"anyOf": [branch("OK", 0, 0), branch("DEFECT", 1, n), branch("UNCERTAIN", 0, n)]}


def max_report_bytes(vocab: Vocabulary, limits: ReportLimits) -> int:
    """Bytes of the largest object the schema admits, written compactly (an upper bound on its tokens)."""

    def longest(values: Sequence[str]) -> str:
        return max(values, key=lambda v: len(json.dumps(v)))

    defect = {
        "class": longest(vocab.classes),
        "severity": longest(vocab.severities),
        "location": "x" * limits.location,
        "evidence": "x" * limits.evidence,
    }
    largest = {
        "verdict": longest(VERDICTS),
        "defects": [defect] * limits.max_defects,
        "description": "x" * limits.description,
    }
    # ensure_ascii: an escaped character is never shorter than its UTF-8 bytes.
    return len(json.dumps(largest, separators=(",", ":"), ensure_ascii=True))


def limits_for_budget(vocab: Vocabulary, budget_tokens: int) -> ReportLimits:
    """The most generous limits (at most DEFAULT_LIMITS) whose largest object fits the budget with its EOS;
    MIN_LIMITS when even those do not fit (the report may then be cut off, and becomes UNCERTAIN)."""
    room = budget_tokens - 1
    # Fewer defects before shorter texts: drop a defect slot while the texts would shrink below half.
    for n in range(DEFAULT_LIMITS.max_defects, 0, -1):
        spare = room - max_report_bytes(vocab, ReportLimits(n, 0, 0, 0))
        wanted = n * (DEFAULT_LIMITS.location + DEFAULT_LIMITS.evidence) + DEFAULT_LIMITS.description
        scale = min(1.0, spare / wanted) if spare > 0 else 0.0
        limits = ReportLimits(
            n,
            int(DEFAULT_LIMITS.location * scale),
            int(DEFAULT_LIMITS.evidence * scale),
            int(DEFAULT_LIMITS.description * scale),
        )
        fits = (
            limits.location >= MIN_LIMITS.location
            and limits.evidence >= MIN_LIMITS.evidence
            and limits.description >= MIN_LIMITS.description
        )
        if fits and (scale >= 0.5 or n == 1):
            return limits
    return MIN_LIMITS


def schema_instruction(vocab: Vocabulary) -> str:
    """The sentence the prompt adds so that a real model knows the form it is held to."""
    return (
        'Answer with one JSON object: {"verdict": "OK" | "DEFECT" | "UNCERTAIN", "defects": [{"class", "severity", '
        '"location", "evidence"}], "description"}. Defect classes: '
        + ", ".join(vocab.classes)
        + ". Severities: "
        + ", ".join(vocab.severities)
        + "."
    )


def build_report_grammar(chunks: Sequence, part: str, budget_tokens: int) -> ReportGrammar:
    """The schema for one inspection: the part's vocabulary, bounded to fit the token budget."""
    vocab = vocabulary_for_part(chunks, part)
    limits = limits_for_budget(vocab, budget_tokens)
    schema = report_schema(vocab, limits)
    return ReportGrammar(
        schema=schema,
        text=canonical_schema(schema),
        grammar_id=schema_id(schema),
        vocabulary=vocab,
        limits=limits,
        max_tokens=max_report_bytes(vocab, limits) + 1,
    )


def parse_structured(raw: str, truncated: bool) -> ParsedReport:
    """A constrained report: a complete object parses as usual; anything else (cut off by the budget, or ended
    early) is UNCERTAIN with the reason and no half-filled fields."""
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        reason = REASON_TRUNCATED if truncated else REASON_INCOMPLETE
        return ParsedReport(verdict=inspection_pb2.VERDICT_UNCERTAIN, verdict_reason=reason)
    return parse_report_text(raw, truncated=False)
