"""A feed's sensitive fields (``masking:``): which parts of a record are masked, and how.

A feed names value fields by their path (``customer.email``: dots walk into nested
records, and through arrays of records, ``items.sku`` masking every item's ``sku``), the
Kafka key (``key``) and headers by name (``headers``), each with a treatment:

- ``drop``: the field is removed from its record (the key becomes null, the header is removed);
- ``hash``: HMAC-SHA256 under the deployment's masking key, as 64 lower-case hex digits
  (the same value and key give the same digest: masked values still join and count);
- ``redact``: the fixed marker :data:`MASKED`;
- ``{truncate: N}``: the first N characters of a text (bytes of a binary value).

``keep_raw`` names a separately secured location (a local folder or ``s3://...``, never
inside the feed's output) that receives the raw key, value and headers of the feed's
quarantined records; without it the quarantine holds only masked columns and no raw bytes.

The paths are checked when the feed loads against the declared JSON schema (``fields`` or
``schema_ddl``, read here by :func:`ddl_fields`, so that loading a feed needs no Spark); an
Avro feed's when a run is planned, against the reader schema the registry gives
(:func:`avro_fields`); every format's by the job against the decoded records
(:func:`tidemark.spark.masking.mask_records`). Masking itself happens in the Spark job right
after decoding: see :mod:`tidemark.spark.masking`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

MASKED = "[masked]"
MASKING_KEY_ENV = "TIDEMARK_MASKING_KEY"  # the HMAC key of ``hash`` (an Airflow connection's password in DAGs)

Named = Literal["drop", "hash", "redact"]
PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Truncate(BaseModel):
    """``{truncate: N}``: keep the first N characters (bytes of a binary value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    truncate: PositiveInt


Treatment = Named | Truncate


def treatment_name(treatment: Treatment) -> str:
    """``drop``, ``hash``, ``redact`` or ``truncate``."""
    return treatment if isinstance(treatment, str) else "truncate"


class Masking(BaseModel):
    """``masking:``: value fields by path, the key and headers by name, each with its treatment; ``keep_raw``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fields: dict[str, Treatment] = Field(default_factory=dict)
    key: Treatment | None = None
    headers: dict[str, Treatment] = Field(default_factory=dict)
    keep_raw: str | None = Field(default=None, min_length=1)

    @field_validator("fields")
    @classmethod
    def _paths_ok(cls, v: dict[str, Treatment]) -> dict[str, Treatment]:
        for path in v:
            if not PATH.match(path):
                raise ValueError(
                    f"masking.fields: {path!r} is not a field path (names joined by dots, e.g. customer.email)"
                )
        nested = [(a, b) for a in v for b in v if b.startswith(a + ".")]
        if nested:
            a, b = nested[0]
            raise ValueError(f"masking.fields: {b!r} lies inside {a!r}, which is masked whole; name one of them")
        return v

    @field_validator("headers")
    @classmethod
    def _header_names_ok(cls, v: dict[str, Treatment]) -> dict[str, Treatment]:
        if any(not name for name in v):
            raise ValueError("masking.headers: a header name is empty")
        return v

    @property
    def hashes(self) -> bool:
        """Whether any treatment is ``hash`` (so the job needs the masking key)."""
        return "hash" in (*self.fields.values(), self.key, *self.headers.values())

    @property
    def dropped(self) -> tuple[str, ...]:
        """The value paths dropped from the record."""
        return tuple(p for p, t in self.fields.items() if t == "drop")


# -- a declared schema's fields, for checking paths without Spark ----------------------------


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


def path_problem(path: str, treatment: Treatment, declared: Mapping[str, DeclaredField]) -> str | None:
    """Why ``path`` cannot be masked with ``treatment`` in ``declared`` (a missing field, a truncate of a
    non-text), or None."""
    here: Mapping[str, DeclaredField] | None = declared
    walked: list[str] = []
    found: DeclaredField | None = None
    for name in path.split("."):
        if here is None:
            kind = found.type if found else "?"
            return f"'{'.'.join(walked)}' is of type {kind}, not a record: it has no field '{name}'"
        if name not in here:
            known = ", ".join(sorted(here)) or "none"
            where = f"'{'.'.join(walked)}'" if walked else "the declared schema"
            return f"{where} has no field '{name}' (its fields: {known})"
        found = here[name]
        walked.append(name)
        here = found.fields
    if isinstance(treatment, Truncate) and found is not None and found.type not in STRING_TYPES:
        return f"truncate needs a string or binary field; '{path}' is of type {found.type}"
    return None


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


def masking_problems(masking: Masking, declared: Mapping[str, DeclaredField]) -> list[str]:
    """Every masked path of ``masking`` that ``declared`` cannot take, as ``masking.fields.<path>: <why>``."""
    found = ((path, path_problem(path, treatment, declared)) for path, treatment in masking.fields.items())
    return [f"masking.fields.{path}: {problem}" for path, problem in found if problem is not None]
