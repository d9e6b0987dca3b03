"""JSON Schema keys and values in the Schema Registry wire format: the reader schema as a Spark type, its checks.

A key or value is magic byte ``0``, a 4-byte schema id, then a JSON document (what
confluent-kafka's ``JSONSerializer`` writes). The run's records are all read with one
reader schema, a JSON Schema: the feed's pinned ``schema_version`` of its subject, else
the subject's latest. Writer schemas are fetched only to know each id is registered (an
unknown id fails the run, :mod:`tidemark.spark.wire`); JSON has no resolution rules, so a
record that does not fit the reader is a bad record, not a failed run. A key's reader
schema, like a value's, is an object with properties (its subject ``<topic>-key``).

The reader maps onto a Spark type (:func:`spark_type`): ``object`` with ``properties`` →
struct, ``object`` with only ``additionalProperties`` → map of string keys, ``array`` →
array, ``integer`` → long, ``number`` → double, ``string`` → string (``format: date`` →
date, ``format: date-time`` → timestamp), ``boolean``, ``enum`` → string. A type list or
``anyOf``/``oneOf`` with ``null`` makes a nullable type; local ``$ref`` are followed.
Decoding is Spark's ``from_json`` on the body (JVM speed, no Python per record); what
``from_json`` does not check (required properties, enum values, at any depth) is one
column expression, :func:`violations`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, RecordPart
from tidemark.errors import SchemaError
from tidemark.kafka.registry import MAX_JSON_DEPTH, RegistryClient, json_depth
from tidemark.spark.decode import _CORRUPT as CORRUPT
from tidemark.spark.wire import (
    RegistrySchemas,
    SchemaUse,
    body,
    check_columns,
    reader_name,
    reader_version,
    refuse_unframed,
    schema_changed_events,
    writer_schemas,
)

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType


@dataclass(frozen=True)
class JsonSchemas(RegistrySchemas):
    reader: str = "{}"

    @property
    def document(self) -> dict[str, Any]:
        return dict(json.loads(self.reader))

    @property
    def field_names(self) -> list[str]:
        return list(self.document["properties"])


def resolve_schemas(
    uses: list[SchemaUse], feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> JsonSchemas:
    """The reader JSON Schema of ``part`` (checked to map onto Spark types) and every writer id of ``uses`` checked
    to exist."""
    refuse_unframed(uses, "the JSON document", part)
    reader = reader_version(feed, client, part=part)
    where = f"feed '{feed.name}': {reader_name(part)} (subject '{reader.subject}' version {reader.version})"
    if json_depth(reader.schema.encode()) > MAX_JSON_DEPTH:  # json.loads would raise RecursionError
        raise SchemaError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels; no Spark column holds such records")
    doc = json.loads(reader.schema)
    if not isinstance(doc, dict) or _deref(doc, doc).get("type") != "object" or "properties" not in _deref(doc, doc):
        as_what = "columns" if part == "value" else "the key struct's fields"
        raise SchemaError(f"{where} is not an object with properties; Tidemark publishes its properties as {as_what}")
    try:
        spark_type(doc)
    except ValueError as exc:
        raise SchemaError(f"{where} does not map onto Spark types: {exc}") from None
    if part == "value":
        check_columns(feed, reader, _deref(doc, doc)["properties"])
    writers, _ = writer_schemas(uses, feed, client, lambda sid: client.typed_schema(sid)[:2], part)
    # Kept self-contained: definitions the reader refers to travel with it.
    flat = {**_deref(doc, doc), **{k: doc[k] for k in ("definitions", "$defs") if k in doc}}
    return JsonSchemas(
        format="json_schema", subject=reader.subject, version=reader.version, reader_id=reader.schema_id,
        writer_ids=tuple(writers), seen=tuple(uses),
        events=tuple(schema_changed_events(uses, reader.schema_id, part)), reader=json.dumps(flat),
    )  # fmt: skip


def _deref(node: Any, root: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """``node`` with a local ``$ref`` (``#/definitions/X``, ``#/$defs/X``) followed."""
    if not isinstance(node, dict):
        raise ValueError(f"{node!r} is not a schema")
    ref = node.get("$ref")
    if ref is None:
        return node
    if depth > 32:
        raise ValueError(f"'$ref' {ref} is recursive; a Spark type cannot nest without end")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise ValueError(f"'$ref' {ref!r} is not a reference inside the schema")
    target: Any = root
    for part in ref[2:].split("/"):
        target = target[part.replace("~1", "/").replace("~0", "~")]
    return _deref(target, root, depth + 1)


def _non_null(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``node`` without its ``null`` alternative (a type list, or ``anyOf``/``oneOf`` of one type and null)."""
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = [o for o in (_deref(o, root) for o in node[key]) if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"'{key}' of several types has no single Spark type")
            return _non_null(options[0], root)
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f"type {kind} has no single Spark type")
        return {**node, "type": kinds[0]}
    return node


# How deep a Spark type built from a JSON Schema may nest: far beyond any real record, far below Python's
# recursion limit (each level costs a few frames).
MAX_TYPE_DEPTH = 64


def spark_type(doc: dict[str, Any]) -> DataType:
    """The Spark type of a JSON Schema document (every field nullable: required is checked by :func:`violations`).

    A recursive schema (a ``$ref`` reached again inside what it refers to) and one nesting deeper than
    :data:`MAX_TYPE_DEPTH` raise ``ValueError`` naming the path: a Spark type is finite.
    """
    return _type(doc, doc, "$")


def _type(node: Any, root: dict[str, Any], path: str, refs: tuple[str, ...] = ()) -> DataType:
    from pyspark.sql import types as T

    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str) and ref in refs:
        raise ValueError(
            f"{path}: '$ref' {ref} is recursive (it is inside itself); a Spark type cannot nest without end"
        )
    if isinstance(ref, str):
        refs = (*refs, ref)
    if path.count(".") + path.count("[]") > MAX_TYPE_DEPTH:
        raise ValueError(f"{path}: the schema nests deeper than {MAX_TYPE_DEPTH} levels, more than Tidemark maps")
    node = _non_null(_deref(node, root), root)
    kind = node.get("type")
    if kind is None and "enum" in node:
        kind = "string"
    if kind == "object":
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if not props and isinstance(extra, dict):
            return T.MapType(T.StringType(), _type(extra, root, f"{path}.*", refs), True)
        if not props:
            raise ValueError(f"{path}: an object without properties or an additionalProperties schema")
        return T.StructType([T.StructField(n, _type(s, root, f"{path}.{n}", refs), True) for n, s in props.items()])
    if kind == "array":
        if not isinstance(node.get("items"), dict):
            raise ValueError(f"{path}: an array without one 'items' schema")
        return T.ArrayType(_type(node["items"], root, f"{path}[]", refs), True)
    if kind == "string":
        return {"date": T.DateType(), "date-time": T.TimestampType()}.get(node.get("format"), T.StringType())
    scalars = {"integer": T.LongType(), "number": T.DoubleType(), "boolean": T.BooleanType()}
    if kind in scalars:
        return scalars[kind]
    raise ValueError(f"{path}: type {kind!r} has no Spark type")


def violations(doc: dict[str, Any]) -> Check | None:
    """A test per decoded value: true where a required property is missing or null, or a string is not one of
    its enum's values, at any depth (through arrays and maps too); None when the schema asks neither."""
    return _violations(doc, doc)


Check = Callable[["Column"], "Column"]


def _violations(node: Any, root: dict[str, Any]) -> Check | None:
    from pyspark.sql import functions as F

    node = _non_null(_deref(node, root), root)
    kind = node.get("type")
    if kind == "object" and node.get("properties"):
        required = [r for r in node.get("required", ()) if r in node["properties"]]
        children = {n: c for n, s in node["properties"].items() if (c := _violations(s, root)) is not None}
        if not required and not children:
            return None

        def check_object(c: Column) -> Column:
            tests = [c.isNotNull() & c.getField(r).isNull() for r in required]
            return _any(tests + [child(c.getField(n)) for n, child in children.items()])

        return check_object
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        value = _violations(node["additionalProperties"], root)
        return None if value is None else lambda c: _exists(F.map_values(c), value)
    if kind == "array" and isinstance(node.get("items"), dict):
        item = _violations(node["items"], root)
        return None if item is None else lambda c: _exists(c, item)
    values = node.get("enum")
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return lambda c: c.isNotNull() & ~c.isin(*values)
    return None


def _exists(array: Column, test: Check) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.exists(array, lambda x: F.coalesce(test(x), F.lit(False))), F.lit(False))


def _any(tests: list[Column]) -> Column:
    from pyspark.sql import functions as F

    out = F.coalesce(tests[0], F.lit(False))
    for test in tests[1:]:
        out = out | F.coalesce(test, F.lit(False))
    return out


def parsed_value(schemas: JsonSchemas, column: str = "value") -> Column:
    """``column``'s body (after the 5-byte prefix) parsed with the reader's type, plus :data:`CORRUPT` (the text of
    a body that is not JSON or does not fit the types)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    struct = spark_type(schemas.document)
    assert isinstance(struct, T.StructType)
    with_corrupt = T.StructType([*struct.fields, T.StructField(CORRUPT, T.StringType(), True)])
    return F.from_json(body_text(column), with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})


def body_text(column: str = "value") -> Column:
    """``column`` after the wire format's prefix, as text."""
    return body(column).cast("string")
