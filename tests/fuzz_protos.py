"""Hypothesis strategies for any protobuf message, built from its descriptor: every field type at its edges (full
integer ranges, NaN and infinities, empty / long / odd strings, unknown enum numbers, nested messages to a depth,
repeated fields and maps), so a fuzz needs no hand-written strategy per message."""

from __future__ import annotations

import re

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_ODD_TEXT = ["", " ", "x" * 5000, "../../etc/passwd", "\x00", "é😀", '[2e70,"x"]', "{}", "-1", "SELECT 1;"]

# What no answer to a caller may contain: a Python exception class name, or an address of ours.
EXCEPTION_NAME = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b|Traceback")


def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({lo, hi, 0, 1, min(hi, 2**31), max(lo, -1)})
    return st.one_of(st.sampled_from(edges), st.integers(max(lo, -1000), min(hi, 1000)), st.integers(lo, hi))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t in _INT_RANGES:
        return _integers(*_INT_RANGES[t])
    if t == FieldDescriptor.TYPE_DOUBLE:
        return st.floats(allow_nan=True, allow_infinity=True)
    if t == FieldDescriptor.TYPE_FLOAT:
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(_ODD_TEXT), st.text(max_size=40))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=96)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-3, 50))
    raise TypeError(f"no strategy for field type {t} ({field.full_name})")


def messages(descriptor: Descriptor, depth: int = 3) -> st.SearchStrategy:
    """Messages of `descriptor`'s type with any subset of their fields set."""
    cls = message_factory.GetMessageClass(descriptor)
    fields: dict[str, st.SearchStrategy] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            entry = field.message_type
            if entry.GetOptions().map_entry:
                key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
                if value.type == FieldDescriptor.TYPE_MESSAGE:
                    continue
                fields[field.name] = st.dictionaries(_scalar(key), _scalar(value), max_size=4)
                continue
            if depth <= 0:
                continue
            sub = messages(entry, depth - 1)
            is_repeated = field.is_repeated
            fields[field.name] = st.lists(sub, max_size=3) if is_repeated else sub
        elif field.is_repeated:
            fields[field.name] = st.lists(_scalar(field), max_size=6)
        else:
            fields[field.name] = _scalar(field)

    def build(values: dict) -> object:
        msg = cls()
        for name, value in values.items():
            target = getattr(msg, name)
            field = descriptor.fields_by_name[name]
            if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
                target.update(value)
            elif field.is_repeated:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return st.fixed_dictionaries({}, optional=fields).map(build)


def raw_bytes() -> st.SearchStrategy[bytes]:
    """Bytes on the wire: random, and a few that are almost protobuf (bad varints, truncated lengths, deep nesting)."""
    crafted = [
        b"\xff" * 11,  # a varint that never ends
        b"\x0a\x7f" + b"x" * 3,  # a length beyond the data
        b"\x0a\x02" * 2000,  # nesting 2000 deep
        b"\x08",  # a tag without its value
        b"\x00\x00",  # field number 0
        b"\x0f\x01",  # wire type 7
    ]
    return st.one_of(st.sampled_from(crafted), st.binary(min_size=1, max_size=200))
