"""A declared schema's fields, read without Spark: what loading a feed and planning a run check against.

A JSON feed declares its value's fields in the feed file (``fields``, or ``schema_ddl`` in
Spark's DDL, read by :func:`ddl_fields`); an Avro feed's come from the registry's reader
schema (:func:`avro_fields`). Each field is a :class:`DeclaredField`: its type's name and,
for a record or an array of records, its own fields. Masked paths
(:mod:`tidemark.config.masking`) and a partitioning's field (:func:`field_kind`,
:class:`tidemark.config.models.FieldPartitioning`) are checked against them. Spark's own
parser has the last word when a run decodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# What a field's type lets a partitioning do with it (:func:`tidemark.config.models.partition_refusal`).
FieldKind = Literal["timestamp", "date", "integer", "string", "decimal", "scalar", "nested"]


@dataclass(frozen=True)
class DeclaredField:
    """A field of a declared schema: its type's name (``struct``, ``array``, ``map`` or a scalar's) and, for a
    struct or an array of structs, its fields."""

    type: str
    fields: Mapping[str, DeclaredField] | None = None


STRING_TYPES = frozenset({"string", "varchar", "char", "binary"})


def _split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside ``<>``, ``()`` and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'`\"":
            quote = ch
        elif ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


_ENTRY = re.compile(r"^`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s*(.+)$", re.S)


def _type_of(text: str) -> DeclaredField:
    text = re.sub(r"\s+(NOT\s+NULL|COMMENT\s+'.*')\s*$", "", text.strip(), flags=re.I).strip()
    lower = text.lower()
    if lower.startswith("struct<") and lower.endswith(">"):
        return DeclaredField("struct", ddl_fields(text[len("struct<") : -1]))
    if lower.startswith("array<") and lower.endswith(">"):
        element = _type_of(text[len("array<") : -1])
        return DeclaredField("array", element.fields)
    if lower.startswith("map<"):
        return DeclaredField("map")
    return DeclaredField(re.split(r"[\s(]", lower, maxsplit=1)[0])


def ddl_fields(ddl: str) -> dict[str, DeclaredField]:
    """The fields of a Spark DDL schema (``id long NOT NULL, customer struct<email: string>``), nested ones
    included; raises ``ValueError`` on text it cannot read (Spark's own parser has the last word in the job)."""
    fields: dict[str, DeclaredField] = {}
    for entry in _split_top(ddl):
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"cannot read {entry!r} as 'name type'")
        fields[match.group(1)] = _type_of(match.group(2))
    return fields


def avro_fields(schema: str) -> dict[str, DeclaredField]:
    """The fields of an Avro record schema (JSON text), nested records, arrays of them and named types included,
    as the job decodes them: a union of null and one type is that type, enums are strings, bytes and fixed binary."""
    named: dict[str, DeclaredField] = {}

    def walk(t: Any) -> DeclaredField:
        if isinstance(t, str):
            primitive = {"bytes": "binary", "fixed": "binary", "enum": "string"}.get(t, t)
            return named.get(t) or named.get(t.rpartition(".")[2]) or DeclaredField(primitive)
        if isinstance(t, list):
            branches = [b for b in t if b != "null"]
            return walk(branches[0]) if len(branches) == 1 else DeclaredField("union")
        kind = t.get("type")
        if kind == "record":
            found = DeclaredField("struct", {f["name"]: walk(f["type"]) for f in t.get("fields", [])})
        elif kind == "array":
            found = DeclaredField("array", walk(t.get("items")).fields)
        elif kind in ("enum", "fixed"):
            found = DeclaredField("string" if kind == "enum" else "binary")
        else:  # a map, or a primitive (a logical type other than on a string is not text: decimal, timestamp...)
            logical = t.get("logicalType")
            plain = "binary" if kind == "bytes" else str(kind)
            found = DeclaredField(str(logical) if logical and kind != "string" else plain)
        if "name" in t and kind in ("record", "enum", "fixed"):
            named[str(t["name"])] = named[f"{t.get('namespace', '')}.{t['name']}".lstrip(".")] = found
        return found

    top = walk(json.loads(schema))
    return dict(top.fields or {})


_DDL_KINDS: tuple[tuple[str, FieldKind], ...] = (
    ("struct", "nested"), ("array", "nested"), ("map", "nested"), ("timestamp", "timestamp"), ("date", "date"),
    ("bigint", "integer"), ("long", "integer"), ("integer", "integer"), ("int", "integer"), ("smallint", "integer"),
    ("short", "integer"), ("tinyint", "integer"), ("byte", "integer"), ("string", "string"), ("varchar", "string"),
    ("char", "string"), ("decimal", "decimal"), ("dec", "decimal"), ("numeric", "decimal"),
)  # fmt: skip


def field_kind(type_text: str) -> FieldKind:
    """A declared type's kind: a Spark DDL type's (``timestamp_ntz`` is a timestamp, ``decimal(10,2)`` a
    decimal, ``double`` a scalar) or a JSON ``fields`` type's (``number`` and ``boolean`` are scalars)."""
    text = type_text.strip().lower()
    for prefix, kind in _DDL_KINDS:
        if re.match(rf"{prefix}\b", text) or text.startswith(f"{prefix}_") or text.startswith(f"{prefix}<"):
            return kind
    return "scalar"
