"""What the Schema Registry formats beside Avro (``json_schema``, ``protobuf``) share before decoding.

The values are framed as Avro's are (magic byte ``0``, a 4-byte schema id, the body), so
the schema ids a run holds come from the same one aggregation
(:func:`tidemark.spark.avro.scan_schema_ids`). On the driver and once per run this module
refuses values of another framing, fetches the reader schema (the feed's pinned
``schema_version`` of its subject, else the subject's latest) and every writer schema
seen, and fails the run, naming the topic, partition and first offset concerned, when
an id is unknown to the registry or registered as another schema type. An unreachable
registry raises :class:`~tidemark.errors.RegistryUnavailableError` from the client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from tidemark.config.models import Feed
from tidemark.errors import SchemaError, SchemaNotFoundError
from tidemark.kafka.registry import RegistryClient, SubjectVersion
from tidemark.spark.avro import SchemaUse

# The registry's name for each feed format's schemas.
SCHEMA_TYPES = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}
W = TypeVar("W")


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

    def report(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "reader": {"subject": self.subject, "version": self.version, "id": self.reader_id},
            "writer_ids": sorted(self.writer_ids),
            "seen": [asdict(u) for u in self.seen],
        }


def where(use: SchemaUse) -> str:
    return f"{use.topic}[{use.partition}] offset {use.first_offset}"


def refuse_unframed(uses: list[SchemaUse], body: str) -> None:
    """A :class:`SchemaError` for the first records not in the wire format (magic byte 0, a 4-byte id, ``body``)."""
    for use in uses:
        if use.schema_id is None:
            raise SchemaError(
                f"{where(use)}: {use.records} records in offsets [{use.first_offset}, {use.last_offset}] are not in "
                f"the Schema Registry wire format (magic byte 0, a 4-byte schema id, {body}); Tidemark cannot tell "
                "their schema. Fix the producer's serializer, or move the group past them; nothing was published "
                "or committed"
            )


def reader_version(feed: Feed, client: RegistryClient, fmt: str | None = None) -> SubjectVersion:
    """The reader schema: the feed's pinned version of its subject, else the latest; of the feed's format."""
    deser = feed.deserialization
    subject = deser.reader_subject(feed.topics)
    try:
        reader = client.typed_version(subject, deser.schema_version, fmt)
    except SchemaNotFoundError as exc:
        raise SchemaError(
            f"feed '{feed.name}': the reader schema is missing: {exc}. Register the subject's schema, or fix "
            "deserialization.subject / schema_version; nothing was published or committed"
        ) from None
    expected = SCHEMA_TYPES[deser.format]
    if reader.schema_type != expected:
        raise SchemaError(
            f"feed '{feed.name}': the reader schema (subject '{subject}' version {reader.version}, id "
            f"{reader.schema_id}) is a {reader.schema_type} schema, not {expected}; fix deserialization.format "
            "or deserialization.subject"
        )
    return reader


def writer_schemas(
    uses: list[SchemaUse], feed: Feed, client: RegistryClient, fetch: Callable[[int], tuple[str, W]]
) -> tuple[dict[int, W], dict[int, SchemaUse]]:
    """Every writer schema id of ``uses`` through ``fetch`` (id → its schema type and what the format needs),
    with the first use of each; unknown ids and ids of another schema type fail the run."""
    expected = SCHEMA_TYPES[feed.deserialization.format]
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
                f"{use.last_offset} carry it. Check that the feed's registry connection points at the registry the "
                "producers use; nothing was published or committed"
            ) from None
        if schema_type != expected:
            raise SchemaError(
                f"{where(use)}: schema id {sid} is a {schema_type} schema, and feed '{feed.name}' reads "
                f"{feed.deserialization.format} ({expected}) values; fix deserialization.format, or move the group "
                "past these records; nothing was published or committed"
            )
    return writers, first_use


def check_columns(feed: Feed, reader: SubjectVersion, names: Mapping[str, Any]) -> None:
    """The reader's top-level fields become columns: none may take the name of a record column."""
    from tidemark.spark.decode import RESERVED_COLUMNS

    clash = sorted(set(names) & RESERVED_COLUMNS)
    if clash:
        raise SchemaError(
            f"feed '{feed.name}': the reader schema (subject '{reader.subject}' version {reader.version}) has fields "
            f"{clash}, which clash with Tidemark's record columns; pin a schema_version without them"
        )
