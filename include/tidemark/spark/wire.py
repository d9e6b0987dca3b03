"""The Schema Registry wire format, one module for the three registry formats (``avro``, ``json_schema``, ``protobuf``).

A key or value is framed as magic byte ``0``, a 4-byte big-endian schema id, then the
body (Avro, a JSON document, or Protobuf's message indexes and message). :func:`scan_parts`
runs one aggregation over the first five bytes of the key, the value or both: per topic,
partition and schema id the first and last offset and the count, with keys or values of
any other framing counted apart (JSON Schema and Protobuf parts are scanned before they are
decoded; Avro parts after staging, over their staged headers, :func:`tidemark.spark.avro.settle`).
On the driver and once per run each format's ``resolve_schemas`` then calls, in this order,
:func:`refuse_unframed` (another framing fails the run), :func:`reader_version` (the reader
schema: the feed's pinned version of its subject, else the subject's latest, checked to be
of the format's schema type), :func:`check_columns` (a value reader's fields may not take a
record column's name, :data:`tidemark.staged.RESERVED_COLUMNS`) and
:func:`writer_schemas` (every writer schema id seen; an id unknown to the registry, or
registered as another schema type, fails the run), each naming the topic, partition and
first offset concerned, and gathers the :func:`schema_changed_events` of partitions written
with several ids into its :class:`RegistrySchemas`. An unreachable registry raises
:class:`~tidemark.errors.RegistryUnavailableError` from the client. At planning,
:func:`planned_readers` records the reader versions the feed does not pin, and
:func:`pin_planned` pins them for every attempt of the plan. Decoding finds the body with
:func:`body` and each writer's records with :func:`header`. The pipeline imports this module
to plan, where no Spark runs, so ``pyspark`` is imported inside the functions that build columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, TypeVar

from tidemark.config.models import Feed, RecordPart
from tidemark.errors import SchemaError, SchemaNotFoundError
from tidemark.kafka.registry import RegistryClient, SubjectVersion
from tidemark.planning.plan import Event
from tidemark.staged import RESERVED_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

MAGIC = b"\x00"  # the wire format's first byte
HEADER_BYTES = 5  # the magic byte and the 4-byte schema id
# The registry's name for each feed format's schemas.
SCHEMA_TYPES = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}
W = TypeVar("W")


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
class RegistrySchemas:
    """The reader schema's coordinates, and the writer schema ids seen, for the run's report."""

    format: str
    subject: str
    version: int
    reader_id: int
    writer_ids: tuple[int, ...]
    seen: tuple[SchemaUse, ...] = ()
    events: tuple[dict[str, Any], ...] = field(default=())

    @property
    def field_names(self) -> list[str]:
        """The reader's top-level fields, which a value publishes as columns; each format's schemas know them."""
        raise NotImplementedError(f"{type(self).__name__} does not name its reader's fields")

    def report(self) -> dict[str, Any]:
        """The report's ``schemas``: the reader schema's subject, version and id, and the ids seen per partition."""
        return {
            "format": self.format,
            "reader": {"subject": self.subject, "version": self.version, "id": self.reader_id},
            "writer_ids": sorted(self.writer_ids),
            "seen": [asdict(u) for u in self.seen],
        }


def header(schema_id: int) -> bytes:
    """The five bytes a record written with ``schema_id`` starts with."""
    return MAGIC + schema_id.to_bytes(4, "big")


def body(column: str = "value") -> Column:
    """The bytes of ``column`` after the wire format's five-byte header."""
    from pyspark.sql import functions as F

    return F.expr(f"substr(`{column}`, {HEADER_BYTES + 1})")


def framed_header(column: str = "value") -> Column:
    """The first five bytes of ``column`` when it is framed as the wire format (magic byte ``0`` and a 4-byte id),
    empty bytes when it is not, null when it is null."""
    from pyspark.sql import functions as F

    raw = F.col(column)
    framed = (F.length(raw) >= HEADER_BYTES) & (F.substring(raw, 1, 1) == F.lit(MAGIC))
    return F.when(framed, F.substring(raw, 1, HEADER_BYTES)).when(raw.isNotNull(), F.lit(b""))


def scan_schema_ids(df: DataFrame, column: str = "value") -> list[SchemaUse]:
    """One aggregation over the non-null ``column``'s first five bytes: who was written with which schema id."""
    return scan_parts(df, (column,))[column]


def scan_parts(df: DataFrame, columns: Sequence[str]) -> dict[str, list[SchemaUse]]:
    """:func:`scan_schema_ids` of each of ``columns`` (``key``, ``value``) in one aggregation: one read of ``df``.

    The records are grouped by their headers' bytes, which become schema ids once per group on the driver
    (parsing each record's id in Spark was most of the scan's cost).
    """
    from pyspark.sql import functions as F

    if len(columns) == 1:  # no array to explode
        (column,) = columns
        headers = df.select("topic", "partition", "offset", F.lit(column).alias("part"),
                            framed_header(column).alias("header"))  # fmt: skip
    else:
        entries = F.array(*[
            F.when(F.col(c).isNotNull(), F.struct(F.lit(c).alias("part"), framed_header(c).alias("header")))
            for c in columns
        ])  # fmt: skip
        headers = df.select("topic", "partition", "offset", F.explode(entries).alias("e")).select(
            "topic", "partition", "offset", "e.part", "e.header"
        )
    rows = (
        headers.where(F.col("header").isNotNull())
        .groupBy("topic", "partition", "part", "header")
        .agg(F.min("offset").alias("first"), F.max("offset").alias("last"), F.count(F.lit(1)).alias("n"))
        .collect()
    )
    found: dict[str, list[SchemaUse]] = {c: [] for c in columns}
    for r in rows:
        header = bytes(r["header"])
        found[r["part"]].append(
            SchemaUse(r["topic"], int(r["partition"]), int.from_bytes(header[1:], "big") if header else None,
                      int(r["first"]), int(r["last"]), int(r["n"]))
        )  # fmt: skip
    return {c: sorted(uses, key=lambda u: (u.topic, u.partition, u.first_offset)) for c, uses in found.items()}


def where(use: SchemaUse) -> str:
    return f"{use.topic}[{use.partition}] offset {use.first_offset}"


def option(part: RecordPart, name: str) -> str:
    """The feed's ``deserialization`` option ``name`` (``format``, ``subject``, ``schema_version``) for ``part``."""
    return name if part == "value" else f"key_{name}"


def reader_name(part: RecordPart) -> str:
    return "the reader schema" if part == "value" else "the key's reader schema"


def refuse_unframed(uses: list[SchemaUse], body: str, part: RecordPart = "value") -> None:
    """A :class:`SchemaError` for the first records whose ``part`` is not in the wire format (magic byte 0, a 4-byte
    id, ``body``)."""
    for use in uses:
        if use.schema_id is None:
            raise SchemaError(
                f"{where(use)}: {use.records} records in offsets [{use.first_offset}, {use.last_offset}] have "
                f"{part}s not in the Schema Registry wire format (magic byte 0, a 4-byte schema id, {body}); Tidemark "
                "cannot tell their schema. Fix the producer's serializer, or move the group past them; nothing was "
                "published or committed"
            )


def reader_version(
    feed: Feed, client: RegistryClient, fmt: str | None = None, part: RecordPart = "value"
) -> SubjectVersion:
    """The reader schema of ``part``: the feed's pinned version of its subject, else the latest; of its format."""
    deser = feed.deserialization
    subject = deser.reader_subject(feed.topics, part)
    try:
        reader = client.typed_version(subject, deser.reader_version(part), fmt)
    except SchemaNotFoundError as exc:
        raise SchemaError(
            f"feed '{feed.name}': {reader_name(part)} is missing: {exc}. Register the subject's schema, or fix "
            f"deserialization.{option(part, 'subject')} / {option(part, 'schema_version')}; nothing was published or "
            "committed"
        ) from None
    expected = SCHEMA_TYPES[deser.part_format(part)]
    if reader.schema_type != expected:
        raise SchemaError(
            f"feed '{feed.name}': {reader_name(part)} (subject '{subject}' version {reader.version}, id "
            f"{reader.schema_id}) is a {reader.schema_type} schema, not {expected}; fix "
            f"deserialization.{option(part, 'format')} or deserialization.{option(part, 'subject')}"
        )
    return reader


def writer_schemas(
    uses: list[SchemaUse],
    feed: Feed,
    client: RegistryClient,
    fetch: Callable[[int], tuple[str, W]],
    part: RecordPart = "value",
) -> tuple[dict[int, W], dict[int, SchemaUse]]:
    """Every writer schema id of ``uses`` through ``fetch`` (id → its schema type and what the format needs),
    with the first use of each; unknown ids and ids of another schema type fail the run."""
    fmt = feed.deserialization.part_format(part)
    expected = SCHEMA_TYPES[fmt]
    writers: dict[int, W] = {}
    first_use: dict[int, SchemaUse] = {}
    for use in uses:
        sid = int(use.schema_id)  # type: ignore[arg-type]  # refuse_unframed ran first
        first_use.setdefault(sid, use)
        if sid in writers:
            continue
        try:
            schema_type, writers[sid] = fetch(sid)
        except SchemaNotFoundError:
            raise SchemaError(
                f"{where(use)}: schema id {sid} is unknown to the schema registry "
                f"({client.connection.describe()['url']}); {use.records} records of this partition up to offset "
                f"{use.last_offset} carry it in their {part}. Check that the feed's registry connection points at the "
                "registry the producers use; nothing was published or committed"
            ) from None
        if schema_type != expected:
            raise SchemaError(
                f"{where(use)}: schema id {sid} is a {schema_type} schema, and feed '{feed.name}' reads "
                f"{fmt} ({expected}) {part}s; fix deserialization.{option(part, 'format')}, or move the group past "
                "these records; nothing was published or committed"
            )
    return writers, first_use


def current_writers(
    ids: Iterable[int],
    feed: Feed,
    fetch: Callable[[int], tuple[str, W]],
    part: RecordPart = "value",
) -> tuple[dict[int, W], dict[int, str]]:
    """A re-drive's :func:`writer_schemas`: each of ``ids`` through ``fetch``, where nothing fails. An id the
    registry does not have, one of another schema type, or one ``fetch`` refuses (a :class:`SchemaError`: a file
    that does not resolve, say) is returned apart with the reason its records fail (:func:`unresolved_reason`):
    its dead letters stay, they do not fail the re-drive of the others."""
    expected = SCHEMA_TYPES[feed.deserialization.part_format(part)]
    writers: dict[int, W] = {}
    unresolved: dict[int, str] = {}
    for sid in sorted(set(ids)):
        try:
            schema_type, found = fetch(sid)
        except SchemaNotFoundError:
            unresolved[sid] = unresolved_reason(part, sid, "which the schema registry does not have")
            continue
        except SchemaError as exc:
            unresolved[sid] = unresolved_reason(part, sid, f"which does not resolve ({str(exc)[:200]})")
            continue
        if schema_type != expected:
            unresolved[sid] = unresolved_reason(part, sid, f"registered as {schema_type}, not {expected}")
        else:
            writers[sid] = found
    return writers, unresolved


def unresolved_reason(part: RecordPart, schema_id: int, why: str) -> str:
    """Why a re-drive's record of ``part`` written with ``schema_id`` does not decode: its writer does not resolve."""
    return f"{part} was written with schema id {schema_id}, {why}"


def version_of(client: RegistryClient, subject: str, schema_id: int) -> str:
    """`` (version N of subject S)`` when ``schema_id`` is a version of the reader's ``subject``, else nothing; asked
    only when a run is refused, so a question per version costs nothing that matters."""
    for version in reversed(client.versions(subject)[-100:]):
        if client.typed_version(subject, version).schema_id == schema_id:
            return f" (version {version} of subject '{subject}')"
    return ""


def check_columns(feed: Feed, reader: SubjectVersion, names: Mapping[str, Any]) -> None:
    """The value reader's top-level fields become columns: none may take the name of a record column."""
    clash = sorted(set(names) & RESERVED_COLUMNS)
    if clash:
        raise SchemaError(
            f"feed '{feed.name}': the reader schema (subject '{reader.subject}' version {reader.version}) has fields "
            f"{clash}, which clash with Tidemark's record columns; pin a schema_version without them"
        )


def schema_changed_events(uses: list[SchemaUse], reader_id: int, part: RecordPart = "value") -> list[dict[str, Any]]:
    """A ``schema_changed`` event per partition whose ``part`` was written with more than one schema id.

    Its ``writers`` detail lists, per writer id, the first and last offset written with it and the count (the
    scan's figures, not every switch: a busy topic's producers may switch thousands of times); writers whose
    ranges overlap are ``interleaved`` (producers switching back and forth). ``offset``, ``from_schema_id`` and
    ``to_schema_id`` name the first switch, the offset where the second writer's records begin.
    """
    events: list[dict[str, Any]] = []
    by_partition: dict[tuple[str, int], list[SchemaUse]] = {}
    for use in uses:
        by_partition.setdefault((use.topic, use.partition), []).append(use)
    whose = "records" if part == "value" else "keys"
    for (topic, partition), group in sorted(by_partition.items()):
        ordered = sorted(group, key=lambda u: u.first_offset)
        if len(ordered) < 2:
            continue
        interleaved = any(after.first_offset <= before.last_offset for before, after in pairwise(ordered))
        ranges = ", ".join(
            f"id {u.schema_id} at offsets {u.first_offset}..{u.last_offset} ({u.records} {whose})" for u in ordered
        )
        overlap = "; their offsets overlap: the producers switched back and forth" if interleaved else ""
        events.append(Event(
            "schema_changed",
            f"{topic}[{partition}]: {whose} written with {len(ordered)} schema ids, all resolved to the reader "
            f"schema id {reader_id}: {ranges}{overlap}",
            topic=topic, partition=partition,
            details={
                "offset": ordered[1].first_offset, "from_schema_id": ordered[0].schema_id,
                "to_schema_id": ordered[1].schema_id, "reader_schema_id": reader_id, "part": part,
                "interleaved": interleaved,
                "writers": [{"schema_id": u.schema_id, "first_offset": u.first_offset, "last_offset": u.last_offset,
                             "records": u.records} for u in ordered],
            },
        ).to_dict())  # fmt: skip
    return events


def planned_readers(feed: Feed, client: RegistryClient) -> dict[str, dict[str, Any]]:
    """The reader schema of each registry-format part whose version the feed does not pin: the subject's latest
    version now, for the plan (:attr:`tidemark.planning.plan.Plan.readers`)."""
    out: dict[str, dict[str, Any]] = {}
    for part in feed.deserialization.registry_parts:
        if feed.deserialization.reader_version(part) is None:
            reader = reader_version(feed, client, part=part)
            out[part] = {"subject": reader.subject, "version": reader.version, "id": reader.schema_id}
    return out


def pin_planned(feed: Feed, readers: Mapping[str, Mapping[str, Any]]) -> Feed:
    """``feed`` with the reader versions its plan recorded pinned, so that every attempt of the plan decodes with
    the reader of its planning; a part the feed pins itself, or whose subject changed since, is left alone."""
    deser = feed.deserialization
    update: dict[str, int] = {}
    for part in deser.registry_parts:
        planned = readers.get(part)
        same_subject = planned is not None and planned["subject"] == deser.reader_subject(feed.topics, part)
        if planned and same_subject and deser.reader_version(part) is None:
            update[option(part, "schema_version")] = int(planned["version"])
    if not update:
        return feed
    return feed.model_copy(update={"deserialization": deser.model_copy(update=update)})
