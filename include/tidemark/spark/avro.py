"""Avro keys and values in the Schema Registry wire format: whether a run's schemas resolve, and decoding.

The framing, the schema-id scan and the registry questions are :mod:`tidemark.spark.wire`'s.
Kafka is read once. Before the read, :func:`candidate_schemas` asks the registry, on the
driver, for the reader schema (the feed's pinned version of its subject, else the
subject's latest) and for the subject's latest versions that resolve to it with Avro's own
rules (``org.apache.avro.SchemaCompatibility`` in Spark's JVM: defaults for added fields,
promotions such as int → long): the job decodes with those. Once the records are staged,
:func:`settle` compares them with the schema ids the records carry. Any other id (an older
version, another subject's schema, one that does not resolve) or a record not in the wire
format goes through :func:`resolve_schemas`, which fails the run, before anything is
published, naming the topic, the partition, the first offset concerned and what to do (a
framing Tidemark does not read, a schema id the registry does not know, a writer schema the
reader cannot resolve), or finds every writer the records need, which the job then decodes
again. A value's reader is a record (its fields become columns); a key's may be any Avro
type (a record becomes a struct, a primitive a scalar).

The schemas then travel inside the decoding expression (``from_avro`` per writer id with
the reader schema as its ``avroSchema``), so executors never call the registry. Each body is
decoded whole (:data:`BODY_END`): one with bytes left over or missing is a bad record. Avro's
own compatibility check ignores logical types; :func:`_logical_incompatibility` refuses a
decimal some written value of which the reader cannot represent (a lower scale, or fewer digits
before the point) and a logical type read as another. A wider precision at the same scale reads
every value exactly (the unscaled bytes mean the same number); a higher scale too, because such a
writer is decoded at its own scale and cast to the reader's (:func:`rescaled_reader`). Spark's
``from_avro`` was chosen over fastavro in Python workers: it decodes 1.1-1.7M records/s
per core here against fastavro's 90-125k, and it maps Avro's logical types (decimal,
date, timestamp) and enums onto Spark types itself. It needs the ``spark-avro`` package
(:data:`tidemark.spark.session.AVRO_PACKAGE`) on the driver's and executors' class path.
Large plans of flat records skip it: their read tasks decode and stage them with polars and
pyarrow (:mod:`tidemark.spark.arrow_avro`), resolved by the same rules. :data:`FORMAT` is
how :mod:`tidemark.spark.decode` decodes Avro (:class:`~tidemark.spark.formats.RegistryFormat`):
a record fails on its body, on a ``timestamp-millis`` field whose microseconds overflow a
long (:func:`millis_fields`), or on a boolean, at any depth, whose byte is neither 0 nor 1
(:func:`boolean_fields`, :func:`bad_boolean`).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, RecordPart
from tidemark.errors import SchemaError, SchemaNotFoundError
from tidemark.kafka.registry import RegistryClient, SubjectVersion
from tidemark.planning.plan import Event
from tidemark.spark.formats import PartDecoding, RegistryFormat
from tidemark.spark.wire import (
    HEADER_BYTES,
    RegistrySchemas,
    SchemaUse,
    body,
    check_columns,
    header,
    option,
    reader_name,
    reader_version,
    refuse_unframed,
    schema_changed_events,
    version_of,
    where,
    writer_schemas,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# The subject's latest versions the job decodes with before it knows which ids the records carry (candidate_schemas).
CANDIDATE_VERSIONS = 10
# Whole-body decoding: from_avro reads a body's fields and ignores what is left after them, so every body is decoded
# with BODY_END appended, as a record of the writer schema's value and an 8-byte fixed field (WRAPPER). A body read
# exactly by its fields leaves BODY_END for the fixed; one with bytes left over puts them in it (BODY_END's eight
# bytes differ from each other, so no tail of it is also its start); one with bytes missing reads into BODY_END and
# then past the end, which from_avro's PERMISSIVE mode turns into nulls. The end also tells a record that did not
# decode from one whose fields are all null.
BODY_END = bytes([0xA7, 0x3C, 0x91, 0x0E, 0xD4, 0x6B, 0xF2, 0x58])
WRAPPER, VALUE_FIELD, END_FIELD = "_tidemark_body", "value", "end"


def wrapped(schema: str) -> str:
    """``schema`` (a writer's or the reader's) as the value of a :data:`WRAPPER` record followed by its end.

    The wrapper has no namespace, so a named type without one keeps its full name inside it.
    """
    return json.dumps({
        "type": "record", "name": WRAPPER,
        "fields": [{"name": VALUE_FIELD, "type": json.loads(schema)},
                   {"name": END_FIELD, "type": {"type": "fixed", "name": f"{WRAPPER}_end", "size": len(BODY_END)}}],
    })  # fmt: skip


@dataclass(frozen=True)
class AvroSchemas(RegistrySchemas):
    """What decoding a run's Avro keys or values needs: the reader schema and every writer schema seen."""

    reader: str = ""
    writers: Mapping[int, str] = field(default_factory=dict)
    # Writers the reader cannot resolve, set aside under ``schema_change: quarantine``: id -> why (their records are
    # bad records with that reason, never decoded).
    refused: Mapping[int, str] = field(default_factory=dict)

    @property
    def is_record(self) -> bool:
        doc = json.loads(self.reader)
        return isinstance(doc, dict) and doc.get("type") == "record"

    @property
    def field_names(self) -> list[str]:
        return [str(f["name"]) for f in json.loads(self.reader)["fields"]]


def resolve_schemas(
    spark: SparkSession, uses: list[SchemaUse], feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> AvroSchemas:
    """The reader schema of ``part`` and every writer schema of ``uses``; raises :class:`SchemaError` when one does
    not resolve."""
    refuse_unframed(uses, "the Avro body", part)
    reader = _reader(feed, client, part)
    writers, first_use = writer_schemas(uses, feed, client, lambda sid: client.typed_schema(sid)[:2], part)
    refused: dict[int, str] = {}
    for sid, writer in writers.items():
        problem = _incompatibility(spark, reader.schema, writer)
        if problem is not None and feed.schema_change == "quarantine":
            refused[sid] = f"{version_of(client, reader.subject, sid).strip(' ()') or 'another subject'}: {problem}"
            continue
        if problem is not None:
            use = first_use[sid]
            raise SchemaError(
                f"{where(use)}: {part}s written with schema id {sid}{version_of(client, reader.subject, sid)} cannot "
                f"be read with {reader_name(part)} id {reader.schema_id} (subject '{reader.subject}' version "
                f"{reader.version}): {problem}. Pin a "
                f"deserialization.{option(part, 'schema_version')} that resolves every writer, or make the change "
                "compatible (give an added field a default, widen rather than narrow a type); nothing was published or "
                "committed"
            )
    kept = {sid: w for sid, w in writers.items() if sid not in refused}
    found = _schemas(reader, kept, uses, part)
    events = tuple(_quarantined_events(uses, refused, reader, part))
    return replace(found, refused=refused, events=found.events + events) if refused else found


def _quarantined_events(
    uses: list[SchemaUse], refused: Mapping[int, str], reader: SubjectVersion, part: RecordPart
) -> list[dict[str, Any]]:
    """A ``schema_change_quarantined`` event per partition and writer the reader cannot resolve (``schema_change:
    quarantine``): its records are set aside as bad records."""
    return [
        Event(
            "schema_change_quarantined",
            f"{u.topic}[{u.partition}]: {u.records} {part}s written with schema id {u.schema_id} at offsets "
            f"{u.first_offset}..{u.last_offset} cannot be read with the reader (subject '{reader.subject}' version "
            f"{reader.version}): {refused[int(u.schema_id)]}; quarantined (schema_change: quarantine)",
            topic=u.topic, partition=u.partition,
            details={"schema_id": u.schema_id, "first_offset": u.first_offset, "last_offset": u.last_offset,
                     "records": u.records, "part": part, "subject": reader.subject, "reader_version": reader.version},
        ).to_dict()
        for u in uses
        if u.schema_id is not None and int(u.schema_id) in refused
    ]  # fmt: skip


def candidate_schemas(
    spark: SparkSession, feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> AvroSchemas:
    """What the run can decode ``part`` with before it has read a record: the reader schema, and as writers every
    one of the subject's latest :data:`CANDIDATE_VERSIONS` versions that resolves to it.

    Producers write with a version of the reader's subject, nearly always a recent one, so the
    job decodes with these while it reads Kafka the one time, and :func:`settle` then checks
    them against the schema ids the records carry. A writer that does not resolve is left out
    here: only records written with it would fail the run, and :func:`settle` finds them.
    """
    reader = _reader(feed, client, part)
    writers: dict[int, str] = {}
    for version in client.versions(reader.subject)[-CANDIDATE_VERSIONS:]:
        found = reader if version == reader.version else client.typed_version(reader.subject, version)
        if found.schema_type == "AVRO" and _incompatibility(spark, reader.schema, found.schema) is None:
            writers[found.schema_id] = found.schema
    writers.setdefault(reader.schema_id, reader.schema)
    return _schemas(reader, writers, [], part)


def settle(
    spark: SparkSession,
    candidates: AvroSchemas,
    uses: list[SchemaUse],
    feed: Feed,
    client: RegistryClient,
    *,
    part: RecordPart = "value",
) -> tuple[AvroSchemas, bool]:
    """The run's schemas once ``uses`` (who was written with which schema id) are known, and whether the records
    must be decoded again.

    When every record of ``part`` carries one of ``candidates``' writer ids: the candidates narrowed to the ids
    seen, with ``uses`` and their ``schema_changed`` events, and False. Otherwise (an id the candidates lack, or
    records not in the wire format): :func:`resolve_schemas` over ``uses``, which names the records that cannot
    be read and raises, or returns every writer they need, and True.
    """
    ids = {use.schema_id for use in uses}
    if None in ids or not ids <= set(candidates.writers):
        return resolve_schemas(spark, uses, feed, client, part=part), True
    writers = {int(sid): candidates.writers[int(sid)] for sid in ids if sid is not None}
    events = tuple(schema_changed_events(uses, candidates.reader_id, part))
    settled = replace(candidates, writer_ids=tuple(writers), writers=writers, seen=tuple(uses), events=events)
    return settled, False


def current_schemas(
    spark: SparkSession, ids: Iterable[int], feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> AvroSchemas:
    """What a re-drive decodes ``part`` of dead letters with: the feed's reader schema *now* (its pinned version of
    the subject, else the latest), and as writers those of ``ids`` (the schema ids the dead letters' raw bytes carry)
    that resolve to it.

    Unlike a run's (:func:`resolve_schemas`), nothing here fails: an id the registry does not know, of another schema
    type, or whose schema does not resolve to the reader is left out, so its records do not decode again and stay
    dead letters with that as their new reason (a re-drive is for records a fix now lets through, not a verdict on
    all of them).
    """
    reader = _reader(feed, client, part)
    writers: dict[int, str] = {}
    for sid in sorted(set(ids)):
        try:
            schema_type, schema, _ = client.typed_schema(sid)
        except SchemaNotFoundError:
            continue
        if schema_type == "AVRO" and _incompatibility(spark, reader.schema, schema) is None:
            writers[sid] = schema
    return _schemas(reader, writers, [], part)


def _schemas(reader: SubjectVersion, writers: dict[int, str], uses: list[SchemaUse], part: RecordPart) -> AvroSchemas:
    return AvroSchemas(
        format="avro", subject=reader.subject, version=reader.version, reader_id=reader.schema_id,
        writer_ids=tuple(writers), seen=tuple(uses), events=tuple(schema_changed_events(uses, reader.schema_id, part)),
        reader=reader.schema, writers=writers,
    )  # fmt: skip


def _reader(feed: Feed, client: RegistryClient, part: RecordPart) -> SubjectVersion:
    """The reader schema of ``part``; a value's must be a record whose fields may become columns."""
    reader = reader_version(feed, client, part=part)
    reader_doc = json.loads(reader.schema)
    if part == "value":
        if not isinstance(reader_doc, dict) or reader_doc.get("type") != "record":
            raise SchemaError(
                f"feed '{feed.name}': the reader schema (subject '{reader.subject}' version {reader.version}, id "
                f"{reader.schema_id}) is not an Avro record; Tidemark publishes a record's fields as columns"
            )
        check_columns(feed, reader, {str(f["name"]): None for f in reader_doc["fields"]})
    return reader


def _incompatibility(spark: SparkSession, reader: str, writer: str) -> str | None:
    """Why Avro cannot resolve ``writer`` to ``reader`` (the field and the rule), or None when it can.

    Avro's own check (``SchemaCompatibility``) looks at the underlying types only; the logical
    types on them are then compared by :func:`_logical_incompatibility` along the same path.
    """
    jvm = spark.sparkContext._jvm  # Avro ships with Spark: its own resolution rules, not a copy of them
    assert jvm is not None
    avro = jvm.org.apache.avro
    parsed_reader, parsed_writer = avro.Schema.Parser().parse(reader), avro.Schema.Parser().parse(writer)
    result = avro.SchemaCompatibility.checkReaderWriterCompatibility(parsed_reader, parsed_writer).getResult()
    if str(result.getCompatibility().toString()) == "COMPATIBLE":
        return _logical_incompatibility(parsed_reader, parsed_writer, str(parsed_reader.getName()), set())
    reasons = []
    for item in result.getIncompatibilities():
        location = str(item.getLocation())
        reasons.append(f"field {location!r}: {item.getType().toString()} ({item.getMessage()})")
    return "; ".join(reasons) or "incompatible"


# Writer type -> the reader types Avro promotes it to.
_PROMOTES = {"INT": {"LONG", "FLOAT", "DOUBLE"}, "LONG": {"FLOAT", "DOUBLE"}, "FLOAT": {"DOUBLE"},
             "STRING": {"BYTES"}, "BYTES": {"STRING"}}  # fmt: skip
_NAMED = {"RECORD", "ENUM", "FIXED"}


def _logical(schema: Any) -> str | None:
    """A (Java) schema's logical type as text: ``decimal(p,s)`` with its precision and scale, or its name."""
    logical = schema.getLogicalType()
    if logical is None:
        return None
    name = str(logical.getName())
    return f"decimal({logical.getPrecision()},{logical.getScale()})" if name == "decimal" else name


def _decimal_widened(reader: Any, writer: Any) -> bool:
    """Whether every value of the (Java) decimal schema ``writer`` is representable exactly as the decimal ``reader``:
    at least its scale (a value gains trailing zeros, never loses a digit) and at least its digits before the point
    (precision minus scale), so every written value fits. A scale change is read exactly only because decoding
    reads it at the writer's scale first (:func:`rescaled_reader`)."""
    mine, theirs = reader.getLogicalType(), writer.getLogicalType()
    if mine is None or theirs is None or str(mine.getName()) != "decimal" or str(theirs.getName()) != "decimal":
        return False
    if mine.getScale() == theirs.getScale():
        return bool(mine.getPrecision() >= theirs.getPrecision())
    integer_digits = mine.getPrecision() - mine.getScale() >= theirs.getPrecision() - theirs.getScale()
    return bool(mine.getScale() > theirs.getScale() and integer_digits)


def rescaled_reader(reader: str, writer: str) -> str | None:
    """``reader`` (schema JSON) with each decimal the ``writer`` holds at another scale at the same place given the
    writer's precision and scale, or None when no decimal's scale differs.

    Avro resolves a decimal by its unscaled bytes, so ``from_avro`` with the reader's scale would read 3.34 written at
    scale 2 as 0.0334 at scale 4; decoded with this schema the value keeps its own scale, and the decoded value is
    then cast to the reader's type (:func:`decoded_value`), exact where :func:`_decimal_widened` allowed the change.
    """
    named: dict[str, tuple[Any, str]] = {}
    _named_types(json.loads(writer), "", named)
    changed = [False]
    out = _rescale(json.loads(reader), json.loads(writer), named, changed)
    return json.dumps(out) if changed[0] else None


def _kind(avro_type: Any) -> str:
    """A type's kind for matching a reader's union branch with a writer's: a primitive's name, a named type's short
    name, else its ``type``."""
    if isinstance(avro_type, str):
        return avro_type.rpartition(".")[2]
    if isinstance(avro_type, dict):
        if avro_type.get("type") in ("record", "error", "enum", "fixed"):
            return str(avro_type["name"]).rpartition(".")[2]
        return _kind(avro_type.get("type"))
    return "union"


def _rescale(r: Any, w: Any, named: dict[str, tuple[Any, str]], changed: list[bool]) -> Any:
    """:func:`rescaled_reader` along one reader type ``r`` and the writer type ``w`` it resolves."""
    if isinstance(w, str) and w not in _PRIMITIVES:  # a writer's named type by reference: its definition
        found = next((d for n, (d, _) in named.items() if n == w or n.rpartition(".")[2] == w), None)
        w = found if found is not None else w
    if isinstance(r, list) or isinstance(w, list):
        readers, writers = (r if isinstance(r, list) else [r]), (w if isinstance(w, list) else [w])
        out = []
        for branch in readers:
            match = next((b for b in writers if _kind(b) == _kind(branch)), None)
            out.append(branch if match is None else _rescale(branch, match, named, changed))
        return out if isinstance(r, list) else out[0]
    if not isinstance(r, dict) or not isinstance(w, dict):
        return r
    if (
        r.get("logicalType") == "decimal"
        and w.get("logicalType") == "decimal"
        and r.get("scale", 0) != w.get("scale", 0)
    ):
        changed[0] = True
        return {**r, "precision": w["precision"], "scale": w.get("scale", 0)}
    kind = r.get("type")
    if kind in ("record", "error") and w.get("type") in ("record", "error"):
        theirs = {f["name"]: f for f in w["fields"]}
        fields = []
        for f in r["fields"]:
            other = theirs.get(f["name"]) or next((theirs[a] for a in f.get("aliases", []) if a in theirs), None)
            fields.append(f if other is None else {**f, "type": _rescale(f["type"], other["type"], named, changed)})
        return {**r, "fields": fields}
    inner = {"array": "items", "map": "values"}.get(str(kind))
    if inner is not None and w.get("type") == kind:
        return {**r, inner: _rescale(r[inner], w[inner], named, changed)}
    if isinstance(kind, (dict, list)):  # {"type": {...}}: the type itself
        return {**r, "type": _rescale(kind, w.get("type"), named, changed)}
    return r


def _branch(reader: Any, writer: Any) -> Any | None:
    """The reader union's branch a writer value of (Java) schema ``writer`` resolves to, as Avro picks it: the
    first of the same type (and name), else the first it promotes to."""
    kind = str(writer.getType().toString())
    branches = list(reader.getTypes())
    for b in branches:
        if str(b.getType().toString()) == kind and (kind not in _NAMED or b.getFullName() == writer.getFullName()):
            return b
    for b in branches:
        if str(b.getType().toString()) in _PROMOTES.get(kind, set()):
            return b
    return None


def _logical_incompatibility(reader: Any, writer: Any, path: str, seen: set[tuple[str, str]]) -> str | None:
    """The first place, along the path Avro resolves ``writer`` to ``reader`` (Java schemas Avro already found
    compatible), where a value would be read with another meaning: a decimal at another precision or scale (Avro
    resolves decimals only at equal ones: 3.34 written at scale 2 reads as 0.0334 at scale 4), a decimal read as
    plain bytes or the other way, or two different logical types (a date read as a timestamp, millis as micros).
    A logical type on one side only (a long read as ``timestamp-millis``) keeps the number as written."""
    r_kind, w_kind = str(reader.getType().toString()), str(writer.getType().toString())
    if w_kind == "UNION":
        for w in writer.getTypes():
            problem = _logical_incompatibility(reader, w, path, seen)
            if problem is not None:
                return problem
        return None
    if r_kind == "UNION":
        branch = _branch(reader, writer)
        return None if branch is None else _logical_incompatibility(branch, writer, path, seen)
    mine, theirs = _logical(reader), _logical(writer)
    decimal = any(t is not None and t.startswith("decimal") for t in (mine, theirs))
    if (
        mine != theirs
        and not _decimal_widened(reader, writer)
        and (decimal or (mine is not None and theirs is not None))
    ):
        return (
            f"field {path!r}: written as {theirs or w_kind.lower()}, read as {mine or r_kind.lower()}; Avro resolves "
            "a logical type only to itself (a decimal only where every written value is representable: at least its "
            "scale and its digits before the point), so a value would be read with another meaning or not fit"
        )
    if r_kind == "RECORD" and w_kind == "RECORD":
        pair = (str(reader.getFullName()), str(writer.getFullName()))
        if pair in seen:  # a recursive type: this pair is being checked further up
            return None
        seen = seen | {pair}
        for f in reader.getFields():
            w = writer.getField(f.name())
            if w is None:
                w = next((writer.getField(a) for a in f.aliases() if writer.getField(a) is not None), None)
            if w is not None:
                problem = _logical_incompatibility(f.schema(), w.schema(), f"{path}.{f.name()}", seen)
                if problem is not None:
                    return problem
        return None
    if r_kind == "ARRAY" and w_kind == "ARRAY":
        return _logical_incompatibility(reader.getElementType(), writer.getElementType(), f"{path}[]", seen)
    if r_kind == "MAP" and w_kind == "MAP":
        return _logical_incompatibility(reader.getValueType(), writer.getValueType(), f"{path}{{}}", seen)
    return None


def decoded_value(schemas: AvroSchemas, column: str = "value") -> Column:
    """``column``'s whole body decoded with its writer schema and resolved to the reader's: a :data:`WRAPPER` struct,
    the decoded value in :data:`VALUE_FIELD` and, in :data:`END_FIELD`, :data:`BODY_END` only where the body was
    read to its last byte and no further (see :func:`decode_failed`, :func:`bytes_left_over`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    framing = F.substring(F.col(column), 1, HEADER_BYTES)
    options = {"avroSchema": wrapped(schemas.reader), "mode": "PERMISSIVE"}
    ended = F.concat(body(column), F.lit(BODY_END))
    out: Column | None = None
    # Nulls only (no writer seen): decode with the reader itself, so the column still has the reader's type.
    writers = schemas.writers or {schemas.reader_id: schemas.reader}
    reader_type: Any = None
    for writer_id, writer in sorted(writers.items()):
        rescaled = rescaled_reader(schemas.reader, writer)
        if rescaled is None:
            decoded = from_avro(ended, wrapped(writer), options)
        else:  # decimals at the writer's scale, then cast to the reader's: the same numbers (_decimal_widened)
            reader_type = reader_type if reader_type is not None else _spark_type(wrapped(schemas.reader))
            decoded = from_avro(ended, wrapped(writer), {**options, "avroSchema": wrapped(rescaled)}).cast(reader_type)
        # The five header bytes compared as bytes: no hex text and number parsing per record and writer.
        framed = framing == F.lit(header(writer_id))
        out = F.when(framed, decoded) if out is None else out.when(framed, decoded)
    assert out is not None
    return out


def _spark_type(schema: str) -> Any:
    """The Spark type ``from_avro`` decodes Avro ``schema`` (JSON) into in PERMISSIVE mode (every field nullable)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    spark = SparkSession.active()
    decoded = from_avro(F.lit(None).cast("binary"), schema, {"mode": "PERMISSIVE"})  # nullable, as decoded_value's
    return spark.range(0).select(decoded.alias("v")).schema["v"].dataType


def decode_failed(decoded: Column, schemas: AvroSchemas) -> Column:
    """Whether the result of :func:`decoded_value` did not decode (null inputs and bodies cut short included); a
    value that is not a record and decodes to null counts as failed too (a key's union with null)."""
    failed = decoded.getField(END_FIELD).isNull()
    return failed if schemas.is_record else failed | decoded.getField(VALUE_FIELD).isNull()


def not_text(decoded: Column, schemas: AvroSchemas) -> Column:
    """Whether the result of :func:`decoded_value` holds, at any depth (record fields, array items, map keys and
    values, a union with null), a reader ``string`` whose bytes are not UTF-8: a producer's bug, or ``bytes`` read as
    ``string`` (Avro's promotion). ``from_avro`` gives such bytes as a string unchecked, where the reference decoders
    refuse the body; the record is a bad record."""
    from pyspark.sql import functions as F

    named: dict[str, Any] = {}  # named types by full and short name, for references to them

    def either(checks: list[Column | None]) -> Column | None:
        found = [F.coalesce(c, F.lit(False)) for c in checks if c is not None]
        return functools.reduce(operator.or_, found) if found else None

    def below(col: Column, avro_type: Any, namespace: str) -> Column | None:
        if isinstance(avro_type, list):
            branches = [t for t in avro_type if t != "null"]
            # A union of several types is a struct of members in Spark: its strings are not looked into.
            return below(col, branches[0], namespace) if len(branches) == 1 else None
        if isinstance(avro_type, str):
            if avro_type == "string":
                return ~F.is_valid_utf8(col)
            known = named.get(f"{namespace}.{avro_type}") or named.get(avro_type)
            return below(col, known, namespace) if isinstance(known, dict) and known.get("type") == "record" else None
        kind = avro_type.get("type")
        if kind in ("record", "enum", "fixed"):
            space, _, short = avro_type["name"].rpartition(".")
            namespace = space or avro_type.get("namespace", namespace)
            named[f"{namespace}.{short}"] = named[short] = avro_type
        if kind == "record":
            return either([below(col.getField(f["name"]), f["type"], namespace) for f in avro_type["fields"]])
        if kind == "array":
            items = avro_type["items"]
            if below(F.lit(None), items, namespace) is None:
                return None
            return F.exists(col, lambda x: F.coalesce(below(x, items, namespace), F.lit(False)))
        if kind == "map":
            values = avro_type["values"]
            checks = [F.exists(F.map_keys(col), lambda k: ~F.is_valid_utf8(k))]
            if below(F.lit(None), values, namespace) is not None:
                checks.append(
                    F.exists(F.map_values(col), lambda v: F.coalesce(below(v, values, namespace), F.lit(False)))
                )
            return either(checks)
        return below(col, kind, namespace) if kind == "string" else None

    found = below(decoded.getField(VALUE_FIELD), json.loads(schemas.reader), "")
    return F.lit(False) if found is None else F.coalesce(found, F.lit(False))


# The largest timestamp-millis whose microseconds a long holds: Spark's decoder refuses a larger one (and the read
# tasks give way on it), so such a record is a bad record; :func:`millis_overflow` names its field.
MICROS_LIMIT = (2**63 - 1) // 1000


def _is_millis(avro_type: Any) -> bool:
    """Whether a field's type is ``timestamp-millis``, alone or in a union."""
    if isinstance(avro_type, list):
        return any(_is_millis(t) for t in avro_type)
    return isinstance(avro_type, dict) and avro_type.get("logicalType") == "timestamp-millis"


def millis_fields(schemas: AvroSchemas) -> list[str]:
    """The top-level ``timestamp-millis`` fields of the run's record writers, by name, in writer id order."""
    names: list[str] = []
    for _, writer in sorted(schemas.writers.items()):
        doc = json.loads(writer)
        if isinstance(doc, dict) and doc.get("type") == "record":
            names += [str(f["name"]) for f in doc["fields"] if _is_millis(f["type"]) and f["name"] not in names]
    return names


def _as_numbers(avro_type: Any) -> Any:
    """``avro_type`` with ``timestamp-millis`` read as the long it is."""
    if isinstance(avro_type, list):
        return [_as_numbers(t) for t in avro_type]
    return "long" if _is_millis(avro_type) else avro_type


def millis_overflow(schemas: AvroSchemas, column: str = "value") -> Column:
    """The first top-level ``timestamp-millis`` field (:func:`millis_fields`) of ``column``'s record whose
    microseconds overflow a long, else null. Decoded again with those fields as plain longs: meant for records that
    did not decode (Spark evaluates it only where asked)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    framing = F.substring(F.col(column), 1, HEADER_BYTES)
    out: Column | None = None
    for writer_id, writer in sorted(schemas.writers.items()):
        doc = json.loads(writer)
        if not (isinstance(doc, dict) and doc.get("type") == "record"):
            continue
        names = [str(f["name"]) for f in doc["fields"] if _is_millis(f["type"])]
        if not names:
            continue
        numbers = {**doc, "fields": [{**f, "type": _as_numbers(f["type"])} for f in doc["fields"]]}
        decoded = from_avro(body(column), json.dumps(numbers), {"mode": "PERMISSIVE"})
        limit = F.lit(MICROS_LIMIT).cast("long")
        first = F.coalesce(*[
            F.when((decoded.getField(n) > limit) | (decoded.getField(n) < -limit), F.lit(n)) for n in names
        ])  # fmt: skip
        framed = framing == F.lit(header(writer_id))
        out = F.when(framed, first) if out is None else out.when(framed, first)
    return out if out is not None else F.lit(None).cast("string")


# Booleans as the spec says them: one byte, 0 or 1. Java's reader (from_avro) reads any byte but 1 as false, and the
# body still reads to its last byte, so nothing else tells such a body from a good one; fastavro reads any byte but 0
# as true. Such a body is a bad record, its reason naming the field (:func:`boolean_fields`). :func:`bad_boolean`
# decodes the body a second time with the writer schema, each boolean declared a fixed of one byte (the same
# encoding: one byte), and compares those bytes with 0 and 1; its reader keeps only the top-level fields that hold a
# boolean, the others being skipped over (no Spark value built for them).
BOOLEAN_BYTE = "_tidemark.boolean_byte_"  # the fixed types' full names, numbered: a namespace no schema of a feed uses


# One step from a decoded column to a boolean below it: a record's field, a union's member (a union of several types is
# a struct of members in Spark, one per branch but null), an array's items, a map's values.
Step = tuple[str, str]


def _is_boolean(avro_type: Any) -> bool:
    return avro_type == "boolean" or (isinstance(avro_type, dict) and avro_type.get("type") == "boolean")


def _full_name(avro_type: Mapping[str, Any], namespace: str) -> tuple[str, str]:
    """A named type's full name and the namespace its own named types inherit (Avro's rules)."""
    name = str(avro_type["name"])
    if "." in name:
        return name, name.rpartition(".")[0]
    space = str(avro_type.get("namespace", namespace) or "")
    return (f"{space}.{name}" if space else name), space


def _named_types(avro_type: Any, namespace: str, named: dict[str, tuple[Any, str]]) -> None:
    """Every named type defined in ``avro_type``, into ``named``: full name → (definition, its namespace)."""
    if isinstance(avro_type, list):
        for branch in avro_type:
            _named_types(branch, namespace, named)
        return
    if not isinstance(avro_type, dict):
        return
    kind = avro_type.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        full, namespace = _full_name(avro_type, namespace)
        named[full] = (avro_type, namespace)
    for f in avro_type.get("fields", []) if kind in ("record", "error") else []:
        _named_types(f["type"], namespace, named)
    inner = {"array": "items", "map": "values"}.get(str(kind))
    if inner is not None:
        _named_types(avro_type[inner], namespace, named)


def _boolean_paths(
    avro_type: Any, namespace: str, path: str, named: dict[str, tuple[Any, str]], expanding: frozenset[str]
) -> list[tuple[str, tuple[Step, ...]]]:
    """Each boolean under ``avro_type``, at any depth: its path (``a.b``; ``a[]``, an array's items; ``a{}``, a
    map's values) and the steps to it from the value decoded there. A recursive type is followed once (Spark's
    ``from_avro`` reads none)."""
    if _is_boolean(avro_type):
        return [(path, ())]
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        if len(branches) == 1:  # a union with null is the value itself, nullable
            return _boolean_paths(branches[0], namespace, path, named, expanding)
        return [
            (at, (("member", f"member{i}"), *steps))
            for i, branch in enumerate(branches)
            for at, steps in _boolean_paths(branch, namespace, path, named, expanding)
        ]
    if isinstance(avro_type, str):  # a named type's reference (a primitive other than boolean holds none)
        full = next((n for n in (f"{namespace}.{avro_type}", avro_type) if n in named), None)
        if full is None or full in expanding:
            return []
        definition, space = named[full]
        return _boolean_paths(definition, space, path, named, expanding)
    if not isinstance(avro_type, dict):
        return []
    kind = avro_type.get("type")
    if kind in ("record", "error"):
        full, namespace = _full_name(avro_type, namespace)
        return [
            (at, (("field", str(f["name"])), *steps))
            for f in avro_type["fields"]
            for at, steps in _boolean_paths(
                f["type"], namespace, f"{path}.{f['name']}" if path else str(f["name"]), named, expanding | {full}
            )
        ]
    if kind in ("array", "map"):
        inner, mark = ("items", "[]") if kind == "array" else ("values", "{}")
        found = _boolean_paths(avro_type[inner], namespace, path + mark, named, expanding)
        return [(at, ((inner, ""), *steps)) for at, steps in found]
    return []


def _booleans_as_bytes(avro_type: Any, count: list[int]) -> Any:
    """``avro_type`` with each boolean a fixed of one byte (named :data:`BOOLEAN_BYTE` and a number) and its fields
    without defaults, aliases or docs (a boolean's default is no fixed's, and a writer needs none)."""
    if _is_boolean(avro_type):
        count[0] += 1
        return {"type": "fixed", "name": f"{BOOLEAN_BYTE}{count[0]}", "size": 1}
    if isinstance(avro_type, list):
        return [_booleans_as_bytes(b, count) for b in avro_type]
    if not isinstance(avro_type, dict):
        return avro_type
    kind = avro_type.get("type")
    if kind in ("record", "error"):
        fields = [{"name": f["name"], "type": _booleans_as_bytes(f["type"], count)} for f in avro_type["fields"]]
        return {**avro_type, "fields": fields}
    if kind in ("array", "map"):
        inner = "items" if kind == "array" else "values"
        return {**avro_type, inner: _booleans_as_bytes(avro_type[inner], count)}
    return avro_type


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def _short_names(avro_type: Any, *, defined: bool) -> set[str]:
    """The short names of the named types ``avro_type`` defines (``defined``) or refers to by name, at any depth."""
    if isinstance(avro_type, list):
        return set().union(*(_short_names(b, defined=defined) for b in avro_type))
    if isinstance(avro_type, str):
        return set() if defined or avro_type in _PRIMITIVES else {avro_type.rpartition(".")[2]}
    if not isinstance(avro_type, dict):
        return set()
    kind = avro_type.get("type")
    found = (
        {str(avro_type["name"]).rpartition(".")[2]}
        if defined and kind in ("record", "error", "enum", "fixed")
        else set()
    )
    inner = [f["type"] for f in avro_type.get("fields", [])] + [
        avro_type[k] for k in ("items", "values") if k in avro_type
    ]
    if isinstance(kind, (str, list, dict)) and kind not in ("record", "error", "enum", "fixed", "array", "map"):
        inner.append(kind)
    return found.union(*(_short_names(t, defined=defined) for t in inner))


@dataclass(frozen=True)
class _BooleanCheck:
    """How :func:`bad_boolean` checks one writer's booleans: the schemas it decodes with, each boolean's path."""

    writer: str  # the writer schema, each boolean a fixed of one byte
    reader: str  # the same, without the top-level fields that hold no boolean (nor define a type those refer to)
    paths: tuple[tuple[str, tuple[tuple[Step, ...], ...]], ...]  # per path, the steps to each boolean there


@functools.lru_cache(maxsize=256)
def _boolean_check(writer: str) -> _BooleanCheck | None:
    """The check of ``writer``'s booleans (schema JSON), None when it has none."""
    doc = json.loads(writer)
    named: dict[str, tuple[Any, str]] = {}
    _named_types(doc, "", named)
    found = _boolean_paths(doc, "", "", named, frozenset())
    if not found:
        return None
    as_bytes = _booleans_as_bytes(doc, [0])
    reader = as_bytes
    if isinstance(doc, dict) and doc.get("type") in ("record", "error"):
        keep = {steps[0][1] for _, steps in found}
        while True:  # and every field defining a named type a kept field refers to (an over-estimate by short name)
            wanted = set().union(*(_short_names(f["type"], defined=False) for f in doc["fields"] if f["name"] in keep))
            more = {f["name"] for f in doc["fields"] if _short_names(f["type"], defined=True) & wanted} - keep
            if not more:
                break
            keep |= more
        reader = {**as_bytes, "fields": [f for f in as_bytes["fields"] if f["name"] in keep]}
    paths: dict[str, list[tuple[Step, ...]]] = {}
    for path, steps in found:  # one path may be reached twice (two branches of a union)
        paths.setdefault(path, []).append(steps)
    return _BooleanCheck(json.dumps(as_bytes), json.dumps(reader), tuple((p, tuple(s)) for p, s in paths.items()))


def _not_0_or_1(column: Column, steps: tuple[Step, ...]) -> Column:
    """Whether a boolean at ``steps`` below ``column`` (decoded by :func:`bad_boolean`) is a byte neither 0 nor 1."""
    from pyspark.sql import functions as F

    if not steps:
        return (column != F.lit(b"\x00")) & (column != F.lit(b"\x01"))
    (kind, name), rest = steps[0], steps[1:]
    if kind == "items":
        return F.exists(column, lambda x: _not_0_or_1(x, rest))
    if kind == "values":
        return F.exists(F.map_values(column), lambda v: _not_0_or_1(v, rest))
    return _not_0_or_1(column.getField(name), rest)


def boolean_fields(schemas: AvroSchemas) -> list[str]:
    """The paths of the booleans of the run's writers (``b``, ``lines[].shipped``, ``tags{}``; ``''`` for a part
    that is itself a boolean), in writer id order: each a reason of its own (:func:`bad_boolean`)."""
    paths: list[str] = []
    for _, writer in sorted(schemas.writers.items()):
        check = _boolean_check(writer)
        paths += [p for p, _ in (check.paths if check else ()) if p not in paths]
    return paths


def _nullable(avro_type: Any) -> list[Any]:
    """``avro_type`` as the one type it is: itself, or the branch of a union with null (else no type)."""
    if not isinstance(avro_type, list):
        return [avro_type]
    branches = [t for t in avro_type if t != "null"]
    return branches if len(branches) == 1 else []


def _reader_booleans(schemas: AvroSchemas) -> set[str]:
    """The top-level fields of the reader record that are booleans (alone or in a union with null)."""
    doc = json.loads(schemas.reader)
    if not (isinstance(doc, dict) and doc.get("type") == "record"):
        return set()
    return {str(f["name"]) for f in doc["fields"] if any(_is_boolean(t) for t in _nullable(f["type"]))}


def bad_boolean(schemas: AvroSchemas, column: str = "value", decoded: Column | None = None) -> Column:
    """The path (:func:`boolean_fields`) of the first boolean of ``column``'s body whose byte is neither 0 nor 1, at
    any depth, else null (and null where the body does not decode).

    With ``decoded``, the value :func:`decoded_value` gave (its :data:`VALUE_FIELD`), a writer
    whose booleans are all top-level fields the reader reads as booleans is decoded again only
    where one of them was read as false: Java's reader reads any byte but 1 as false, so a
    record whose booleans all read true holds no other byte, and half the second decodes of
    such a feed are saved.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    framing = F.substring(F.col(column), 1, HEADER_BYTES)
    readable = _reader_booleans(schemas) if decoded is not None else set()
    out: Column | None = None
    for writer_id, writer in sorted(schemas.writers.items()):
        check = _boolean_check(writer)
        if check is None:
            continue
        options = {"mode": "PERMISSIVE"} | ({"avroSchema": check.reader} if check.reader != check.writer else {})
        again = from_avro(body(column), check.writer, options)
        first = F.coalesce(*[
            F.when(functools.reduce(operator.or_, [_not_0_or_1(again, s) for s in steps]), F.lit(path))
            for path, steps in check.paths
        ])  # fmt: skip
        if decoded is not None and all(p in readable and s == ((("field", p),),) for p, s in check.paths):
            read_false = functools.reduce(operator.or_, [decoded.getField(p) == F.lit(False) for p, _ in check.paths])
            first = F.when(read_false, first)
        framed = framing == F.lit(header(writer_id))
        out = F.when(framed, first) if out is None else out.when(framed, first)
    return out if out is not None else F.lit(None).cast("string")


def boolean_reason(part: RecordPart, path: str) -> str:
    """The reason of a ``part`` whose boolean at ``path`` (``''``: the part itself) is a byte other than 0 or 1."""
    where = f"{part} field '{path}'" if path else part
    return f"{where} holds a boolean byte other than 0 or 1 (Avro's booleans are the byte 0 or 1 only)"


def refused_reason(part: RecordPart, schema_id: int, why: str) -> str:
    """The reason of a ``part`` written with a writer the reader cannot resolve, set aside (``schema_change:
    quarantine``)."""
    return (
        f"{part} written with schema id {schema_id} ({why}), which the reader cannot resolve "
        "(schema_change: quarantine)"
    )


def bytes_left_over(decoded: Column) -> Column:
    """Whether the body behind the result of :func:`decoded_value` decoded with bytes left after its fields."""
    end = decoded.getField(END_FIELD)
    return end.isNotNull() & (end != BODY_END)


class _Avro:
    """Avro's :class:`~tidemark.spark.formats.RegistryFormat`: decoded by Spark's ``from_avro`` per writer id, a
    record failing on its body (not read to its last byte and no further), on a ``timestamp-millis`` field whose
    microseconds overflow a long, or on a boolean byte other than 0 or 1."""

    name = "avro"

    def reasons(self, part: RecordPart, schemas: AvroSchemas | None) -> list[str]:
        return (
            [
                f"{part} does not decode against its Avro writer schema",
                f"{part} has bytes left over after the fields of its Avro writer schema",
            ]
            + [
                f"{part} field '{name}' is a timestamp-millis whose microseconds overflow a long (epoch nanoseconds or "
                "microseconds in a millis field?)"
                for name in (millis_fields(schemas) if schemas is not None else [])
            ]
            + [boolean_reason(part, path) for path in (boolean_fields(schemas) if schemas is not None else [])]
            + [refused_reason(part, sid, why) for sid, why in sorted((schemas.refused if schemas else {}).items())]
        )

    def decoding(self, work: DataFrame, schemas: AvroSchemas, column: str, parsed_name: str) -> PartDecoding:
        from pyspark.sql import functions as F

        framing = F.substring(F.col(column), 1, HEADER_BYTES)
        set_aside = [F.col(column).isNotNull() & (framing == F.lit(header(sid))) for sid in sorted(schemas.refused)]
        # A refused writer's records fail on its reason alone (schema_change: quarantine), not on decoding.
        present = F.col(column).isNotNull() & ~functools.reduce(operator.or_, set_aside, F.lit(False))
        work = work.withColumn(parsed_name, decoded_value(schemas, column))
        whole = F.col(parsed_name)
        failed = present & (decode_failed(whole, schemas) | not_text(whole, schemas))
        names = millis_fields(schemas)
        overflow_name = f"{parsed_name}_millis_overflow"
        if names:  # which field a record failed on, asked only of records that failed
            work = work.withColumn(overflow_name, F.when(failed, millis_overflow(schemas, column)))
        overflow = F.col(overflow_name)
        overflowed = [failed & (overflow == F.lit(name)) for name in names]
        undecoded = failed & overflow.isNull() if names else failed
        left_over = present & ~failed & bytes_left_over(whole)
        paths = boolean_fields(schemas)
        boolean_name = f"{parsed_name}_bad_boolean"
        if paths:  # asked of every record that decoded: nothing else tells such a body from a good one
            check = bad_boolean(schemas, column, whole.getField(VALUE_FIELD))
            work = work.withColumn(boolean_name, F.when(present & ~failed, check))
        bad_byte = [F.col(boolean_name) == F.lit(path) for path in paths]
        parsed = whole.getField(VALUE_FIELD)
        return PartDecoding(work, parsed, parsed, [undecoded, left_over, *overflowed, *bad_byte, *set_aside])


FORMAT: RegistryFormat[AvroSchemas] = _Avro()
