"""What a caller may read in an error: no internal addresses, ports, file paths or Python exception names.

errors.details_for runs every message through `redact`; the unredacted text goes to the log under the request id,
and a redacted message cites that id so an operator can find it.
"""

from __future__ import annotations

import re

import grpc

# Order matters: gRPC's "ipv4:1.2.3.4:5" first, then host:port pairs, then bare addresses.
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(?:ipv[46]|unix|dns):[^\s,;\"')]+"), "an internal address"),
    (re.compile(r"\[[0-9A-Fa-f.%]*:[0-9A-Fa-f:.%]*\](?::\d+)?"), "an internal address"),  # [::1]:50051
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b"), "an internal address"),
    (re.compile(r"\b[A-Za-z][\w.-]*:\d{2,5}\b"), "an internal address"),  # stage-1:50061, localhost:50051
    (re.compile(r"(?<![\w/])(?:~|\.{1,2})?(?:/[\w.@+~-]+){2,}/?"), "a server-side path"),
    (re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception|Exit|Interrupt)\b"), "an internal error"),
    (re.compile(r"\bTraceback \(most recent call last\)"), "an internal error"),
]

# Upstream codes whose text our own servers wrote for the caller (bad input, missing report, overload); any
# other code from an internal hop (UNAVAILABLE, INTERNAL, UNKNOWN, ...) is transport detail, kept in the log.
CALLER_FACING_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)


def redact(text: str) -> str:
    """`text` with addresses, ports, paths and exception class names replaced by words."""
    for pattern, word in _PATTERNS:
        text = pattern.sub(word, text)
    return text


def cite(text: str, request_id: str) -> str:
    """`text` naming the request id the log holds the details under (once)."""
    if not request_id or request_id in text:
        return text
    return f"{text} (request id {request_id})"


def upstream_message(code: grpc.StatusCode, details: str) -> str:
    """What the caller learns of an internal hop's failure: its own message for caller-facing codes, else
    only that an internal service failed, with which code."""
    if code in CALLER_FACING_CODES and details:
        return redact(details)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return "an internal service did not answer in time"
    return f"an internal service failed ({code.name.lower().replace('_', ' ')}); details are in the server log"
