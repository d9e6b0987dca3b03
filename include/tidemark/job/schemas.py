"""Registry-format feeds in the job: the run's reader and writer schemas, fetched once on the driver.

Step ``schemas`` (:func:`registry_schemas`) asks the feed's Schema Registry for each
registry-format part's schemas before anything is staged (the executors never ask it);
step ``schema_ids`` (:func:`settle_avro`) checks an Avro part's candidate writers against
the schema ids its staged records carry. :func:`schemas_report` is ``job.json``'s ``schemas``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, RecordPart
from tidemark.kafka.registry import RegistryClient, RegistryConnection, require
from tidemark.kafka.registry import from_env as registry_from_env
from tidemark.planning.plan import Plan
from tidemark.spark import avro, json_schema, protobuf
from tidemark.spark.wire import pin_planned, scan_parts
from tidemark.staged import RAW_HEAD_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tidemark.spark.decode import RunSchemas


def registry_schemas(
    spark: SparkSession, source: DataFrame, feed: Feed, client: RegistryClient
) -> dict[str, RunSchemas]:
    """The run's reader and writer schemas of each registry-format part (``key``, ``value``) of ``feed`` (with the
    readers its plan recorded pinned, :func:`registry_client`), fetched once here on the driver (the executors
    never ask the registry).

    Avro parts get their subject's candidate writers (:func:`tidemark.spark.avro.candidate_schemas`), settled
    against the staged records by :func:`settle_avro`; the other formats need the records' schema ids first:
    one aggregation over their keys and values (a read of Kafka).
    """
    found: dict[str, RunSchemas] = {}
    scanned = [p for p in feed.deserialization.registry_parts if p not in avro_parts(feed)]
    all_uses = scan_parts(source, scanned) if scanned else {}  # keys and values: one read of Kafka
    for part in feed.deserialization.registry_parts:
        fmt = feed.deserialization.part_format(part)
        if fmt == "json_schema":
            found[part] = json_schema.resolve_schemas(all_uses[part], feed, client, part=part)
        elif fmt == "protobuf":
            found[part] = protobuf.resolve_schemas(all_uses[part], feed, client, part=part)
        else:
            found[part] = avro.candidate_schemas(spark, feed, client, part=part)
    return found


def avro_parts(feed: Feed) -> list[RecordPart]:
    """The feed's registry-format parts (``key``, ``value``) in Avro."""
    return [p for p in feed.deserialization.registry_parts if feed.deserialization.part_format(p) == "avro"]


def registry_client(plan: Plan, feed: Feed, registry: RegistryConnection | None) -> tuple[RegistryClient, Feed]:
    """A client of the feed's registry, and ``feed`` with the reader versions ``plan`` recorded pinned."""
    client = RegistryClient(require(registry if registry is not None else registry_from_env(), feed.name))
    return client, pin_planned(feed, plan.readers)


def settle_avro(
    spark: SparkSession, staged: DataFrame, schemas: dict[str, RunSchemas], feed: Feed, client: RegistryClient
) -> tuple[dict[str, RunSchemas], bool]:
    """``schemas`` with each Avro part settled against the schema ids its staged records carry (one aggregation
    over the staged keys' and values' wire-format headers), and whether any part must be decoded again
    (:func:`tidemark.spark.avro.settle`, which raises when records cannot be read)."""
    from pyspark.sql import functions as F

    parts = avro_parts(feed)
    # The staged headers (the raw bytes' first five, raw_kept_aside) frame a record as its raw bytes do.
    framed = staged.select("topic", "partition", "offset", *[F.col(RAW_HEAD_COLUMNS[p]).alias(p) for p in parts])
    all_uses = scan_parts(framed, parts)
    settled, again = dict(schemas), False
    for part in parts:
        candidates = schemas[part]
        assert isinstance(candidates, avro.AvroSchemas)
        settled[part], changed = avro.settle(spark, candidates, all_uses[part], feed, client, part=part)
        again = again or changed
    return settled, again


def schemas_report(schemas: Mapping[str, RunSchemas]) -> dict[str, Any]:
    """The report's ``schemas``: the value's reader and writer ids at the top, the key's under ``key``."""
    out = schemas["value"].report() if "value" in schemas else {}
    if "key" in schemas:
        out["key"] = schemas["key"].report()
    return out
