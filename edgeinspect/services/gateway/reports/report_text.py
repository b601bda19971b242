"""Generated text -> DefectReport fields. Pure functions that never raise: a model (random weights included) may
write anything, and whatever it writes becomes a report, UNCERTAIN with a reason when no verdict can be read.

Two forms are read, as the prompt asks for either: a JSON object (possibly inside prose or a code fence)
`{"verdict": ..., "defects": [{"class", "severity", "location", "evidence"}], "description": ...}` and labelled
lines `Verdict: DEFECT. Defect class: scratch. Severity: minor. Location: ... Evidence: ... Description: ...`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from edgeinspect.v1 import inspection_pb2

MAX_CLASS = 64  # defect_class and severity
MAX_FIELD = 256  # location and evidence
MAX_DESCRIPTION = 2000
MAX_REASON = 256
MAX_DEFECTS = 16
# Generated reports are a few hundred tokens; bounding the scanned text bounds the parser's time on any input.
MAX_SCAN_CHARS = 65_536
MAX_JSON_CANDIDATES = 32

REASON_NO_VERDICT = "the model did not state a verdict"
REASON_TRUNCATED = "generation stopped at the token budget before the report was complete"
REASON_MODEL_UNCERTAIN = "the model reported UNCERTAIN"

# Words a model may use for each verdict; the first word of the verdict value decides.
_VERDICT_WORDS = {
    "ok": inspection_pb2.VERDICT_OK,
    "pass": inspection_pb2.VERDICT_OK,
    "passed": inspection_pb2.VERDICT_OK,
    "good": inspection_pb2.VERDICT_OK,
    "defect": inspection_pb2.VERDICT_DEFECT,
    "defective": inspection_pb2.VERDICT_DEFECT,
    "fail": inspection_pb2.VERDICT_DEFECT,
    "failed": inspection_pb2.VERDICT_DEFECT,
    "ng": inspection_pb2.VERDICT_DEFECT,
    "reject": inspection_pb2.VERDICT_DEFECT,
    "uncertain": inspection_pb2.VERDICT_UNCERTAIN,
    "unknown": inspection_pb2.VERDICT_UNCERTAIN,
    "unsure": inspection_pb2.VERDICT_UNCERTAIN,
}
# "none"/"n/a" written into a defect slot means "no defect", not a defect called "none".
_EMPTY_WORDS = frozenset({"", "none", "n/a", "na", "null", "nil", "-", "no defect", "no defects", "not applicable"})

# Field keys of a defect, with the spellings accepted for each (JSON keys and line labels).
_DEFECT_KEYS = {
    "class": "defect_class",
    "defect_class": "defect_class",
    "defect class": "defect_class",
    "defect-class": "defect_class",
    "defectclass": "defect_class",
    "type": "defect_class",
    "severity": "severity",
    "location": "location",
    "evidence": "evidence",
}
_FIELD_LIMITS = {"defect_class": MAX_CLASS, "severity": MAX_CLASS, "location": MAX_FIELD, "evidence": MAX_FIELD}

# A label: not inside a longer word, optional quotes/markdown around it, then ':' or '='.
_LABEL = re.compile(
    r"(?<![A-Za-z0-9_])(?P<label>verdict|defect[ _-]?class|class|severity|location|evidence|description)"
    r"[\"'*_]*\s*[:=]",
    re.IGNORECASE,
)
_VERDICT_WORD = re.compile(r"(?:verdict_)?([A-Za-z]+)(?![A-Za-z])(.*)", re.IGNORECASE | re.DOTALL)
_NO_DEFECT = re.compile(r"\s+defects?(?:\s+(?:found|detected|present|visible))?(?![A-Za-z])", re.IGNORECASE)
# A quoted JSON-ish string value after a quoted label, read up to its closing quote (or the end, when cut off).
_QUOTED = {q: re.compile(rf"\s*{q}((?:[^{q}\\]|\\.)*)", re.DOTALL) for q in "\"'"}
_STRIP = " \t\r\n\"'`*_{}[],;"


@dataclass
class ParsedReport:
    verdict: inspection_pb2.Verdict  # VERDICT_OK / VERDICT_DEFECT / VERDICT_UNCERTAIN
    defects: list[dict] = field(default_factory=list)  # defect_class, severity, location, evidence
    description: str = ""
    verdict_reason: str = ""  # why UNCERTAIN, when it is


@dataclass
class _Fields:
    """What one reading of the text found, before verdict policy is applied."""

    verdict_text: str | None = None
    defects: list[dict] = field(default_factory=list)
    description: str | None = None


def parse_report_text(text: str, *, truncated: bool = False) -> ParsedReport:
    """Reads a verdict, defects and description out of generated text; UNCERTAIN with a reason when it cannot."""
    text = text if isinstance(text, str) else str(text or "")
    scan = text[:MAX_SCAN_CHARS]
    fields = _from_json(scan) or _from_labels(scan)
    defects = [d for d in (_bounded_defect(d) for d in fields.defects) if d is not None][:MAX_DEFECTS]

    verdict, rest = _verdict(fields.verdict_text)
    description = fields.description if fields.description is not None else rest
    reason = ""
    if verdict is None:
        verdict = inspection_pb2.VERDICT_UNCERTAIN
        if truncated:
            reason = REASON_TRUNCATED
        elif fields.verdict_text is None:
            reason = REASON_NO_VERDICT
        else:
            reason = f"the model's verdict {_clip(_one_line(fields.verdict_text), 40)!r} is not OK, DEFECT or UNCERTAIN"
        if not description:
            description = text
    elif verdict == inspection_pb2.VERDICT_UNCERTAIN:
        reason = REASON_MODEL_UNCERTAIN
    elif verdict == inspection_pb2.VERDICT_OK and defects:
        # An OK part with defects listed is a contradiction an operator must look at, not a pass.
        verdict = inspection_pb2.VERDICT_UNCERTAIN
        reason = f"the model said OK but listed {len(defects)} defect(s)"
    return ParsedReport(
        verdict=verdict,
        defects=defects,
        description=_clip(description.strip(), MAX_DESCRIPTION),
        verdict_reason=_clip(reason, MAX_REASON),
    )


def _verdict(value: str | None) -> tuple[inspection_pb2.Verdict | None, str]:
    """(verdict, the text after the verdict word) or (None, "") when the value names no verdict."""
    if value is None:
        return None, ""
    match = _VERDICT_WORD.match(value.lstrip(_STRIP + ".:-"))
    if match is None:
        return None, ""
    word, rest = match.group(1).lower(), match.group(2)
    no_defect = _NO_DEFECT.match(rest) if word == "no" else None
    if no_defect is not None:
        return inspection_pb2.VERDICT_OK, _clean(rest[no_defect.end() :])
    verdict = _VERDICT_WORDS.get(word)
    if verdict is None:
        return None, ""
    return verdict, _clean(rest)


def _from_json(text: str) -> _Fields | None:
    """The first JSON object in the text that has a verdict key; None when there is none."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    for _ in range(MAX_JSON_CANDIDATES):
        if start < 0:
            return None
        try:
            obj, _end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            keys = {str(k).lower(): v for k, v in obj.items()}
            if "verdict" in keys:
                return _json_fields(keys)
        start = text.find("{", start + 1)
    return None


def _json_fields(obj: dict) -> _Fields:
    raw_defects = obj.get("defects")
    if isinstance(raw_defects, dict):
        raw_defects = [raw_defects]
    elif not isinstance(raw_defects, list):
        raw_defects = [] if raw_defects is None else [raw_defects]
    defects = []
    for item in raw_defects[: MAX_DEFECTS * 4]:
        if isinstance(item, dict):
            defect = {}
            for key, value in item.items():
                name = _DEFECT_KEYS.get(str(key).lower())
                if name and name not in defect:
                    defect[name] = _as_text(value)
            defects.append(defect)
        else:
            defects.append({"defect_class": _as_text(item)})
    description = obj.get("description")
    return _Fields(
        verdict_text=_as_text(obj["verdict"]),
        defects=defects,
        description=None if description is None else _as_text(description),
    )


def _from_labels(text: str) -> _Fields:
    """Labelled values: each runs from its label to the next label. A class label, or a field already set on the
    current defect, starts a new defect."""
    fields = _Fields()
    matches = list(_LABEL.finditer(text))
    current: dict | None = None
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        value = _label_value(text, match, end)
        label = match.group("label").lower()
        if label == "verdict":
            if fields.verdict_text is None:
                fields.verdict_text = value
            continue
        if label == "description":
            if fields.description is None:
                fields.description = _clean(value)
            continue
        name = _DEFECT_KEYS[label]
        if current is None or name in current or (name == "defect_class" and current):
            current = {}
            fields.defects.append(current)
            if len(fields.defects) > MAX_DEFECTS * 4:
                break
        current[name] = value
    return fields


def _label_value(text: str, match: re.Match, end: int) -> str:
    """The text from a label to the next one; for a quoted label (broken or cut-off JSON), the quoted string."""
    value = text[match.end() : end]
    quote = text[match.start() - 1] if match.start() > 0 else ""
    if quote in _QUOTED:
        string = _QUOTED[quote].match(value)
        if string is not None:
            return _unescape(string.group(1))
    return value


def _unescape(value: str) -> str:
    try:
        return json.loads(f'"{value}"')
    except ValueError:
        return value.replace('\\"', '"').replace("\\n", "\n")


def _bounded_defect(raw: dict) -> dict | None:
    """A defect with every field cleaned and bounded; None when it says nothing ("none", empty)."""
    defect = {name: _field(raw.get(name, ""), limit) for name, limit in _FIELD_LIMITS.items()}
    if all(value.lower().rstrip(".") in _EMPTY_WORDS for value in defect.values()):
        return None
    if defect["defect_class"].lower().rstrip(".") in _EMPTY_WORDS and not (defect["location"] or defect["evidence"]):
        return None
    return defect


def _as_text(value: object) -> str:
    if isinstance(value, str):
        return value[:MAX_DESCRIPTION]
    if value is None:
        return ""
    try:
        return json.dumps(value)[:MAX_DESCRIPTION]
    except (ValueError, TypeError, RecursionError):
        return ""


def _clean(value: str) -> str:
    """Strips quotes, markdown and separators around a value."""
    return value.lstrip(_STRIP + ".:-•#").rstrip(_STRIP + "-•#")


def _field(value: str, limit: int) -> str:
    """A defect field on one line, without the full stop that ends a labelled sentence, bounded."""
    value = _one_line(_clean(value))
    if value.endswith(".") and not value.endswith(".."):
        value = value[:-1].rstrip(_STRIP)
    return _clip(value, limit)


def _one_line(value: str) -> str:
    return " ".join(value.split())


def _clip(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 1].rstrip() + "…"
