"""Protobuf keys and values in the Schema Registry wire format, decoded in Python inside the read, typed.

A key or value is magic byte ``0``, a 4-byte schema id, the message indexes (zigzag varints: a
count, then the path from the file's top-level messages to the record's message; a
single ``0`` byte for the first message), then the Protobuf body. On the driver and once
per run, :func:`resolve_schemas` fetches the reader schema (the feed's pinned version of
its subject, else the latest) and every writer schema seen, each as the registry's
serialized ``FileDescriptorProto`` with its references, so no ``protoc`` is needed: the
message class is built at run time from the descriptors. The reader's message is the
first message of the reader's file (the one a serializer's index ``[0]`` names). A
re-drive's :func:`current_schemas` fetches the same for the writer ids its dead letters
carry, but a writer that does not resolve (unknown, another type, a field number retyped)
fails only its own records, with a reason naming its id.

Every record is parsed with the reader's message class: reading a writer's bytes with
the reader's class is Protobuf's own resolution rule (fields match by number; fields the
reader lacks are skipped, fields the writer lacks take their defaults). A record whose
message indexes name another message of its writer file, or whose body does not parse,
is a bad record. ``spark-protobuf`` is not published for Spark 4, so decoding runs in
the Python workers over Arrow batches (``mapInArrow``), carrying the descriptors in the
function, so executors never call the registry.

Types (:func:`spark_type`): messages → struct, ``repeated`` → array, ``map<>`` → map,
enums → the value's name (its number as text when the reader does not know it),
``google.protobuf.Timestamp`` → timestamp, int32 kinds → int, int64 kinds and uint32 →
long, uint64 → decimal(20, 0), float, double, bool, string, bytes. Scalars without
presence read their default when unset (as ``ProtobufDeserializer`` gives them); unset
messages and ``optional`` scalars are null. A ``Timestamp`` outside years 1-9999, which
Spark's timestamps cannot hold, makes a bad record naming its field (:func:`timestamp_paths`).
:data:`FORMAT` is how :mod:`tidemark.spark.decode` decodes Protobuf
(:class:`~tidemark.spark.formats.RegistryFormat`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import importlib
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import reduce
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, RecordPart
from tidemark.errors import ReadError, SchemaError
from tidemark.kafka.registry import RegistryClient, SchemaReference, SubjectVersion
from tidemark.spark.formats import PartDecoding, RegistryFormat
from tidemark.spark.wire import (
    HEADER_BYTES,
    RegistrySchemas,
    SchemaUse,
    check_columns,
    current_writers,
    header,
    option,
    reader_name,
    reader_version,
    refuse_unframed,
    schema_changed_events,
    unresolved_reason,
    version_of,
    where,
    writer_schemas,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from google.protobuf.descriptor import Descriptor, FieldDescriptor
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

# The protobuf runtime and Spark are imported inside the functions that use them: decoding (tidemark.spark.decode)
# loads this module for every feed, and only a Protobuf feed's run builds descriptors.

# Imports the serializers never register (confluent-kafka resolves them from the protobuf package itself).
BUILTIN_PREFIXES = ("google/protobuf/",)
TIMESTAMP = "google.protobuf.Timestamp"
WELL_KNOWN_PREFIX = "google.protobuf."  # the well-known types' package


@dataclass(frozen=True)
class ProtobufSchemas(RegistrySchemas):
    files: tuple[bytes, ...] = ()  # serialized FileDescriptorProtos, each after its imports; the reader's last
    message: str = ""  # the reader message's full name
    # Per writer id: each message index path of its file → that message's full name.
    index_names: Mapping[int, Mapping[tuple[int, ...], str]] = field(default_factory=dict)
    # A re-drive's writer ids that do not resolve, each with the reason its records fail (current_schemas).
    unresolved: tuple[tuple[int, str], ...] = ()

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.descriptor().fields]

    def report(self) -> dict[str, Any]:
        """The report's ``schemas``, the reader's message named too (a file may declare several)."""
        out = super().report()
        out["reader"]["message"] = self.message
        return out

    def descriptor(self) -> Descriptor:
        from google.protobuf import descriptor_pb2, descriptor_pool

        pool = descriptor_pool.DescriptorPool()
        for raw in self.files:
            pool.Add(descriptor_pb2.FileDescriptorProto.FromString(raw))
        return pool.FindMessageTypeByName(self.message)


def _file_proto(text: str, what: str) -> Any:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        raise SchemaError(
            f"{what} did not come back as a serialized FileDescriptorProto (asked with format=serialized); Tidemark "
            "reads Protobuf schemas only so (Confluent's registry and Apicurio answer so)"
        ) from None


def _builtin(name: str) -> bytes:
    """A well-known type's file (``google/protobuf/timestamp.proto``) from the protobuf package."""
    from google.protobuf import descriptor_pb2

    module = importlib.import_module(
        "google.protobuf." + name.removeprefix("google/protobuf/").replace(".proto", "_pb2")
    )
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return bytes(proto.SerializeToString())


def _file_set(client: RegistryClient, text: str, refs: tuple[SchemaReference, ...], what: str) -> list[bytes]:
    """The file of ``text`` after every file it imports (its references, fetched, and well-known types)."""
    done: dict[str, bytes] = {}
    importing: list[str] = []  # the files whose imports are being added, outermost first

    def add(proto: Any, refs: tuple[SchemaReference, ...], what: str) -> None:
        by_name = {r.name: r for r in refs}
        importing.append(proto.name)
        for dep in proto.dependency:
            if dep in done:
                continue
            if dep in importing:  # fetching it again would go round the cycle for ever
                cycle = " -> ".join([*importing[importing.index(dep) :], dep])
                raise SchemaError(
                    f"{what} is part of a cycle of Protobuf imports ({cycle}); protoc refuses such files, and so does "
                    "Tidemark: fix the registered schemas' references"
                )
            if dep.startswith(BUILTIN_PREFIXES):
                done[dep] = _builtin(dep)
            elif dep in by_name:
                ref = by_name[dep]
                found = client.typed_version(ref.subject, ref.version, "serialized")
                where = f"the reference '{dep}' (subject '{ref.subject}' version {ref.version})"
                add(_file_proto(found.schema, where), found.references, where)
            else:
                raise SchemaError(f"{what} imports '{dep}', which it does not name among its registry references")
        importing.pop()
        done[proto.name] = proto.SerializeToString()

    add(_file_proto(text, what), refs, what)
    return list(done.values())


def _index_names(proto: Any) -> dict[tuple[int, ...], str]:
    """Every message of a file by its index path (the wire format's message indexes)."""
    names: dict[tuple[int, ...], str] = {}

    def walk(messages: Any, path: tuple[int, ...], prefix: str) -> None:
        for i, message in enumerate(messages):
            full = f"{prefix}.{message.name}" if prefix else message.name
            names[(*path, i)] = full
            walk(message.nested_type, (*path, i), full)

    walk(proto.message_type, (), proto.package)
    return names


def resolve_schemas(
    uses: list[SchemaUse], feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> ProtobufSchemas:
    """The reader's message of ``part`` (its files, checked to map onto Spark types) and each writer id's message
    names."""
    refuse_unframed(uses, "the message indexes and the Protobuf body", part)
    reader, schemas = _reader(feed, client, part)
    writers, first_use = writer_schemas(uses, feed, client, _fetcher(client), part)
    for sid, (_, writer_files) in writers.items():
        problem = _writer_incompatibility(schemas, writer_files)
        if problem is not None:
            use = first_use[sid]
            raise SchemaError(
                f"{where(use)}: {part}s written with schema id {sid}{version_of(client, reader.subject, sid)} cannot "
                f"be read with {reader_name(part)} id {reader.schema_id} (subject '{reader.subject}' version "
                f"{reader.version}): {problem}. Pin a "
                f"deserialization.{option(part, 'schema_version')} whose field numbers keep their types, or give the "
                "changed field a new number; nothing was published or committed"
            )
    return replace(
        schemas, writer_ids=tuple(writers), seen=tuple(uses),
        events=tuple(schema_changed_events(uses, reader.schema_id, part)),
        index_names={sid: names for sid, (names, _) in writers.items()},
    )  # fmt: skip


def current_schemas(
    ids: Iterable[int], feed: Feed, client: RegistryClient, *, part: RecordPart = "value"
) -> ProtobufSchemas:
    """What a re-drive decodes ``part`` of dead letters with: the feed's reader message *now* (its pinned version,
    else the subject's latest), checked as a run's, and as writers those of ``ids`` (the schema ids the dead
    letters' raw bytes carry).

    Unlike a run's (:func:`resolve_schemas`), no writer fails it: an id the registry does not have, of another
    schema type, whose files do not resolve, or whose message retypes one of the reader's field numbers is kept in
    ``unresolved`` with its reason, which its records get.
    """
    reader, schemas = _reader(feed, client, part)
    writers, unresolved = current_writers(ids, feed, _fetcher(client), part)
    for sid, (_, writer_files) in list(writers.items()):
        problem = _writer_incompatibility(schemas, writer_files)
        if problem is not None:
            del writers[sid]
            unresolved[sid] = unresolved_reason(part, sid, f"which reader id {reader.schema_id} cannot read: {problem}")
    return replace(
        schemas, writer_ids=tuple(writers), index_names={sid: names for sid, (names, _) in writers.items()},
        unresolved=tuple(sorted(unresolved.items())),
    )  # fmt: skip


def _reader(feed: Feed, client: RegistryClient, part: RecordPart) -> tuple[SubjectVersion, ProtobufSchemas]:
    """The reader version of ``part`` and its message (the schemas without writers), checked to map onto Spark
    types."""
    reader = reader_version(feed, client, "serialized", part)
    what = f"feed '{feed.name}': {reader_name(part)} (subject '{reader.subject}' version {reader.version})"
    files = _file_set(client, reader.schema, reader.references, what)
    from google.protobuf import descriptor_pb2

    top = descriptor_pb2.FileDescriptorProto.FromString(files[-1])
    if not top.message_type:
        raise SchemaError(f"{what} declares no message")
    message = (f"{top.package}." if top.package else "") + top.message_type[0].name
    schemas = ProtobufSchemas(
        format="protobuf", subject=reader.subject, version=reader.version, reader_id=reader.schema_id,
        writer_ids=(), files=tuple(files), message=message,
    )  # fmt: skip
    try:
        spark_type(schemas.descriptor())
    except ValueError as exc:
        raise SchemaError(f"{what} does not map onto Spark types: {exc}") from None
    if part == "value":
        check_columns(feed, reader, {n: None for n in schemas.field_names})
    return reader, schemas


_Writer = tuple[dict[tuple[int, ...], str], list[bytes]]  # a writer's message names by index path, and its files


def _fetcher(client: RegistryClient) -> Callable[[int], tuple[str, _Writer]]:
    """A writer id's schema type and, for a Protobuf schema, its message names and files."""

    def fetch(sid: int) -> tuple[str, _Writer]:
        schema_type, text, refs = client.typed_schema(sid, "serialized")
        if schema_type != "PROTOBUF":
            return schema_type, ({}, [])
        what = f"schema id {sid}"
        return schema_type, (_index_names(_file_proto(text, what)), _file_set(client, text, refs, what))

    return fetch


def _writer_incompatibility(reader: ProtobufSchemas, writer_files: list[bytes]) -> str | None:
    """Why the reader's message cannot read the writer's same-named message, else None."""
    reader_message = reader.descriptor()
    writer = ProtobufSchemas("protobuf", "", 0, 0, (), files=tuple(writer_files), message=reader.message)
    try:
        return _incompatibility(reader_message, writer.descriptor(), reader_message.name)
    except KeyError:
        return None  # the writer's file lacks the reader's message: its records are bad records, by index


def _wire_kind(f: FieldDescriptor) -> str:
    """What a field's bytes are on the wire, so far as a reader of another declared type still reads them right."""
    t = f.type
    if t in (f.TYPE_MESSAGE, f.TYPE_GROUP):
        return "message"
    if t in (f.TYPE_SINT32, f.TYPE_SINT64):
        return "zigzag varint"
    if t in (f.TYPE_FIXED32, f.TYPE_SFIXED32, f.TYPE_FLOAT):
        return "fixed32" if t != f.TYPE_FLOAT else "float"
    if t in (f.TYPE_FIXED64, f.TYPE_SFIXED64, f.TYPE_DOUBLE):
        return "fixed64" if t != f.TYPE_DOUBLE else "double"
    if t in (f.TYPE_STRING, f.TYPE_BYTES):
        return "length-delimited"
    return "varint"  # int32, int64, uint32, uint64, bool, enum: Protobuf reads each as the other


def _incompatibility(
    reader: Descriptor, writer: Descriptor, path: str, seen: frozenset[tuple[str, str]] = frozenset()
) -> str | None:
    """The first field whose number the writer fills with bytes the reader would misread (Protobuf keeps such a
    value as an unknown field and reads the default, or reads a message as another one: a silently wrong row), or
    None. Every nested message is checked, map values' and repeated ones' too, and a well-known type
    (``google.protobuf.Timestamp``, ...) is read only as itself."""
    pair = (reader.full_name, writer.full_name)
    if pair in seen:  # a recursive message: this pair is being checked further up
        return None
    seen = seen | {pair}
    for f in reader.fields:
        w = writer.fields_by_number.get(f.number)
        if w is None:
            continue
        where = f"field '{path}.{f.name}' (number {f.number})"
        if _is_map(f) != _is_map(w) or f.is_repeated != w.is_repeated or _wire_kind(f) != _wire_kind(w):
            return f"{where} is {_kind_name(w)} in the writer and {_kind_name(f)} in the reader"
        if _is_map(f):
            for part in ("key", "value"):
                mine, theirs = f.message_type.fields_by_name[part], w.message_type.fields_by_name[part]
                if _wire_kind(mine) != _wire_kind(theirs):
                    return (
                        f"{where}: the map's {part} is {_kind_name(theirs)} in the writer, {_kind_name(mine)} in "
                        "the reader"
                    )
            mine, theirs = f.message_type.fields_by_name["value"], w.message_type.fields_by_name["value"]
            if _wire_kind(mine) == "message":
                problem = _message_incompatibility(mine, theirs, f"{where}: the map's value", f"{path}.{f.name}", seen)
                if problem is not None:
                    return problem
        elif _wire_kind(f) == "message":
            problem = _message_incompatibility(f, w, where, f"{path}.{f.name}", seen)
            if problem is not None:
                return problem
    return None


def _message_incompatibility(
    mine: FieldDescriptor, theirs: FieldDescriptor, where: str, path: str, seen: frozenset[tuple[str, str]]
) -> str | None:
    """Why the message ``theirs`` holds is misread as ``mine``'s: a well-known type on one side and another message
    on the other (a ``Timestamp`` read from another message's fields publishes 1970-01-01), or a field inside."""
    reader, writer = mine.message_type, theirs.message_type
    known = [t.full_name for t in (reader, writer) if t.full_name.startswith(WELL_KNOWN_PREFIX)]
    if known and reader.full_name != writer.full_name:
        return (
            f"{where} is message {writer.full_name} in the writer and {reader.full_name} in the reader; a well-known "
            "type is read only as itself"
        )
    if known:  # the same well-known type on both sides
        return None
    return _incompatibility(reader, writer, path, seen)


def _kind_name(f: FieldDescriptor) -> str:
    if _is_map(f):
        return "a map"
    from google.protobuf.descriptor import FieldDescriptor

    names = {v: k.removeprefix("TYPE_").lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    return str(names.get(f.type, f.type)) + (" (repeated)" if f.is_repeated else "")


def spark_type(message: Descriptor) -> DataType:
    return _message_type(message, ())


def _message_type(message: Descriptor, seen: tuple[str, ...]) -> DataType:
    from pyspark.sql import types as T

    if message.full_name == TIMESTAMP:
        return T.TimestampType()
    if message.full_name in seen:
        raise ValueError(f"message {message.full_name} contains itself; a Spark type cannot nest without end")
    inner = (*seen, message.full_name)
    return T.StructType([T.StructField(f.name, _field_type(f, inner), True) for f in message.fields])


def _is_map(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated and f.message_type is not None and f.message_type.GetOptions().map_entry)


def _field_type(f: FieldDescriptor, seen: tuple[str, ...]) -> DataType:
    from pyspark.sql import types as T

    if _is_map(f):
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return T.MapType(_scalar_type(key, seen), _scalar_type(value, seen), True)
    single = _scalar_type(f, seen)
    return T.ArrayType(single, True) if f.is_repeated else single


def _scalar_type(f: FieldDescriptor, seen: tuple[str, ...]) -> DataType:
    from pyspark.sql import types as T

    t = f.type
    if t == f.TYPE_MESSAGE or t == f.TYPE_GROUP:
        return _message_type(f.message_type, seen)
    if t in (f.TYPE_INT32, f.TYPE_SINT32, f.TYPE_SFIXED32):
        return T.IntegerType()
    if t in (f.TYPE_INT64, f.TYPE_SINT64, f.TYPE_SFIXED64, f.TYPE_UINT32, f.TYPE_FIXED32):
        return T.LongType()
    if t in (f.TYPE_UINT64, f.TYPE_FIXED64):
        return T.DecimalType(20, 0)
    simple = {f.TYPE_DOUBLE: T.DoubleType(), f.TYPE_FLOAT: T.FloatType(), f.TYPE_BOOL: T.BooleanType(),
              f.TYPE_STRING: T.StringType(), f.TYPE_BYTES: T.BinaryType(), f.TYPE_ENUM: T.StringType()}  # fmt: skip
    return simple[t]


class _BadRecord(Exception):
    """A record that does not decode; the message is its reason."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _BadRecord("its message indexes are cut short")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos  # zigzag, as the serializers write them
        shift += 7


def message_indexes(value: bytes) -> tuple[tuple[int, ...], int]:
    """The message index path after the 5-byte prefix, and where the body starts."""
    count, pos = _varint(value, HEADER_BYTES)
    if count == 0:
        return (0,), pos  # the serializers' short form for the first message
    if count < 0:
        raise _BadRecord("its message index count is negative")
    path = []
    for _ in range(count):
        index, pos = _varint(value, pos)
        path.append(index)
    return tuple(path), pos


class _OutOfRange(Exception):
    """A value Spark's types cannot hold; the message is the field's path (see :func:`timestamp_paths`)."""


def timestamp_paths(message: Descriptor) -> list[str]:
    """Every ``google.protobuf.Timestamp`` field below ``message``, as a path from it (``Order.lines[].at``,
    ``Order.tags{}.at``: an item of a repeated field, a map's value), in field order."""
    paths: list[str] = []

    def walk(m: Descriptor, path: str) -> None:
        for f in m.fields:
            if _is_map(f):
                f, here = f.message_type.fields_by_name["value"], f"{path}.{f.name}{{}}"
            else:
                here = f"{path}.{f.name}" + ("[]" if f.is_repeated else "")
            if f.message_type is None:
                continue
            if f.message_type.full_name == TIMESTAMP:
                paths.append(here)
            else:
                walk(f.message_type, here)

    walk(message, message.name)
    return paths


def _value(f: FieldDescriptor, v: Any, path: str) -> Any:
    if f.type == f.TYPE_ENUM:
        known = f.enum_type.values_by_number.get(v)
        return known.name if known is not None else str(v)
    if f.type in (f.TYPE_MESSAGE, f.TYPE_GROUP):
        if f.message_type.full_name == TIMESTAMP:
            try:
                return v.ToDatetime(tzinfo=dt.UTC)
            except (ValueError, OverflowError):  # outside years 1-9999: no Python datetime, no Spark timestamp
                raise _OutOfRange(path) from None
        return _struct(v, path)
    if f.type in (f.TYPE_UINT64, f.TYPE_FIXED64):
        return Decimal(v)
    return v


def _struct(message: Any, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        v = getattr(message, f.name)
        if _is_map(f):
            value_field = f.message_type.fields_by_name["value"]
            out[f.name] = [(k, _value(value_field, x, f"{path}.{f.name}{{}}")) for k, x in v.items()]
        elif f.is_repeated:
            out[f.name] = [_value(f, x, f"{path}.{f.name}[]") for x in v]
        elif f.has_presence and not message.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _value(f, v, f"{path}.{f.name}")
    return out


def _decoder(schemas: ProtobufSchemas, column: str, out_type: pa.DataType, source: str) -> Any:
    """The ``mapInArrow`` function: each batch with ``column`` added (``source`` decoded, null where it failed) and
    :func:`out_of_range_column` (the path of the field whose value Spark cannot hold, else null)."""
    files, message, index_names = schemas.files, schemas.message, {k: dict(v) for k, v in schemas.index_names.items()}

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from google.protobuf import message_factory
        from google.protobuf.message import DecodeError

        cls = message_factory.GetMessageClass(
            ProtobufSchemas("protobuf", "", 0, 0, (), files=files, message=message).descriptor()
        )
        name = cls.DESCRIPTOR.name
        for batch in batches:
            decoded: list[dict[str, Any] | None] = []
            out_of_range: list[str | None] = []
            for row, value in enumerate(batch.column(source).to_pylist()):
                out_of_range.append(None)
                if value is None:
                    decoded.append(None)
                    continue
                try:
                    path, start = message_indexes(value)
                    sid = int.from_bytes(value[1:HEADER_BYTES], "big")
                    if index_names.get(sid, {}).get(path) != message:
                        raise _BadRecord("its message indexes do not name the reader's message")
                    decoded.append(_struct(cls.FromString(value[start:]), name))
                except (_BadRecord, DecodeError):
                    decoded.append(None)
                except _OutOfRange as exc:
                    decoded.append(None)
                    out_of_range[-1] = str(exc)
                except Exception as exc:  # re-raised naming the record: a worker's own error names none
                    raise ReadError(
                        f"{_record_at(batch, row)}: its {source} did not decode as {message} ({type(exc).__name__}: "
                        f"{exc}); nothing was published or committed"
                    ) from exc
            parsed = pa.array(decoded, type=out_type)
            why = pa.array(out_of_range, type=pa.string())
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, parsed, why], names=[*batch.schema.names, column, out_of_range_column(column)]
            )

    return decode


def _record_at(batch: pa.RecordBatch, row: int) -> str:
    """``topic[partition] offset N`` of ``batch``'s ``row``, so far as the batch has those columns."""
    names = batch.schema.names
    topic = batch.column("topic")[row].as_py() if "topic" in names else "?"
    partition = batch.column("partition")[row].as_py() if "partition" in names else "?"
    offset = batch.column("offset")[row].as_py() if "offset" in names else "?"
    return f"{topic}[{partition}] offset {offset}"


def out_of_range_column(column: str) -> str:
    """The column :func:`decoded_frame` adds beside ``column``: the field whose value Spark's types cannot hold."""
    return f"{column}_out_of_range"


def decoded_frame(df: DataFrame, schemas: ProtobufSchemas, column: str, source: str = "value") -> DataFrame:
    """``df`` with ``column``: each ``source``'s message decoded with the reader's class, null where it did not
    decode; and :func:`out_of_range_column`, the path of a field whose value Spark's types cannot hold (a
    ``Timestamp`` outside years 1-9999), null elsewhere."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    message_type = spark_type(schemas.descriptor())
    out = T.StructType([
        *df.schema.fields, T.StructField(column, message_type, True),
        T.StructField(out_of_range_column(column), T.StringType(), True),
    ])  # fmt: skip
    return df.mapInArrow(_decoder(schemas, column, to_arrow_type(message_type, timezone="UTC"), source), out)


class _Protobuf:
    """Protobuf's :class:`~tidemark.spark.formats.RegistryFormat`: decoded in the Python workers
    (:func:`decoded_frame`), a record failing to parse as the reader's message or on a ``Timestamp`` outside what
    Spark's timestamps hold (:func:`timestamp_paths`)."""

    name = "protobuf"

    def reasons(self, part: RecordPart, schemas: ProtobufSchemas | None) -> list[str]:
        if schemas is None:
            return [f"{part} does not decode as the Protobuf message of its writer schema"]
        timestamps = [
            f"{part} field '{path}' is a google.protobuf.Timestamp outside years 1 to 9999, which Spark's timestamps "
            "cannot hold"
            for path in timestamp_paths(schemas.descriptor())
        ]
        unresolved = [why for _, why in schemas.unresolved]  # a re-drive's writers that do not resolve
        return [*self.reasons(part, None), *timestamps, *unresolved]

    def decoding(self, work: DataFrame, schemas: ProtobufSchemas, column: str, parsed_name: str) -> PartDecoding:
        from pyspark.sql import functions as F

        present = F.col(column).isNotNull()
        work = decoded_frame(work, schemas, parsed_name, column)
        parsed, why = F.col(parsed_name), F.col(out_of_range_column(parsed_name))
        out_of_range = [present & (why == F.lit(path)) for path in timestamp_paths(schemas.descriptor())]
        # A re-drive's writer that does not resolve: its records' reason names it, not the body's.
        unresolved = [F.substring(column, 1, HEADER_BYTES) == F.lit(header(sid)) for sid, _ in schemas.unresolved]
        body = present & parsed.isNull() & why.isNull()
        if unresolved:
            body = body & ~F.coalesce(reduce(operator.or_, unresolved), F.lit(False))
        return PartDecoding(work, parsed, parsed, [body, *out_of_range, *(present & u for u in unresolved)])


FORMAT: RegistryFormat[ProtobufSchemas] = _Protobuf()
