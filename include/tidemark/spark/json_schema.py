"""JSON Schema keys and values in the Schema Registry wire format: the reader schema as a Spark type, each record
checked by the ``jsonschema`` library and typed from the parsed document.

A key or value is magic byte ``0``, a 4-byte schema id, then a JSON document (what
confluent-kafka's ``JSONSerializer`` writes). The run's records are all read with one
reader schema, a JSON Schema: the feed's pinned ``schema_version`` of its subject, else
the subject's latest. Writer schemas are fetched for each id seen (an unknown id fails the
run, :mod:`tidemark.spark.wire`; in a re-drive, :func:`current_schemas`, it fails only its
own records, with a reason naming it). JSON has no resolution rules, so a record that does not
fit is a bad record, not a failed run; a reader schema that has no Spark type fails the
run at planning, naming the subject, the version and the field.

The reader maps onto a Spark type (:func:`spark_type`): ``object`` with ``properties`` →
struct (properties the reader does not list are not published, as an Avro reader skips a
writer's extra fields), ``object`` with only ``additionalProperties`` or
``patternProperties`` schemas of one type → map of string keys, ``array`` with one
``items`` schema → array, ``integer`` → long, ``number`` → double, ``string`` → string
(``format: date`` → date, ``format: date-time`` → timestamp), ``boolean``, ``enum`` and
``const`` → their values' type. A type list, ``anyOf``/``oneOf``/``allOf`` take the one
type their alternatives share, ``null`` making it nullable; local ``$ref`` are followed.
Anything else (several types, a recursive ``$ref``, a schema that admits any value, tuple
arrays, remote references) is refused.

Each record is decoded in the Python workers (``mapInArrow``, :func:`decoded_frame`) by
:class:`RecordChecker`, exactly as a reader with the reference libraries would: the body is
parsed with ``json.loads``, validated with ``jsonschema`` against the reader schema and,
when it carries another id, its writer schema, each under its own draft (``$schema``;
Draft 7 when absent, as the registries assume), with ``date`` and ``date-time`` formats
asserted as RFC 3339 says (``t``/``z`` in either case). The published values are then
taken from the parsed document, and a value the column type cannot hold exactly (an
integer beyond 64 bits, an integer a double would round, a time finer than microseconds
or outside years 1–9999) makes the record bad too. A bad record's reason names the field
and the rule it broke (:meth:`JsonSchemas.reasons`: a bounded list, derived from the
schemas, as the job's outcome codes need). Measured, 100,000 records of the integration
tests' ``Order`` schema: 15 s of CPU in one worker, ``jsonschema`` 9 s of it; through Spark
11-15 s where ``from_json`` took 1.5-2.1 s (a loaded 2-core box; ``docs/schemas.md``). This
is the price of the reference's verdict: ``from_json`` was faster and published wrong values.
:data:`FORMAT` is how :mod:`tidemark.spark.decode` decodes JSON Schema
(:class:`~tidemark.spark.formats.RegistryFormat`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, RecordPart
from tidemark.errors import SchemaError
from tidemark.kafka.registry import MAX_JSON_DEPTH, RegistryClient, SubjectVersion, json_depth
from tidemark.spark.formats import PartDecoding, Reasons, RegistryFormat
from tidemark.spark.wire import (
    HEADER_BYTES,
    MAGIC,
    RegistrySchemas,
    SchemaUse,
    check_columns,
    current_writers,
    reader_name,
    reader_version,
    refuse_unframed,
    schema_changed_events,
    unresolved_reason,
    where,
    writer_schemas,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

# jsonschema (a third of a second to import here) and Spark are imported inside the functions that use them: decoding
# (tidemark.spark.decode) loads this module for every feed, and only a JSON Schema feed's run validates.
REASON = "_tidemark_reason"  # the decoded struct's field: null where the record decoded, else why it did not
READER = "the reader JSON Schema"
_DEFAULT_DRAFT = "http://json-schema.org/draft-07/schema#"  # what the registries assume without "$schema"
_MAX_REF_DEPTH = 32


@dataclass(frozen=True)
class JsonSchemas(RegistrySchemas):
    """The reader schema's text, and each writer id's (the reader's own id among them when records carry it)."""

    reader: str = "{}"
    writers: tuple[tuple[int, str], ...] = ()
    part: RecordPart = "value"
    # A re-drive's writer ids that do not resolve, each with the reason its records fail (current_schemas).
    unresolved: tuple[tuple[int, str], ...] = ()
    # A re-drive's reason for a record not in the wire format (a run refuses such records before decoding).
    unframed: str | None = None

    @property
    def document(self) -> dict[str, Any]:
        return dict(json.loads(self.reader))

    @property
    def field_names(self) -> list[str]:
        doc = self.document
        return list(_deref(doc, doc)["properties"])

    def reasons(self) -> list[str]:
        """Every reason a record can be bad for, in a fixed order: the job stages bad records by their reason's
        index (:func:`tidemark.spark.decode.decode_reasons`)."""
        doc = self.document
        writers = [(sid, json.loads(text)) for sid, text in self.writers if sid != self.reader_id]
        names = frozenset(_property_names([doc, *(w for _, w in writers)]))
        out = [*base_reasons(self.part)]
        out += _rule_reasons(doc, self.part, READER, names)
        out += [_unfit_reason(self.part, path, t) for path, t in _leaves(spark_type(doc), "")]
        for sid, written in writers:
            whose = _writer(sid)
            out += [_invalid_reason(self.part, whose), *_rule_reasons(written, self.part, whose, names)]
        out += [why for _, why in self.unresolved]
        out += [self.unframed] if self.unframed is not None else []
        return list(dict.fromkeys(out))


def base_reasons(part: RecordPart) -> tuple[str, str, str]:
    """The reasons of any JSON Schema feed, whatever its schemas: not text, not JSON, not valid under the reader."""
    return (f"{part} is not valid UTF-8", f"{part} is not JSON (RFC 8259, as json.loads reads it)",
            _invalid_reason(part, READER))  # fmt: skip


def resolve_schemas(
    uses: list[SchemaUse], feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> JsonSchemas:
    """The reader JSON Schema of ``part`` (checked to map onto Spark types) and every writer id of ``uses`` checked
    to exist and to be a valid JSON Schema."""
    refuse_unframed(uses, "the JSON document", part)
    reader = _reader(feed, client, part)
    writers, first_use = writer_schemas(uses, feed, client, lambda sid: client.typed_schema(sid)[:2], part)
    for sid, text in writers.items():
        problem = _writer_problem(text)
        if problem is not None:
            raise SchemaError(f"{where(first_use[sid])}: schema id {sid}, the {part}s' writer schema, {problem[0]}; "
                              f"{problem[1]}")  # fmt: skip
    return JsonSchemas(
        format="json_schema", subject=reader.subject, version=reader.version, reader_id=reader.schema_id,
        writer_ids=tuple(writers), seen=tuple(uses),
        events=tuple(schema_changed_events(uses, reader.schema_id, part)), reader=reader.schema,
        writers=tuple(sorted(writers.items())), part=part,
    )  # fmt: skip


def current_schemas(
    ids: Iterable[int], feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> JsonSchemas:
    """What a re-drive decodes ``part`` of dead letters with: the feed's reader JSON Schema *now* (its pinned
    version, else the subject's latest), checked as a run's, and as writers those of ``ids`` (the schema ids the
    dead letters' raw bytes carry).

    Unlike a run's (:func:`resolve_schemas`), no writer fails it: an id the registry does not have, of another
    schema type, or not a valid JSON Schema is kept in ``unresolved`` with its reason, which its records get; a
    record not in the wire format gets ``unframed``'s.
    """
    reader = _reader(feed, client, part)
    writers, unresolved = current_writers(ids, feed, lambda sid: client.typed_schema(sid)[:2], part)
    for sid, text in list(writers.items()):
        problem = _writer_problem(text)
        if problem is not None:
            del writers[sid]
            unresolved[sid] = unresolved_reason(part, sid, f"which {problem[0]}")
    return JsonSchemas(
        format="json_schema", subject=reader.subject, version=reader.version, reader_id=reader.schema_id,
        writer_ids=tuple(writers), reader=reader.schema, writers=tuple(sorted(writers.items())), part=part,
        unresolved=tuple(sorted(unresolved.items())),
        unframed=f"{part} is not in the Schema Registry wire format (magic byte 0, a 4-byte schema id)",
    )  # fmt: skip


def _writer_problem(text: str) -> tuple[str, str] | None:
    """Why a writer schema's text cannot check records (``is not a valid JSON Schema (...)``) and the remedy, else
    None."""
    from jsonschema.exceptions import SchemaError as InvalidSchema

    try:
        written = json.loads(text)
        _validator_class(written).check_schema(written)
    except (ValueError, InvalidSchema) as exc:
        return (f"is not a valid JSON Schema ({getattr(exc, 'message', exc)})",
                "move the group past these records; nothing was published or committed")  # fmt: skip
    if outside := _outside_refs(written):
        return f"has references it cannot resolve ({', '.join(outside)})", _NO_REFERENCES
    return None


def _reader(feed: Feed, client: RegistryClient, part: RecordPart) -> SubjectVersion:
    """The reader JSON Schema of ``part``, checked to be an object with properties that map onto Spark types."""
    from jsonschema.exceptions import SchemaError as InvalidSchema

    reader = reader_version(feed, client, part=part)
    where_ = f"feed '{feed.name}': {reader_name(part)} (subject '{reader.subject}' version {reader.version})"
    if json_depth(reader.schema.encode()) > MAX_JSON_DEPTH:  # json.loads would raise RecursionError
        raise SchemaError(f"{where_} nests deeper than {MAX_JSON_DEPTH} levels; no Spark column holds such records")
    doc = json.loads(reader.schema)
    if not isinstance(doc, dict) or _deref(doc, doc).get("type") != "object" or "properties" not in _deref(doc, doc):
        as_what = "columns" if part == "value" else "the key struct's fields"
        raise SchemaError(f"{where_} is not an object with properties; Tidemark publishes its properties as {as_what}")
    try:
        _validator_class(doc).check_schema(doc)
    except InvalidSchema as exc:
        raise SchemaError(f"{where_} is not a valid JSON Schema: {exc.message}") from None
    if outside := _outside_refs(doc):
        raise SchemaError(f"{where_} has references it cannot resolve ({', '.join(outside)}); {_NO_REFERENCES}")
    try:
        spark_type(doc)
    except ValueError as exc:
        raise SchemaError(
            f"{where_} does not map onto Spark types: {exc}. Change the schema, or pin a schema_version whose "
            "fields each have one type; nothing was published or committed"
        ) from None
    if part == "value":
        check_columns(feed, reader, _deref(doc, doc)["properties"])
    return reader


_NO_REFERENCES = (
    "Tidemark checks records against self-contained schemas only ('$ref' as a JSON pointer into the schema: no "
    "registry references, remote documents or anchors): inline the definitions under '$defs'; nothing was "
    "published or committed"
)


def _outside_refs(node: Any, root: Any = None) -> list[str]:
    """The ``$ref`` values of ``node`` that do not name a part of the document ``root`` (default ``node``) by a JSON
    pointer: another document, a registry reference, an anchor, or nothing."""
    root = node if root is None else root
    if isinstance(node, list):
        return [r for item in node for r in _outside_refs(item, root)]
    if not isinstance(node, dict):
        return []
    own = []
    if "$ref" in node:
        try:
            _target(node["$ref"], root if isinstance(root, dict) else {})
        except ValueError:
            own.append(repr(node["$ref"]))
    return own + [r for key, value in node.items() if key not in ("enum", "const") for r in _outside_refs(value, root)]


# -- the reader as Spark types ------------------------------------------------------------------------------------


def _target(ref: Any, root: dict[str, Any]) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise ValueError(f"'$ref' {ref!r} is not a reference inside the schema")
    target: Any = root
    for part in ref[2:].split("/") if ref != "#" else ():
        try:
            target = target[part.replace("~1", "/").replace("~0", "~")]
        except (KeyError, TypeError):
            raise ValueError(f"'$ref' {ref!r} names nothing in the schema") from None
    return target


def _deref(node: Any, root: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """``node`` with a local ``$ref`` (``#/definitions/X``, ``#/$defs/X``) followed."""
    if not isinstance(node, dict):
        raise ValueError(f"{node!r} is not a schema with one Spark type")
    ref = node.get("$ref")
    if ref is None:
        return node
    if depth > _MAX_REF_DEPTH:
        raise ValueError(f"'$ref' {ref} is recursive; a Spark type cannot nest without end")
    return _deref(_target(ref, root), root, depth + 1)


def spark_type(doc: dict[str, Any]) -> DataType:
    """The Spark type of a JSON Schema document (every field nullable: ``required`` is checked per record)."""
    return _type(doc, doc, "$", 0)


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "array" if isinstance(value, list) else "null"


def _is_null(node: Any, root: dict[str, Any]) -> bool:
    if not isinstance(node, dict):
        return False
    node = _deref(node, root)
    values = node.get("enum", [node["const"]] if "const" in node else None)
    return bool(node.get("type") == "null" or values == [None])


_TYPED = ("type", "properties", "patternProperties", "additionalProperties", "items", "enum", "const", "$ref",
          "anyOf", "oneOf", "allOf")  # fmt: skip


def _type(node: Any, root: dict[str, Any], path: str, depth: int) -> DataType:
    from pyspark.sql import types as T

    if depth > _MAX_REF_DEPTH:
        raise ValueError(
            f"{path}: the schema nests deeper than {_MAX_REF_DEPTH} levels (a recursive '$ref', or nesting no "
            "record of a Spark column holds); a Spark type cannot nest without end"
        )
    if not isinstance(node, dict) or not any(k in node for k in _TYPED):
        raise ValueError(f"{path}: a schema that admits any JSON value has no single Spark type")
    if "$ref" in node:
        try:
            target = _target(node["$ref"], root)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        return _type(target, root, path, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f"{path}: type {kind} has no single Spark type")
        kind = kinds[0]
    if kind is None and ("properties" in node or "patternProperties" in node or "additionalProperties" in node):
        kind = "object"
    elif kind is None and "items" in node:
        kind = "array"
    elif kind is None and ("enum" in node or "const" in node):
        values = node["enum"] if "enum" in node else [node["const"]]
        kinds = sorted({_json_kind(v) for v in values if v is not None})
        if len(kinds) != 1 or kinds[0] in ("object", "array"):
            raise ValueError(f"{path}: enum/const values of kinds {kinds} have no single Spark type")
        kind = kinds[0]
    elif kind is None:
        return _alternatives(node, root, path, depth)
    if kind == "object":
        return _object(node, root, path, depth)
    if kind == "array":
        if not isinstance(node.get("items"), dict):
            raise ValueError(f"{path}: an array without one 'items' schema")
        return T.ArrayType(_type(node["items"], root, f"{path}[]", depth + 1), True)
    if kind == "string":
        return {"date": T.DateType(), "date-time": T.TimestampType()}.get(str(node.get("format")), T.StringType())
    scalars = {"integer": T.LongType(), "number": T.DoubleType(), "boolean": T.BooleanType()}
    if kind in scalars:
        return scalars[kind]
    raise ValueError(f"{path}: type {kind!r} has no Spark type")


def _alternatives(node: dict[str, Any], root: dict[str, Any], path: str, depth: int) -> DataType:
    """The one type of ``allOf``/``anyOf``/``oneOf`` alternatives (``null`` aside; ``allOf``'s untyped parts are
    only rules)."""
    found: list[DataType] = []
    for key in ("allOf", "anyOf", "oneOf"):
        for option in node.get(key, ()):
            if _is_null(option, root) or (key == "allOf" and not any(k in option for k in _TYPED)):
                continue
            t = _type(option, root, path, depth + 1)
            if t not in found:
                found.append(t)
    if len(found) != 1:
        keys = [k for k in ("allOf", "anyOf", "oneOf") if k in node]
        raise ValueError(f"{path}: '{'/'.join(keys)}' of several types has no single Spark type")
    return found[0]


def _object(node: dict[str, Any], root: dict[str, Any], path: str, depth: int) -> DataType:
    from pyspark.sql import types as T

    props = node.get("properties")
    if props:
        return T.StructType(
            [T.StructField(n, _type(s, root, f"{path}.{n}", depth + 1), True) for n, s in props.items()]
        )
    extra = node.get("additionalProperties")
    values = [*(node.get("patternProperties") or {}).values(), *([extra] if isinstance(extra, dict) else [])]
    if not values:
        raise ValueError(f"{path}: an object without properties or an additionalProperties/patternProperties schema")
    types = []
    for value in values:
        t = _type(value, root, f"{path}.*", depth + 1)
        if t not in types:
            types.append(t)
    if len(types) != 1:
        raise ValueError(f"{path}: a map whose values have several types has no single Spark type")
    return T.MapType(T.StringType(), types[0], True)


# -- reasons ------------------------------------------------------------------------------------------------------

# Keywords that only hold subschemas, name things, or annotate: never the rule a record broke.
_STRUCTURE = frozenset({
    "$schema", "$id", "id", "$ref", "$defs", "definitions", "$anchor", "$dynamicAnchor", "$dynamicRef",
    "$vocabulary", "$comment", "title", "description", "default", "examples", "readOnly", "writeOnly",
    "deprecated", "contentMediaType", "contentEncoding", "contentSchema", "properties", "patternProperties",
    "items", "prefixItems", "additionalItems", "contains", "propertyNames", "allOf", "if", "then", "else",
    "dependentSchemas", "unevaluatedItems",
})  # fmt: skip
_MAYBE_FALSE = frozenset({"additionalProperties", "unevaluatedProperties"})  # a rule of their own only when false


def _writer(sid: int) -> str:
    return f"its writer JSON Schema (id {sid})"


def _invalid_reason(part: RecordPart, whose: str) -> str:
    return f"{part} is not valid under {whose}"


def _at(part: RecordPart, path: str) -> str:
    return f"{part} field '{path}'" if path else part


def _rule_reason(part: RecordPart, whose: str, path: str, keyword: str | None, node: Any) -> str:
    """The reason of a value at ``path`` that breaks ``keyword`` of the schema ``node`` (a ``false`` schema when
    ``keyword`` is None)."""
    if keyword is None:
        return f"{_at(part, path)} is not allowed by {whose} (a 'false' schema)"
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        allowed = sorted([*node.get("properties", {}), *(f"/{p}/" for p in node.get("patternProperties", {}))])
        return (f"{_at(part, path)} has a property {whose} does not allow ('{keyword}': false; it allows only "
                f"{', '.join(allowed) or 'none'})")  # fmt: skip
    shown = node.get(keyword)
    if isinstance(shown, dict) or (isinstance(shown, list) and any(isinstance(v, dict) for v in shown)):
        return f"{_at(part, path)} breaks '{keyword}' of {whose}"
    text = json.dumps(shown)
    return f"{_at(part, path)} breaks {whose}: '{keyword}': {text if len(text) <= 80 else text[:77] + '...'}"


def _extra_reason(part: RecordPart, whose: str, path: str, name: str, keyword: str) -> str:
    return f"{_at(part, path)} has property '{name}', which {whose} does not allow ('{keyword}': false)"


def _extras(instance: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """The properties of ``instance`` that ``node``'s ``properties`` and ``patternProperties`` do not cover."""
    patterns = [re.compile(p) for p in node.get("patternProperties", {})]
    listed = node.get("properties", {})
    return [k for k in instance if k not in listed and not any(p.search(k) for p in patterns)]


def _property_names(node: Any) -> set[str]:
    """Every name under a ``properties`` keyword anywhere in ``node``."""
    if isinstance(node, list):
        return {n for item in node for n in _property_names(item)}
    if not isinstance(node, dict):
        return set()
    own = set(node["properties"]) if isinstance(node.get("properties"), dict) else set()
    return own | {n for key, v in node.items() if key not in ("enum", "const") for n in _property_names(v)}


def _required_reason(part: RecordPart, whose: str, path: str, name: str) -> str:
    return f"{_at(part, f'{path}.{name}' if path else name)} is missing, and {whose} requires it"


def _child(path: str, token: str) -> str:
    return f"{path}{token}" if token == "[]" else f"{path}.{token}" if path else token


def _rule_reasons(doc: Any, part: RecordPart, whose: str, names: frozenset[str] = frozenset()) -> list[str]:
    """Every reason :meth:`RecordChecker.rule_broken` can give under ``doc``: each rule at each field, the fields
    named as :func:`_error_field` names them. A reference is not followed again inside itself: the list stays
    small for recursive schemas, whose deeper fields get the schema's general reason. ``names``: the property
    names the run's schemas know, which a property ``additionalProperties: false`` forbids is named by."""
    out: list[str] = []
    root = doc if isinstance(doc, dict) else {}

    def walk(node: Any, path: str, refs: tuple[str, ...]) -> None:
        if node is False:
            out.append(_rule_reason(part, whose, path, None, node))
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in refs:
            try:
                walk(_target(ref, root), path, (*refs, ref))
            except ValueError:
                pass  # refused before reading (_outside_refs)
        for keyword, value in node.items():
            if keyword == "required" and isinstance(value, list):
                out.extend(_required_reason(part, whose, path, str(n)) for n in value)
            elif keyword not in _STRUCTURE and not (keyword in _MAYBE_FALSE and value is not False):
                out.append(_rule_reason(part, whose, path, keyword, node))
                if keyword in _MAYBE_FALSE:
                    out.extend(_extra_reason(part, whose, path, n, keyword) for n in sorted(names)
                               if n not in node.get("properties", {}))  # fmt: skip
            for sub, child in _subschemas(keyword, value, path):
                walk(sub, child, refs)

    walk(doc, "", ())
    return out


def _subschemas(keyword: str, value: Any, path: str) -> Iterator[tuple[Any, str]]:
    """The subschemas under ``keyword`` and the field path of the values each applies to."""
    if keyword == "properties" and isinstance(value, dict):
        yield from ((s, _child(path, n)) for n, s in value.items())
    elif keyword in ("patternProperties", "dependentSchemas", "dependencies") and isinstance(value, dict):
        each = _child(path, "*") if keyword == "patternProperties" else path
        yield from ((s, each) for s in value.values())
    elif keyword in ("additionalProperties", "unevaluatedProperties", "propertyNames"):
        yield value, _child(path, "*")
    elif keyword in ("items", "prefixItems", "additionalItems", "contains", "unevaluatedItems"):
        yield from ((s, _child(path, "[]")) for s in (value if isinstance(value, list) else [value]))
    elif keyword in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
        yield from ((s, path) for s in value)
    elif keyword in ("not", "if", "then", "else"):
        yield value, path


_SKIP_NEXT = frozenset({"allOf", "anyOf", "oneOf", "dependentSchemas", "dependencies", "definitions", "$defs"})


def _error_field(schema_path: Any, keyword: str | None) -> str:
    """The field path (``a.b``, ``a[]``, ``m.*``) of an error at ``schema_path`` (the schema's keywords from the
    root to the broken rule), named as :func:`_rule_reasons` names it."""
    tokens = list(schema_path)
    if keyword is not None and tokens:
        tokens = tokens[:-1]  # the broken rule itself
    path, i = "", 0
    while i < len(tokens):
        token = tokens[i]
        if token == "properties" and i + 1 < len(tokens):
            path, i = _child(path, str(tokens[i + 1])), i + 2
        elif token == "patternProperties":
            path, i = _child(path, "*"), i + 2
        elif token in ("additionalProperties", "unevaluatedProperties", "propertyNames"):
            path, i = _child(path, "*"), i + 1
        elif token in ("items", "prefixItems", "additionalItems", "contains", "unevaluatedItems"):
            path = _child(path, "[]")
            i += 2 if i + 1 < len(tokens) and isinstance(tokens[i + 1], int) else 1
        elif token in _SKIP_NEXT:
            i += 2
        else:  # not, if, then, else, $ref: the same value
            i += 1
    return path


# -- values -------------------------------------------------------------------------------------------------------

_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))", re.ASCII
)


class _Unfit(Exception):
    """A value valid under the schema that its column type cannot hold exactly."""

    def __init__(self, path: str, t: DataType) -> None:
        super().__init__(path)
        self.path, self.type = path, t


def rfc3339_date(text: str) -> dt.date | None:
    """``text`` as an RFC 3339 ``full-date``, or None when it is not one (or not a year 1–9999 date)."""
    m = _DATE.fullmatch(text)
    if m is None:
        return None
    try:
        return dt.date(*(int(g) for g in m.groups()))
    except ValueError:
        return None


def rfc3339_syntax(text: str) -> bool:
    """Whether ``text`` is an RFC 3339 ``date-time`` (section 5.6, with its calendar and clock limits, leap second
    included; ``T`` and ``Z`` in either case)."""
    m = _DATE_TIME.fullmatch(text)
    if m is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and hour <= 23 and minute <= 59 and second <= 60):
        return False
    if m.group(9) is not None and (int(m.group(10)) > 23 or int(m.group(11)) > 59):
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    return 1 <= day <= days


def rfc3339_instant(text: str) -> dt.datetime | None:
    """``text`` (an RFC 3339 ``date-time``) as a UTC instant, or None when no microsecond timestamp holds it exactly:
    a leap second, digits past microseconds that are not zero, or an instant outside years 1–9999 in UTC."""
    m = _DATE_TIME.fullmatch(text)
    if m is None or not rfc3339_syntax(text):
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    fraction = m.group(7) or ""
    if second == 60 or fraction[6:].strip("0"):
        return None
    offset = dt.timedelta(0)
    if m.group(9) is not None:
        offset = dt.timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        offset = -offset if m.group(9) == "-" else offset
    try:
        local = dt.datetime(year, month, day, hour, minute, second, int(fraction[:6].ljust(6, "0")))
        return (local - offset).replace(tzinfo=dt.UTC)
    except (ValueError, OverflowError):
        return None


def _converter(t: DataType, path: str) -> Callable[[Any], Any]:
    """The function from a parsed JSON value at ``path`` to the value of Spark type ``t``, raising :class:`_Unfit`
    where it cannot hold it exactly."""
    from pyspark.sql import types as T

    def unfit() -> _Unfit:
        return _Unfit(path, t)

    if isinstance(t, T.StructType):
        fields = [(f.name, _converter(f.dataType, _child(path, f.name))) for f in t.fields]

        def struct(v: Any) -> Any:
            if not isinstance(v, dict):
                raise unfit()
            return {n: None if v.get(n) is None else c(v[n]) for n, c in fields}

        return struct
    if isinstance(t, T.MapType):
        value = _converter(t.valueType, _child(path, "*"))

        def mapping(v: Any) -> Any:
            if not isinstance(v, dict):
                raise unfit()
            return [(k, None if x is None else value(x)) for k, x in v.items()]

        return mapping
    if isinstance(t, T.ArrayType):
        item = _converter(t.elementType, _child(path, "[]"))

        def array(v: Any) -> Any:
            if not isinstance(v, list):
                raise unfit()
            return [None if x is None else item(x) for x in v]

        return array

    def scalar(v: Any) -> Any:
        out = _scalar(t, v)
        if out is None:
            raise unfit()
        return out

    return scalar


_LONG = (-(2**63), 2**63 - 1)


def _scalar(t: DataType, v: Any) -> Any:
    """``v`` as Spark scalar type ``t``, or None when it does not hold exactly."""
    from pyspark.sql import types as T

    if isinstance(v, bool):
        return v if isinstance(t, T.BooleanType) else None
    if isinstance(t, T.LongType):
        if isinstance(v, float) and v.is_integer():  # 7.0 is an integer from Draft 6 on
            v = int(v)
        return v if isinstance(v, int) and _LONG[0] <= v <= _LONG[1] else None
    if isinstance(t, T.DoubleType):
        if isinstance(v, float):
            return v
        if isinstance(v, int):
            try:
                as_double = float(v)
            except OverflowError:
                return None
            return as_double if not math.isinf(as_double) and int(as_double) == v else None
        return None
    if not isinstance(v, str):
        return None
    if isinstance(t, T.DateType):
        return rfc3339_date(v)
    if isinstance(t, T.TimestampType):
        return rfc3339_instant(v)
    return v if isinstance(t, T.StringType) else None


def _leaves(t: DataType, path: str) -> Iterator[tuple[str, DataType]]:
    """Every field path of ``t`` (as :func:`_converter` names them) with its type, the root first."""
    from pyspark.sql import types as T

    if path:
        yield path, t
    if isinstance(t, T.StructType):
        for f in t.fields:
            yield from _leaves(f.dataType, _child(path, f.name))
    elif isinstance(t, T.MapType):
        yield from _leaves(t.valueType, _child(path, "*"))
    elif isinstance(t, T.ArrayType):
        yield from _leaves(t.elementType, _child(path, "[]"))


_HOLDS = {
    "bigint": "a 64-bit integer", "double": "a double without rounding", "date": "a date of years 1-9999",
    "timestamp": "a UTC timestamp of years 1-9999 with microseconds at most (no leap second)",
}  # fmt: skip


def _unfit_reason(part: RecordPart, path: str, t: DataType) -> str:
    name = t.simpleString()
    what = _HOLDS.get(name, f"a {name}" if len(name) <= 40 else "its Spark type")
    return f"{_at(part, path)} is valid under {READER} but is not {what}, its column's type"


# -- one record ---------------------------------------------------------------------------------------------------


def _validator_class(doc: Any) -> type[Validator]:
    from jsonschema import validators

    default = validators.validator_for({"$schema": _DEFAULT_DRAFT})
    found: type[Validator] = validators.validator_for(doc if isinstance(doc, dict) else {}, default=default)
    return found


def format_checker() -> Any:
    """``jsonschema``'s format checker for the two formats Tidemark types (``date``, ``date-time``), asserted under
    every draft: a string the column cannot take as its date or time is not published as one."""
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    checker.checks("date")(lambda v: not isinstance(v, str) or rfc3339_date(v) is not None)
    checker.checks("date-time")(lambda v: not isinstance(v, str) or rfc3339_syntax(v))
    return checker


def _validator(doc: Any) -> Validator:
    return _validator_class(doc)(doc, format_checker=format_checker())


class RecordChecker:
    """One record's verdict and values, as the reference libraries give them: built once per worker."""

    def __init__(self, schemas: JsonSchemas) -> None:
        doc = schemas.document
        self.part = schemas.part
        self.reader_id = schemas.reader_id
        self.reader = _validator(doc)
        self.writers = {sid: _validator(json.loads(text)) for sid, text in schemas.writers if sid != schemas.reader_id}
        self.unresolved = dict(schemas.unresolved)
        self.unframed = schemas.unframed
        self.values = _converter(spark_type(doc), "")
        self.known = frozenset(schemas.reasons())
        self.not_text, self.not_json, _ = base_reasons(self.part)

    def rule_broken(self, error: ValidationError, whose: str) -> str:
        """The reason of ``error``, naming its field and rule; the schema's general reason when it has none of
        its own (a field below a recursive reference's last named level)."""
        path = _error_field(error.absolute_schema_path, error.validator)  # type: ignore[arg-type]
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = [n for n in error.validator_value if n not in error.instance]  # type: ignore[attr-defined]
            why = _required_reason(self.part, whose, path, str(missing[0])) if missing else ""
        elif error.validator in _MAYBE_FALSE and isinstance(error.instance, dict) and isinstance(error.schema, dict):
            # The property itself when a schema knows its name (a writer's field the reader forbids); the
            # object and what it allows otherwise: a reason may not carry a name only the data holds.
            extras = (_extra_reason(self.part, whose, path, str(n), str(error.validator))
                      for n in _extras(error.instance, error.schema))  # fmt: skip
            why = next((e for e in extras if e in self.known), "") or _rule_reason(
                self.part,
                whose,
                path,
                error.validator,
                error.schema,  # type: ignore[arg-type]
            )
        else:
            why = _rule_reason(self.part, whose, path, error.validator, error.schema)  # type: ignore[arg-type]
        return why if why in self.known else _invalid_reason(self.part, whose)

    def check(self, framed: bytes) -> dict[str, Any]:
        """The decoded record of a framed key or value: its values and :data:`REASON` None, or only the reason."""
        from jsonschema.exceptions import best_match

        # Only a re-drive's schemas have these: a run refuses unframed records and unknown writers before decoding.
        if self.unframed is not None and (len(framed) < HEADER_BYTES or framed[:1] != MAGIC):
            return {REASON: self.unframed}
        sid = int.from_bytes(framed[1:HEADER_BYTES], "big")
        if sid in self.unresolved:
            return {REASON: self.unresolved[sid]}
        try:
            doc = json.loads(framed[HEADER_BYTES:].decode("utf-8"))
        except UnicodeDecodeError:
            return {REASON: self.not_text}
        except (ValueError, RecursionError):
            return {REASON: self.not_json}
        for validator, whose in ((self.reader, READER), (self.writers.get(sid), _writer(sid))):
            if validator is None:
                continue
            try:
                # is_valid first: a third cheaper than collecting no errors (measured), and most records are good.
                error = None if validator.is_valid(doc) else best_match(validator.iter_errors(doc))
            except RecursionError:
                return {REASON: _invalid_reason(self.part, whose)}
            if error is not None:
                return {REASON: self.rule_broken(error, whose)}
        try:
            values = self.values(doc)
        except _Unfit as unfit:
            why = _unfit_reason(self.part, unfit.path, unfit.type)
            return {REASON: why if why in self.known else _invalid_reason(self.part, READER)}
        return {**values, REASON: None}


def _decoder(schemas: JsonSchemas, column: str, out_type: pa.DataType, source: str) -> Any:
    """The ``mapInArrow`` function: each batch with ``column`` added (``source`` decoded, its reason where not)."""

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        checker = RecordChecker(schemas)
        for batch in batches:
            decoded = []
            for row, v in enumerate(batch.column(source).to_pylist()):
                try:
                    decoded.append(None if v is None else checker.check(v))
                except Exception as exc:  # re-raised: a bug, whose record the run's error must name
                    raise SchemaError(
                        f"{_record_at(batch, row)}: checking its {schemas.part} against the JSON Schema failed "
                        f"({type(exc).__name__}: {exc}); nothing was published or committed"
                    ) from exc
            parsed = pa.array(decoded, type=out_type)
            yield pa.RecordBatch.from_arrays([*batch.columns, parsed], names=[*batch.schema.names, column])

    return decode


def _record_at(batch: pa.RecordBatch, row: int) -> str:
    """``topic[partition] offset n`` of ``batch``'s ``row``, as far as its columns tell."""
    names = batch.schema.names
    topic, partition, offset = (batch.column(c)[row].as_py() if c in names else "?" for c in ("topic", "partition",
                                                                                                "offset"))  # fmt: skip
    return f"{topic}[{partition}] offset {offset}"


def decoded_frame(df: DataFrame, schemas: JsonSchemas, column: str, source: str = "value") -> DataFrame:
    """``df`` with ``column``: each ``source`` decoded as the reader's struct plus :data:`REASON` (null where
    ``source`` is null)."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    struct = spark_type(schemas.document)
    assert isinstance(struct, T.StructType)
    with_reason = T.StructType([*struct.fields, T.StructField(REASON, T.StringType(), True)])
    out = T.StructType([*df.schema.fields, T.StructField(column, with_reason, True)])
    return df.mapInArrow(_decoder(schemas, column, to_arrow_type(with_reason, timezone="UTC"), source), out)


class _JsonSchema:
    """JSON Schema's :class:`~tidemark.spark.formats.RegistryFormat`: decoded in the Python workers
    (:func:`decoded_frame`), which give each bad record's reason itself."""

    name = "json_schema"

    def reasons(self, part: RecordPart, schemas: JsonSchemas | None) -> list[str]:
        return schemas.reasons() if schemas is not None else list(base_reasons(part))

    def decoding(self, work: DataFrame, schemas: JsonSchemas, column: str, parsed_name: str) -> PartDecoding:
        from pyspark.sql import functions as F

        present = F.col(column).isNotNull()
        work = decoded_frame(work, schemas, parsed_name, column)
        parsed = F.col(parsed_name)
        reasons = Reasons(F.when(present, parsed.getField(REASON)), len(schemas.reasons()))
        return PartDecoding(work, parsed, parsed.dropFields(REASON), [reasons])


FORMAT: RegistryFormat[JsonSchemas] = _JsonSchema()
