"""Avro values decoded and staged by the read tasks themselves: the job's write without Spark rows.

The job's write (:mod:`tidemark.job.steps`) is one Spark write: the data source's Arrow
batches become Spark rows, ``from_avro`` decodes each value, and Spark's Parquet writer
stages the records. Most of that time is Spark's: its Parquet writer alone takes longer
than reading and decoding (``docs/read-publish.md``). For an Avro feed in the common case
this module does the same work inside the read tasks, on Arrow columns: each task reads
its ranges (:func:`tidemark.spark.source.read_task`), decodes every batch's values with
polars' Avro reader (the bodies of one writer's records, wrapped as one block of an Avro
object container file), resolves them to the reader schema in Arrow (promotions, the
reader's defaults for fields the writer lacks), and writes the staged Parquet files with
pyarrow: the same folders, columns and types as Spark's write, and the raw value beside
each record, from which validation computes the range statistics as it does for
``bytes`` feeds.

Nothing is taken on trust from the decoder: a record counts as decoded only when the
length of its Avro encoding, computed from its decoded fields, equals the length of its
body, so every record's bytes were read by exactly its own fields (a body with a byte too
many or too few would shift every record after it), and a boolean's byte, which those
lengths place, must be 0 or 1 (polars reads any other as false). A task that cannot show that, or that
meets anything else it does not handle (a null value, unless it is a keyed table's
tombstone, staged with every field null; a header other than the run's
candidate writers', a key that is not UTF-8, a record without a timestamp), stops and says
why, and the job stages with Spark instead (a second read of Kafka, by the path that
decodes, quarantines and names every bad record).

What takes this path (:meth:`StagePlan.of`, and the job's conditions in
:func:`tidemark.job.stage.stage_in_read_tasks`): an Avro value whose reader and writer
records hold fields of the types below, a ``string`` or ``bytes`` key, no row-level rules,
no exact window, staging in a folder the executors and the driver share. Types: boolean,
int, long, float, double, string, bytes, enum, ``date``, ``timestamp-millis``,
``timestamp-micros``, each alone or in a union with null. Everything else (nested records,
arrays, maps, decimals, fixed, other unions, named type references) is staged by Spark.
Raw bytes, text and JSON values take the same path, the same files and the same checks
through :mod:`tidemark.spark.arrow_plain`: a read task stages whatever :class:`TaskStaging`
lays out, and its writer, file naming and the driver's checks are this module's.

The publishers import this module where no Spark runs (:data:`SPARK_SCHEMA_KEY`), so Spark,
pyarrow, numpy, polars and :mod:`tidemark.spark.source` (which loads Spark and pyarrow) are
imported inside the functions that use them.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tidemark.errors import TidemarkError
from tidemark.kafka.connection import from_env
from tidemark.spark.wire import HEADER_BYTES, header

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from tidemark.kafka.connection import KafkaConnection
    from tidemark.planning.plan import Plan
    from tidemark.spark.avro import AvroSchemas
    from tidemark.spark.source import ReadTask

PRIMITIVES = frozenset({"boolean", "int", "long", "float", "double", "string", "bytes"})
LOGICAL = {"date": "int", "timestamp-millis": "long", "timestamp-micros": "long"}
# Writer kind → reader kinds Avro resolves it to (besides itself).
PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
SYNC = b"tidemark-block00"  # the container's 16-byte sync marker: any constant does
SPARK_SCHEMA_KEY = "org.apache.spark.sql.parquet.row.metadata"  # the Spark schema a Spark-written file's footer holds
SWITCH_ENV = "TIDEMARK_READ_TASK_STAGING"  # "0": Spark stages every plan


class TaskStaging(Protocol):
    """What a read task needs to stage records of one value format: this module's :class:`StagePlan` (Avro), or
    :class:`tidemark.spark.arrow_plain.PlainPlan` (raw bytes, text, JSON with declared fields)."""

    @property
    def file_schema(self) -> str: ...  # the staged files' Spark schema (JSON): every column but the partitions'

    @property
    def partition_columns(self) -> tuple[str, str, str]: ...  # (outcome, topic, date) folder names

    @property
    def ok(self) -> str: ...  # the outcome every record staged here gets

    @property
    def plain(self) -> tuple[str, ...]: ...  # columns written without dictionary and statistics (payloads)

    def tables(self, batch: pa.RecordBatch, schema: pa.Schema) -> Iterator[tuple[tuple[str, int], pa.Table]]:
        """``batch``'s records decoded and laid out as ``schema``, one table per (topic, UTC day); raises
        :class:`CannotStage` for a record the plan does not stage."""
        ...


@dataclass(frozen=True)
class Kind:
    """An Avro field type this path decodes: its kind, whether null is allowed, an enum's symbols."""

    name: str  # a primitive, "enum", or a logical type of LOGICAL
    nullable: bool = False
    symbols: tuple[str, ...] = ()

    @classmethod
    def of(cls, avro_type: Any) -> Kind | None:
        """The kind of ``avro_type`` (a field's type in schema JSON), None when this path does not decode it."""
        nullable = False
        if isinstance(avro_type, list):
            branches = [b for b in avro_type if b != "null"]
            if len(avro_type) != 2 or len(branches) != 1:
                return None
            nullable, avro_type = True, branches[0]
        if isinstance(avro_type, str):
            return cls(avro_type, nullable) if avro_type in PRIMITIVES else None
        if not isinstance(avro_type, dict):
            return None
        base, logical = avro_type.get("type"), avro_type.get("logicalType")
        if base == "enum" and logical is None:
            return cls("enum", nullable, tuple(str(s) for s in avro_type.get("symbols", ())))
        if logical is None:
            return cls(base, nullable) if base in PRIMITIVES else None
        return cls(logical, nullable) if LOGICAL.get(logical) == base else None

    def reads(self, writer: Kind) -> bool:
        """Whether a value written as ``writer`` resolves to this reader kind exactly as Avro resolves it."""
        if writer.nullable and not self.nullable:
            return False
        if writer.name == "enum":
            return self.name == "enum" and set(writer.symbols) <= set(self.symbols)
        return writer.name == self.name or self.name in PROMOTIONS.get(writer.name, set())


@dataclass(frozen=True)
class WriterPlan:
    """How to decode one writer schema's bodies: its wire-format header, its container prefix, its fields."""

    schema_id: int
    header: bytes  # the five wire-format bytes: magic 0 and the big-endian schema id
    container: bytes  # an Avro object container's header declaring the writer schema
    fields: tuple[tuple[str, Kind], ...]


@dataclass(frozen=True)
class ReaderField:
    name: str
    source: str | None  # the writer's field it reads, None: the reader's default
    kind: Kind
    default: Any = None


@dataclass(frozen=True)
class StagePlan:
    """Everything a read task needs to stage its records: picklable, schemas only, no secrets."""

    writers: tuple[WriterPlan, ...]
    readers: tuple[tuple[int, tuple[ReaderField, ...]], ...]  # per writer id: the reader's fields
    file_schema: str  # the staged files' Spark schema (JSON): every staged column but the partition columns
    partition_columns: tuple[str, str, str]  # (outcome, topic, date) folder names, in that order
    ok: str  # the outcome every record staged here gets
    key_text: bool  # the key is staged as UTF-8 text (else as bytes)
    raw_value: str  # the column holding each record's raw value
    head: str | None  # the column holding each value's wire-format header, when staged
    plain: tuple[str, ...]  # columns written without dictionary and statistics (payloads)
    tombstones: bool = False  # a null value is a change (a keyed table's): staged with every reader field null

    @classmethod
    def of(
        cls,
        schemas: AvroSchemas,
        staged: StructType,
        *,
        partition_columns: tuple[str, str, str],
        ok: str,
        raw_value: str,
        head: str | None,
        plain: Sequence[str],
        tombstones: bool = False,
    ) -> StagePlan | str:
        """The plan for staging ``staged``'s columns (the Spark write's) from ``schemas``' writers; else why not."""
        from pyspark.sql.types import BinaryType, StringType, StructType

        reader = json.loads(schemas.reader)
        if not isinstance(reader, dict) or reader.get("type") != "record":
            return "the reader schema is not a record"
        reader_fields: list[tuple[dict[str, Any], Kind]] = []
        for f in reader["fields"]:
            kind = Kind.of(f["type"])
            if kind is None or f.get("aliases"):
                return f"reader field '{f['name']}' has a type (or aliases) only Spark's decoder reads: {f['type']}"
            reader_fields.append((f, kind))
        writers, readers = [], []
        for sid, text in sorted(schemas.writers.items()):
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("type") != "record":
                return f"writer schema {sid} is not a record"
            fields = []
            for f in doc["fields"]:
                kind = Kind.of(f["type"])
                if kind is None:
                    return f"writer schema {sid}'s field '{f['name']}' has a type only Spark's decoder reads"
                fields.append((str(f["name"]), kind))
            by_name = dict(fields)
            resolved = []
            for f, kind in reader_fields:
                name = str(f["name"])
                if name in by_name:
                    if not kind.reads(by_name[name]):
                        return f"writer schema {sid}'s field '{name}' resolves in a way only Spark's decoder reads"
                    resolved.append(ReaderField(name, name, kind))
                elif "default" in f:
                    resolved.append(ReaderField(name, None, kind, f["default"]))
                else:
                    return f"writer schema {sid} lacks reader field '{name}', which has no default"
            writers.append(WriterPlan(sid, header(sid), _container(doc), tuple(fields)))
            readers.append((sid, tuple(resolved)))
        if not writers:
            return "no writer schema"
        folders = set(partition_columns)
        file_schema = StructType([f for f in staged.fields if f.name not in folders])
        key = next((f for f in file_schema.fields if f.name == "key"), None)
        if key is None or not isinstance(key.dataType, StringType | BinaryType):
            return "the key is not staged as text or bytes"
        return cls(
            tuple(writers), tuple(readers), file_schema.json(), partition_columns, ok,
            isinstance(key.dataType, StringType), raw_value, head, tuple(plain), tombstones,
        )  # fmt: skip

    def tables(self, batch: pa.RecordBatch, schema: pa.Schema) -> Iterator[tuple[tuple[str, int], pa.Table]]:
        return _staged_tables(batch, self, schema)


def _container(writer: Mapping[str, Any]) -> bytes:
    """The header of an Avro object container file declaring ``writer`` (no codec): magic, metadata, sync.

    Its enums are declared as ``int``: an enum's encoding is its symbol's index as an Avro int, and polars' reader
    panics on an enum in a union with null; :func:`_decode` turns the indexes into symbols.
    """
    meta = {b"avro.schema": json.dumps(_enums_as_ints(_without_defaults(writer))).encode(), b"avro.codec": b"null"}
    out = bytearray(b"Obj\x01") + _long(len(meta))
    for k, v in meta.items():
        out += _long(len(k)) + k + _long(len(v)) + v
    return bytes(out + _long(0) + SYNC)


def _without_defaults(doc: Any) -> Any:
    """``doc`` without ``default`` values: a writer schema decodes without them, and polars' schema parser
    rejects some (a string default)."""
    if isinstance(doc, dict):
        return {k: _without_defaults(v) for k, v in doc.items() if k not in ("default", "doc")}
    if isinstance(doc, list):
        return [_without_defaults(v) for v in doc]
    return doc


def _enums_as_ints(doc: Any) -> Any:
    """``doc`` with every enum type declared as ``int`` (the same bytes: the symbol's index)."""
    if isinstance(doc, dict):
        if doc.get("type") == "enum":
            return "int"
        return {k: _enums_as_ints(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_enums_as_ints(v) for v in doc]
    return doc


def _long(n: int) -> bytes:
    """Avro's encoding of a long: zigzag, then a varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


class CannotStage(Exception):
    """A read task met records this path does not stage; the message says which and why."""


# -- in the read task ------------------------------------------------------------------------


def stage_task(
    index: int, task: ReadTask, client_config: Mapping[str, Any], plan: TaskStaging, target: str
) -> tuple[list[tuple[str, int]], dict[tuple[str, int], int]]:
    """Read ``task``, decode and stage its records under ``target``; the files written (relative) and their rows,
    and the records the reader produced per partition (which the driver compares with the rows staged).

    Raises :class:`CannotStage` for records this path does not stage, and the reader's
    errors (:class:`tidemark.errors.ReadError`) as they come.
    """
    schema = staged_arrow_schema(plan)
    files: dict[tuple[str, int], _StagedFile] = {}
    attempt = uuid.uuid4().hex[:12]
    read: dict[tuple[str, int], int] = {}
    try:
        for (topic, day), table in decoded_tables(task, client_config, plan, schema, read):
            if (topic, day) not in files:
                values = (plan.ok, topic, _date(day))
                folder = "/".join(f"{c}={v}" for c, v in zip(plan.partition_columns, values, strict=True))
                files[(topic, day)] = _StagedFile(
                    target, f"{folder}/part-{index:05d}-{len(files):03d}.parquet", attempt, schema, plan.plain
                )
            files[(topic, day)].add(table)
            if sum(f.pending_bytes for f in files.values()) >= ROW_GROUP_BYTES:  # a task's memory, whatever its days
                max(files.values(), key=lambda f: f.pending_bytes).flush()
    except BaseException:
        for file in files.values():
            file.abandon()
        raise
    return sorted((file.name, file.close()) for file in files.values()), read


def staged_arrow_schema(plan: TaskStaging) -> pa.Schema:
    """The staged files' Arrow schema, with the Spark schema Spark's own files carry in their footers."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    schema = to_arrow_schema(StructType.fromJson(json.loads(plan.file_schema)), timezone="UTC")
    return schema.with_metadata({SPARK_SCHEMA_KEY: plan.file_schema})  # the footer's, see _StagedFile


def decoded_tables(
    task: ReadTask,
    client_config: Mapping[str, Any],
    plan: TaskStaging,
    schema: pa.Schema,
    read: dict[tuple[str, int], int] | None = None,
) -> Iterator[tuple[tuple[str, int], pa.Table]]:
    """``task``'s records read, decoded and laid out as ``schema``: a table per read batch and (topic, UTC day).

    What :func:`stage_task` writes; the Avro benchmark's read-and-decode runner counts them.
    ``read`` receives the records the reader produced per (topic, partition).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    # spark.source loads pyspark; this module is imported (for SPARK_SCHEMA_KEY) where pyspark must not load.
    from tidemark.spark.source import read_task

    for batch in read_task(task, client_config):
        if read is not None and batch.num_rows:
            pairs = pc.value_counts(pc.binary_join_element_wise(
                pc.cast(batch.column("topic"), pa.string()), pc.cast(batch.column("partition"), pa.string()), "\x00"
            ))  # fmt: skip
            for item in pairs.to_pylist():
                name, part = item["values"].split("\x00")
                read[(name, int(part))] = read.get((name, int(part)), 0) + int(item["counts"])
        yield from plan.tables(batch, schema)


ROW_GROUP_BYTES = 64 * 1024 * 1024  # Arrow bytes buffered per file before they are written as one row group


class _StagedFile:
    """One staged Parquet file, written under a hidden name and renamed into place when closed.

    Tables are buffered and written as one row group when a task's files buffer
    :data:`ROW_GROUP_BYTES` together (the file that holds the most goes first): a row group
    per read batch would make thousands, and publication copies column chunks one call at a
    time.
    """

    def __init__(self, target: str, name: str, attempt: str, schema: pa.Schema, plain: Sequence[str]) -> None:
        import pyarrow.parquet as pq

        self.name, self.path = name, f"{target}/{name}"
        self.temp = f"{target}/{Path(name).parent}/.{Path(name).name}.{attempt}.tmp"  # hidden from Spark's reader
        Path(self.temp).parent.mkdir(parents=True, exist_ok=True)
        encoded = [f.name for f in schema if f.name not in plain]  # payloads: no dictionary, no statistics
        self.writer = pq.ParquetWriter(
            self.temp, schema, compression="snappy", store_schema=False, use_dictionary=encoded,
            write_statistics=encoded,
        )  # fmt: skip
        # No Arrow schema in the footer (publication drops columns, and a stale one would name them), but the
        # Spark schema Spark's own files carry there: the publication prunes it like theirs.
        self.writer.add_key_value_metadata({k.decode(): v.decode() for k, v in (schema.metadata or {}).items()})
        self.pending: list[pa.Table] = []
        self.pending_bytes = self.rows = 0

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.pending_bytes += table.nbytes
        self.rows += table.num_rows

    def flush(self) -> None:
        import pyarrow as pa

        if self.pending:
            table = pa.concat_tables(self.pending)
            self.writer.write_table(table, row_group_size=table.num_rows)
        self.pending, self.pending_bytes = [], 0

    def close(self) -> int:
        """Write what is buffered, close, rename into place (a retried attempt writes the same name); the rows."""
        self.flush()
        self.writer.close()
        os.replace(self.temp, self.path)
        return self.rows

    def abandon(self) -> None:
        self.writer.close()
        Path(self.temp).unlink(missing_ok=True)


def _date(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


def _staged_tables(batch: pa.RecordBatch, plan: StagePlan, schema: pa.Schema) -> Iterator[tuple[tuple[str, int], Any]]:
    """``batch``'s records decoded and laid out as ``schema``, one table per (topic, UTC day)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = batch.column("value")
    where = _where(batch)
    if values.null_count and not plan.tombstones:
        raise CannotStage(f"{where}: a record without a value (a tombstone)")
    if batch.column("timestamp").null_count:
        raise CannotStage(f"{where}: a record without a timestamp")
    tables, topics = [], []
    if values.null_count:  # a keyed table's tombstones: every reader field null, as Spark's decoder gives them
        nulls = batch.filter(pc.is_null(values))
        tables.append(_laid_out(nulls, pa.nulls(nulls.num_rows), None, plan.readers[0][1], plan, schema))
        topics.append(nulls.column("topic"))
        batch = batch.filter(pc.is_valid(values))
        values = batch.column("value")
    if batch.num_rows and pc.min(pc.binary_length(values)).as_py() < HEADER_BYTES:
        raise CannotStage(f"{where}: a value shorter than the wire format's five-byte header")
    heads = pc.binary_slice(values, 0, HEADER_BYTES)
    found = pc.unique(heads).to_pylist()
    writers = {w.header: w for w in plan.writers}
    for head in found:
        if head not in writers:
            raise CannotStage(f"{where}: a value framed with header {head.hex()}, not one of the run's writers'")
    readers = dict(plan.readers)
    for head in found:  # usually one writer per batch: then the batch is used as it is, not filtered
        mask = pc.equal(heads, pa.scalar(head, pa.binary())) if len(found) > 1 else None
        part, part_heads = (batch, heads) if mask is None else (batch.filter(mask), heads.filter(mask))
        writer = writers[head]
        decoded = _decode(part.column("value"), writer, where)
        tables.append(_laid_out(part, part_heads, decoded, readers[writer.schema_id], plan, schema))
        topics.append(part.column("topic"))
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    yield from by_topic_day(table, pa.concat_arrays(topics) if len(topics) > 1 else topics[0])


def by_topic_day(table: pa.Table, topic: pa.Array) -> Iterator[tuple[tuple[str, int], pa.Table]]:
    """``table`` (staged columns, whose ``timestamp`` is set) split by ``topic`` (each row's) and UTC day."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    days = np.floor_divide(table.column("timestamp").cast(pa.int64()).to_numpy(), 86_400_000_000)
    names = pc.unique(topic).to_pylist()
    for name in names:
        of_topic = pc.equal(topic, name).to_numpy(zero_copy_only=False) if len(names) > 1 else None
        on_days = np.unique(days if of_topic is None else days[of_topic]).tolist()
        for day in on_days:
            if of_topic is None and len(on_days) == 1:  # one topic, one day: the whole table
                yield (name, int(day)), table
            else:
                chosen = days == day if of_topic is None else of_topic & (days == day)
                yield (name, int(day)), table.filter(pa.array(chosen))


def _decode(values: pa.Array, writer: WriterPlan, where: str) -> pa.Table:
    """The bodies of ``values`` (all framed with ``writer``'s header) decoded with its schema, one column per field.

    Raises :class:`CannotStage` unless every record's encoding, as its decoded fields
    give it, is exactly as long as its body.
    """
    import numpy as np
    import polars as pl  # here, not at the top: an executor without polars gives way (see _run)
    import pyarrow as pa
    import pyarrow.compute as pc

    bodies = pc.binary_slice(values, HEADER_BYTES, 2**31 - 1)
    width = np.int64 if pa.types.is_large_binary(bodies.type) else np.int32
    offsets = np.frombuffer(
        bodies.buffers()[1], dtype=width, count=len(bodies) + 1, offset=bodies.offset * np.dtype(width).itemsize
    ).astype(np.int64)
    data = bodies.buffers()[2]
    block = data.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_pybytes()
    container = writer.container + _long(len(bodies)) + _long(len(block)) + block + SYNC
    try:
        decoded = pl.read_avro(io.BytesIO(container)).to_arrow()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # polars' panics (pyo3's PanicException) are BaseExceptions
        raise CannotStage(f"{where}: values of schema id {writer.schema_id} did not decode: {exc}") from exc
    if decoded.num_rows != len(bodies):
        raise CannotStage(f"{where}: {decoded.num_rows} records decoded from {len(bodies)} values")
    sizes = np.zeros(len(bodies), dtype=np.int64)
    booleans = []  # per boolean field: where its byte is in data (past a union's branch index), where it is not null
    for name, kind in writer.fields:
        column = decoded.column(name).combine_chunks()
        if kind.name == "boolean":
            present = column.is_valid().to_numpy(zero_copy_only=False) if kind.nullable else None
            booleans.append((name, offsets[:-1] + sizes + kind.nullable, present))
        sizes += _encoded_sizes(column, kind)
    if not np.array_equal(sizes, np.diff(offsets)):
        first = int(np.argmax(sizes != np.diff(offsets)))
        raise CannotStage(
            f"{where}: a value of schema id {writer.schema_id} ({first + 1}. of {len(bodies)}) is "
            f"{int(np.diff(offsets)[first])} bytes long, its decoded fields encode to {int(sizes[first])}"
        )
    # The spec's booleans are the byte 0 or 1; polars reads any other as false (and fastavro as true): such a body
    # is refused, as on Spark's path. The fields' sizes, now checked, place each boolean's byte.
    raw = np.frombuffer(data, dtype=np.uint8)
    for name, at, present in booleans:
        wrong = raw[at] > 1 if present is None else np.where(present, raw[np.where(present, at, 0)] > 1, False)
        if wrong.any():
            first = int(np.argmax(wrong))
            raise CannotStage(
                f"{where}: a value of schema id {writer.schema_id} ({first + 1}. of {len(bodies)}): field '{name}' "
                f"holds a boolean byte other than 0 or 1 ({int(raw[at[first]])}; Avro's booleans are the byte 0 or 1 "
                "only)"
            )
    for name, kind in writer.fields:  # decoded as their indexes (_container): now their symbols
        if kind.name == "enum":
            index = decoded.column(name).combine_chunks()
            symbols = pc.take(pa.array(kind.symbols, pa.string()), index.cast(pa.int64()))
            decoded = decoded.set_column(decoded.schema.get_field_index(name), name, symbols)
    return decoded


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """The bytes Avro's zigzag varint takes for each of ``values`` (int64)."""
    import numpy as np

    zigzag = ((values << 1) ^ (values >> 63)).view(np.uint64)
    sizes = np.ones(len(values), dtype=np.int64)
    largest = int(zigzag.max()) if len(zigzag) else 0
    for bits in range(7, 64, 7):
        if largest < 1 << bits:  # no value needs another byte
            break
        sizes += zigzag >= np.uint64(1 << bits)
    return sizes


def _encoded_sizes(column: pa.Array, kind: Kind) -> np.ndarray:
    """The bytes each value of ``column`` (decoded from a field of ``kind``) takes in Avro's binary encoding."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(column)
    if kind.name == "boolean":
        sizes = np.ones(n, dtype=np.int64)
    elif kind.name == "float":
        sizes = np.full(n, 4, dtype=np.int64)
    elif kind.name == "double":
        sizes = np.full(n, 8, dtype=np.int64)
    elif kind.name in ("string", "bytes"):
        lengths = pc.fill_null(pc.binary_length(column), 0).cast(pa.int64()).to_numpy()
        sizes = _varint_sizes(lengths) + lengths
    elif kind.name == "enum":  # decoded as the symbol's index (_container)
        index = pc.fill_null(column, 0).cast(pa.int64()).to_numpy()
        if len(index) and (index.min() < 0 or index.max() >= len(kind.symbols)):
            raise CannotStage(f"an enum index outside the {len(kind.symbols)} symbols {list(kind.symbols)}")
        sizes = _varint_sizes(index)
    else:  # int, long and the logical types on them: a varint of the number as written
        unit = {"timestamp-millis": pa.timestamp("ms", "UTC"), "timestamp-micros": pa.timestamp("us", "UTC")}
        numbers = column.cast(unit[kind.name]) if kind.name in unit else column
        numbers = numbers.cast(pa.int32()) if kind.name == "date" else numbers
        sizes = _varint_sizes(pc.fill_null(numbers.cast(pa.int64()), 0).to_numpy())
    if kind.nullable:  # the union's branch index (one byte), and the value where it is not null
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        sizes = 1 + np.where(valid, sizes, 0)
    elif column.null_count:
        raise CannotStage("a field that admits no null decoded as null")
    return sizes


def _laid_out(
    part: pa.RecordBatch,
    heads: pa.Array,
    decoded: pa.Table | None,
    fields: Sequence[ReaderField],
    plan: StagePlan,
    schema: pa.Schema,
) -> pa.Table:
    """The staged columns of ``part``'s records (``schema``): Kafka's, the reader's fields (null without
    ``decoded``: tombstones), the raw value."""
    import pyarrow as pa

    n = part.num_rows
    columns: dict[str, Any] = {c: part.column(c) for c in ("partition", "offset", "timestamp", "timestamp_type",
                                                               "headers")}  # fmt: skip
    key = part.column("key")
    if plan.key_text:
        try:
            key = key.cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise CannotStage(f"{_where(part)}: a key that is not UTF-8 text") from exc
    columns["key"] = key
    columns[plan.raw_value] = part.column("value")
    if plan.head is not None:
        columns[plan.head] = heads
    for f in fields:
        if decoded is None:
            columns[f.name] = pa.nulls(n)  # cast to the field's type below
            continue
        columns[f.name] = decoded.column(f.source).combine_chunks() if f.source else _default(f, n)
    arrays = []
    for target in schema:
        column = columns[target.name]
        if column.type != target.type:
            # Promotions (int → long, long → double), dictionary → text, bytes → text (unchecked, as Spark's
            # decoder keeps bytes that are not UTF-8 in a string).
            # A timestamp-millis value whose microseconds overflow a long (a producer's epoch nanoseconds in a
            # millis field) is checked: wrapped it would publish as garbage; Spark's decoder refuses it.
            safe = pa.types.is_timestamp(target.type)
            try:
                column = column.cast(target.type, safe=safe)
            except pa.ArrowInvalid as exc:  # a conversion Arrow refuses: Spark's decoder is the judge of it
                what = f"{_where(part)}: field '{target.name}' does not convert to the reader's type"
                raise CannotStage(what) from exc
        arrays.append(column)
    return pa.Table.from_arrays(arrays, schema=schema)


def _default(field: ReaderField, n: int) -> pa.Array:
    """``n`` copies of ``field``'s default, in the type a decoded value of its kind has."""
    import pyarrow as pa

    value = field.default
    natural = {
        "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
        "string": pa.string(), "enum": pa.string(), "bytes": pa.binary(), "date": pa.int32(),
        "timestamp-millis": pa.int64(), "timestamp-micros": pa.int64(),
    }[field.kind.name]  # fmt: skip
    if value is not None and field.kind.name == "bytes":
        value = str(value).encode("latin-1")  # Avro's JSON default of bytes: code points 0-255
    array = pa.array([value] * n, natural)
    if field.kind.name == "date":
        return array.cast(pa.date32())
    if field.kind.name.startswith("timestamp-"):
        unit = "ms" if field.kind.name == "timestamp-millis" else "us"
        return array.cast(pa.timestamp(unit, "UTC"))
    return array


def _where(batch: pa.RecordBatch) -> str:
    topic = batch.column("topic")[0].as_py() if batch.num_rows else "?"
    part = batch.column("partition")[0].as_py() if batch.num_rows else "?"
    offsets = batch.column("offset")
    first = offsets[0].as_py() if batch.num_rows else "?"
    last = offsets[batch.num_rows - 1].as_py() if batch.num_rows else "?"
    return f"{topic}[{part}] offsets {first}..{last}"


# -- on the driver -----------------------------------------------------------------------------


def stage_in_tasks(
    spark: SparkSession,
    plan: Plan,
    connection: KafkaConnection | None,
    stage: TaskStaging,
    target: Path,
    read: dict[tuple[str, int], int] | None = None,
) -> str | None:
    """Read ``plan`` and stage its records under ``target`` in the read tasks (one Spark task each).

    Returns None when every record was staged, else why a task gave way (``target`` is
    then removed, and the caller stages with Spark). Errors of the read itself (an
    offset gone, a partition that stalls) fail the Spark job as they do in the data source.
    """
    from tidemark.spark.source import tasks_of  # loads pyspark: see decoded_tables

    tasks = [t for t in tasks_of(plan) if t.records]
    config = dict(connection.client_config()) if connection is not None else None
    folder = str(target)
    sc = spark.sparkContext
    sc.setJobDescription(f"tidemark: read, decode and stage plan {plan.plan_id}")
    try:
        outcomes = (
            sc.parallelize(list(enumerate(tasks)), max(len(tasks), 1))
            .mapPartitions(lambda items: _run(items, config, stage, folder))
            .collect()
        )
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    reasons = [detail for status, detail in outcomes if status == "gave_way"]
    if reasons:
        shutil.rmtree(target, ignore_errors=True)
        return str(reasons[0])
    staged = [detail for status, detail in outcomes if status == "staged"]
    written = {name for files, _ in staged for name, _ in files}
    if read is not None:
        for _, counted in staged:
            for key, n in counted.items():
                read[key] = read.get(key, 0) + n
    target.mkdir(parents=True, exist_ok=True)  # a plan whose ranges hold no record (markers only) stages nothing
    for leftover in [p for p in target.rglob(".*.tmp") if p.is_file()]:  # a failed attempt's, before its retry
        leftover.unlink()
    found = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}
    if found != written:  # a file no task reports (a dead attempt's), or one missing
        stray = sorted(found ^ written)[:3]
        raise TidemarkError(f"plan {plan.plan_id}: the staging folder {target} does not hold what the read tasks "
                            f"wrote ({', '.join(stray)}); nothing was published")  # fmt: skip
    return None


def _run(
    items: Iterable[tuple[int, ReadTask]], config: Mapping[str, Any] | None, stage: TaskStaging, target: str
) -> Iterator[tuple[str, Any]]:
    """A Spark task's work: stage each of its read tasks, or say why it gave way."""
    client_config = config if config is not None else from_env().client_config()
    for index, task in items:
        try:
            yield "staged", stage_task(index, task, client_config, stage, target)
        except CannotStage as exc:
            yield "gave_way", str(exc)
        except ImportError as exc:  # an executor without polars: Spark's path needs none of it
            yield "gave_way", f"an executor cannot import {exc.name}"
