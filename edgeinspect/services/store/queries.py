"""The report store's query language: ids, page tokens, filters and count merging (pure functions, no I/O)."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime

from edgeinspect.errors import InvalidInput
from edgeinspect.v1 import inspection_pb2

DONE = "done"
# Ids are 32 hex characters; anything much longer is not an id and is never echoed back whole.
MAX_ID_CHARS = 128
MAX_TOKEN_CHARS = 256
MAX_CLASS_CHARS = 128
# SQLite integers are signed 64-bit.
_INT64 = 1 << 63
VALID_VERDICTS = frozenset(inspection_pb2.Verdict.values())


def as_us(value: datetime | int) -> int:
    """Epoch microseconds; naive datetimes are taken as UTC (the store keeps UTC only)."""
    if isinstance(value, int):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def short_id(value: str) -> str:
    """An id for a message: whole when it is id-sized, else its start and its length."""
    return repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"


def check_id(report_id: str) -> None:
    if len(report_id) > MAX_ID_CHARS:
        raise InvalidInput(
            f"report_id is {len(report_id)} characters long; report ids are 32 hex characters (at most {MAX_ID_CHARS})"
        )


def encode_token(created_us: int, report_id: str) -> str:
    raw = json.dumps([created_us, report_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> tuple[int, str]:
    bad = InvalidInput(f"malformed page_token {token[:40]!r}: pass back a next_page_token unchanged")
    # A real token is ~70 characters; the bound also keeps a deeply nested JSON from reaching the parser.
    if len(token) > MAX_TOKEN_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_us, report_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError, RecursionError) as exc:
        raise bad from exc
    if not isinstance(created_us, int) or isinstance(created_us, bool) or not isinstance(report_id, str):
        raise bad
    if not -_INT64 <= created_us < _INT64 or len(report_id) > MAX_ID_CHARS:
        raise bad
    return created_us, report_id


def filters(
    *, station="", part="", camera_id="", verdict=0, defect_class="", review=0, since=None, until=None
) -> tuple[list[str], list]:
    """WHERE terms (over reports r) and their arguments for the list and aggregate filters."""
    if verdict and verdict not in VALID_VERDICTS:
        raise InvalidInput(f"unknown verdict {verdict}; expected one of {sorted(VALID_VERDICTS)}")
    if review not in inspection_pb2.ReviewFilter.values():
        raise InvalidInput(f"unknown review filter {review}; expected one of {inspection_pb2.ReviewFilter.keys()}")
    for name, value in (("station", station), ("part", part), ("camera_id", camera_id), ("class", defect_class)):
        if len(value) > MAX_CLASS_CHARS:
            raise InvalidInput(f"{name} filter is {len(value)} characters; at most {MAX_CLASS_CHARS}")
    where: list[str] = ["r.status = ?"]
    args: list[object] = [DONE]
    for column, value in (("station", station), ("part", part), ("camera_id", camera_id), ("verdict", verdict)):
        if value:
            where.append(f"r.{column} = ?")
            args.append(value)
    if defect_class:
        where.append("EXISTS (SELECT 1 FROM report_classes c WHERE c.report_id = r.report_id AND c.defect_class = ?)")
        args.append(defect_class.strip().lower())
    review_terms: dict[int, list[str]] = {
        inspection_pb2.REVIEW_FILTER_REVIEWED: ["r.reviewed = 1"],
        inspection_pb2.REVIEW_FILTER_UNREVIEWED: ["r.reviewed = 0"],
        inspection_pb2.REVIEW_FILTER_DISAGREED: ["r.disagreed = 1"],
    }
    where += review_terms.get(review, [])
    if since is not None:
        where.append("r.created_us >= ?")
        args.append(as_us(since))
    if until is not None:
        where.append("r.created_us < ?")
        args.append(as_us(until))
    return where, args


def merge_counts(verdict_rows: list[tuple], class_rows: list[tuple]) -> list[dict]:
    """(station, bucket, verdict, n, reviewed, disagreed) and (station, bucket, class, n) rows -> one dict per
    (station, bucket), ordered by station then bucket."""
    out: dict[tuple[str, int], dict] = {}

    def cell(station: str, start: int) -> dict:
        if (station, start) not in out:
            out[station, start] = {"station": station, "bucket_start_us": start, "total": 0, "by_verdict": {},
                                   "by_class": {}, "reviewed": 0, "disagreed": 0}  # fmt: skip
        return out[station, start]

    for station, start, verdict, n, reviewed, disagreed in verdict_rows:
        c = cell(station, start)
        c["total"] += n
        c["by_verdict"][inspection_pb2.Verdict.Name(verdict) if verdict in VALID_VERDICTS else str(verdict)] = n
        c["reviewed"] += reviewed
        c["disagreed"] += disagreed
    for station, start, defect_class, n in class_rows:
        cell(station, start)["by_class"][defect_class] = n
    return [out[k] for k in sorted(out)]
