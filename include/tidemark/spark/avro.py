"""Avro values in the Schema Registry wire format: which schemas a run needs, and whether they resolve.

A value is framed as magic byte ``0``, a 4-byte big-endian schema id, then the Avro body
written with that (writer) schema. Before anything is decoded, :func:`scan_schema_ids`
runs one aggregation over the values' first five bytes: per topic, partition and schema
id the first and last offset and the count, with values of any other framing counted
apart. :func:`resolve_schemas` then asks the registry, on the driver and once per run, for
every writer schema seen and for the reader schema (the feed's pinned version of its
subject, else the subject's latest), and checks each writer against the reader with
Avro's own resolution rules (``org.apache.avro.SchemaCompatibility`` in Spark's JVM:
defaults for added fields, promotions such as int → long). Anything that would make the
run's output wrong or partial fails it here, before any write, naming the topic, the
partition, the first offset concerned and what to do: a framing Tidemark does not read,
a schema id the registry does not know, a writer schema the reader cannot resolve.

The schemas then travel inside the decoding expression (``from_avro`` per writer id with
the reader schema as its ``avroSchema``), so executors never call the registry. Spark's
``from_avro`` was chosen over fastavro in Python workers: it decodes 1.1-1.7M records/s
per core here against fastavro's 90-125k, and it maps Avro's logical types (decimal,
date, timestamp) and enums onto Spark types itself. It needs the ``spark-avro`` package
(:data:`tidemark.spark.session.AVRO_PACKAGE`) on the driver's and executors' class path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed
from tidemark.errors import SchemaError, SchemaNotFoundError
from tidemark.kafka.registry import RegistryClient

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

MAGIC = "00"  # the wire format's first byte, as Spark's hex() spells it
HEADER_BYTES = 5
# from_avro's PERMISSIVE mode turns a body that does not decode into a struct of nulls, which a record of
# nullable fields can also be. Decoding uses the reader schema plus this field (boolean, default true): no
# writer has it, so every record that decodes gets true by resolution, and only a failed one gets null.
DECODED_MARK = "_tidemark_decoded"


@dataclass(frozen=True)
class SchemaUse:
    """The records of one partition written with one schema id (``schema_id`` None: not framed as the wire format)."""

    topic: str
    partition: int
    schema_id: int | None
    first_offset: int
    last_offset: int
    records: int


@dataclass(frozen=True)
class AvroSchemas:
    """What decoding a run's Avro values needs: the reader schema and every writer schema seen."""

    subject: str
    version: int
    reader_id: int
    reader: str
    writers: Mapping[int, str]
    seen: tuple[SchemaUse, ...] = ()
    events: tuple[dict[str, Any], ...] = field(default=())

    @property
    def field_names(self) -> list[str]:
        return [str(f["name"]) for f in json.loads(self.reader)["fields"]]

    @property
    def marked_reader(self) -> str:
        """The reader schema with :data:`DECODED_MARK` added, what ``from_avro`` resolves each writer to."""
        doc = json.loads(self.reader)
        doc["fields"] = [*doc["fields"], {"name": DECODED_MARK, "type": "boolean", "default": True}]
        return json.dumps(doc)

    def report(self) -> dict[str, Any]:
        """The report's ``schemas``: the reader schema's subject, version and id, and the ids seen per partition."""
        return {
            "format": "avro",
            "reader": {"subject": self.subject, "version": self.version, "id": self.reader_id},
            "writer_ids": sorted(self.writers),
            "seen": [asdict(u) for u in self.seen],
        }


def schema_id_column() -> Column:
    """The value's schema id (bytes 2-5, big-endian), null when the value is not framed as the wire format."""
    from pyspark.sql import functions as F

    value = F.col("value")
    framed = (F.length(value) >= HEADER_BYTES) & (F.hex(F.substring(value, 1, 1)) == MAGIC)
    return F.when(framed, F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long"))


def scan_schema_ids(df: DataFrame) -> list[SchemaUse]:
    """One aggregation over the non-null values' first five bytes: who was written with which schema id."""
    from pyspark.sql import functions as F

    rows = (
        df.where(F.col("value").isNotNull())
        .select("topic", "partition", "offset", schema_id_column().alias("schema_id"))
        .groupBy("topic", "partition", "schema_id")
        .agg(F.min("offset").alias("first"), F.max("offset").alias("last"), F.count(F.lit(1)).alias("n"))
        .collect()
    )
    uses = [
        SchemaUse(r["topic"], int(r["partition"]), None if r["schema_id"] is None else int(r["schema_id"]),
                  int(r["first"]), int(r["last"]), int(r["n"]))
        for r in rows
    ]  # fmt: skip
    return sorted(uses, key=lambda u: (u.topic, u.partition, u.first_offset))


def _where(use: SchemaUse) -> str:
    return f"{use.topic}[{use.partition}] offset {use.first_offset}"


def resolve_schemas(spark: SparkSession, uses: list[SchemaUse], feed: Feed, client: RegistryClient) -> AvroSchemas:
    """The reader schema and every writer schema of ``uses``; raises :class:`SchemaError` when one does not resolve."""
    deser = feed.deserialization
    for use in uses:
        if use.schema_id is None:
            raise SchemaError(
                f"{_where(use)}: {use.records} records in offsets [{use.first_offset}, {use.last_offset}] are not in "
                "the Schema Registry wire format (magic byte 0, a 4-byte schema id, the Avro body); Tidemark "
                "cannot tell their schema. Fix the producer's serializer, or move the group past them; nothing "
                "was published or committed"
            )
    subject = deser.reader_subject(feed.topics)
    try:
        reader = client.version(subject, deser.schema_version)
    except SchemaNotFoundError as exc:
        raise SchemaError(
            f"feed '{feed.name}': the reader schema is missing: {exc}. Register the subject's schema, or fix "
            "deserialization.subject / schema_version; nothing was published or committed"
        ) from None
    reader_doc = json.loads(reader.schema)
    if not isinstance(reader_doc, dict) or reader_doc.get("type") != "record":
        raise SchemaError(
            f"feed '{feed.name}': the reader schema (subject '{subject}' version {reader.version}, id "
            f"{reader.schema_id}) is not an Avro record; Tidemark publishes a record's fields as columns"
        )
    from tidemark.spark.decode import RESERVED_COLUMNS

    clash = sorted({str(f["name"]) for f in reader_doc["fields"]} & RESERVED_COLUMNS)
    if clash:
        raise SchemaError(
            f"feed '{feed.name}': the reader schema (subject '{subject}' version {reader.version}) has fields "
            f"{clash}, which clash with Tidemark's record columns; pin a schema_version without them"
        )
    writers: dict[int, str] = {}
    first_use: dict[int, SchemaUse] = {}
    for use in uses:
        sid = int(use.schema_id)  # type: ignore[arg-type]  # unframed uses were refused above
        first_use.setdefault(sid, use)
        if sid in writers:
            continue
        try:
            writers[sid] = client.schema_by_id(sid)
        except SchemaNotFoundError:
            raise SchemaError(
                f"{_where(use)}: schema id {sid} is unknown to the schema registry "
                f"({client.connection.describe()['url']}); "
                f"{use.records} records of this partition up to offset {use.last_offset} carry it. Check that the "
                "feed's registry connection points at the registry the producers use; nothing was published or "
                "committed"
            ) from None
    for sid, writer in writers.items():
        problem = _incompatibility(spark, reader.schema, writer)
        if problem is not None:
            use = first_use[sid]
            raise SchemaError(
                f"{_where(use)}: records written with schema id {sid} cannot be read with the reader schema id "
                f"{reader.schema_id} (subject '{subject}' version {reader.version}): {problem}. Pin a "
                "deserialization.schema_version that resolves every writer, or make the change compatible (give an "
                "added field a default, widen rather than narrow a type); nothing was published or committed"
            )
    return AvroSchemas(
        subject=subject, version=reader.version, reader_id=reader.schema_id, reader=reader.schema,
        writers=writers, seen=tuple(uses), events=tuple(schema_changed_events(uses, reader.schema_id)),
    )  # fmt: skip


def _incompatibility(spark: SparkSession, reader: str, writer: str) -> str | None:
    """Why Avro cannot resolve ``writer`` to ``reader`` (the field and the rule), or None when it can."""
    jvm = spark.sparkContext._jvm  # Avro ships with Spark: its own resolution rules, not a copy of them
    assert jvm is not None
    avro = jvm.org.apache.avro
    result = avro.SchemaCompatibility.checkReaderWriterCompatibility(
        avro.Schema.Parser().parse(reader), avro.Schema.Parser().parse(writer)
    ).getResult()
    if str(result.getCompatibility().toString()) == "COMPATIBLE":
        return None
    reasons = []
    for item in result.getIncompatibilities():
        location = str(item.getLocation())
        reasons.append(f"field {location!r}: {item.getType().toString()} ({item.getMessage()})")
    return "; ".join(reasons) or "incompatible"


def schema_changed_events(uses: list[SchemaUse], reader_id: int) -> list[dict[str, Any]]:
    """A ``schema_changed`` event wherever a partition's records switch to another writer schema id."""
    events: list[dict[str, Any]] = []
    by_partition: dict[tuple[str, int], list[SchemaUse]] = {}
    for use in uses:
        by_partition.setdefault((use.topic, use.partition), []).append(use)
    for (topic, partition), group in sorted(by_partition.items()):
        ordered = sorted(group, key=lambda u: u.first_offset)
        for before, after in pairwise(ordered):
            events.append({
                "kind": "schema_changed", "topic": topic, "partition": partition,
                "message": (
                    f"{topic}[{partition}]: from offset {after.first_offset} records are written with schema id "
                    f"{after.schema_id} (before: {before.schema_id}); both resolved to the reader schema id {reader_id}"
                ),
                "details": {"offset": after.first_offset, "from_schema_id": before.schema_id,
                            "to_schema_id": after.schema_id, "reader_schema_id": reader_id},
            })  # fmt: skip
    return events


def decoded_value(schemas: AvroSchemas) -> Column:
    """The value decoded with its writer schema and resolved to the reader's: a struct whose :data:`DECODED_MARK`
    is true where it decoded and null where it did not (see :func:`decode_failed`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    body = F.expr(f"substr(value, {HEADER_BYTES + 1})")
    header = F.substring(F.col("value"), 1, HEADER_BYTES)
    options = {"avroSchema": schemas.marked_reader, "mode": "PERMISSIVE"}
    out: Column | None = None
    # Nulls only (no writer seen): decode with the reader itself, so the column still has the reader's type.
    writers = schemas.writers or {schemas.reader_id: schemas.reader}
    for writer_id, writer in sorted(writers.items()):
        decoded = from_avro(body, writer, options)
        # The five header bytes compared as bytes: no hex text and number parsing per record and writer.
        framed = header == F.lit(bytes.fromhex(MAGIC) + writer_id.to_bytes(4, "big"))
        out = F.when(framed, decoded) if out is None else out.when(framed, decoded)
    assert out is not None
    # Returned as is, not nulled where the mark is missing: that wraps the whole CASE in another one naming it
    # twice, and Spark then decodes every value twice (a third slower, measured with the Avro benchmark).
    return out


def decode_failed(decoded: Column) -> Column:
    """Whether the value of :func:`decoded_value` did not decode (its mark is missing; null values included)."""
    return decoded.getField(DECODED_MARK).isNull()
