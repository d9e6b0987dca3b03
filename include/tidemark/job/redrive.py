"""Re-drive's Spark half: dead letters through the feed's current decoding and rules, and the passing ones staged.

Each dead letter's raw record (topic, partition, offset, timestamp, key, value, headers)
goes back through the job's own decoding (:func:`tidemark.spark.decode.annotate`) and the
feed's row rules (:class:`tidemark.validation.rules.OutcomeCodes`), exactly as a run codes
a record's outcome (:func:`recheck`); the verdict is the record's new outcome: ``ok`` (it
passes now) or its new reason codes. :func:`redrive_dry_run` lists the verdicts and writes
nothing. :func:`stage_passing` stages the records that pass as the job stages a plan's
good records (one Parquet write partitioned by outcome, topic and day, with the columns
the job publishes) and hands them to the feed's publisher *pending* under the re-drive's
run id: the commit protocol's stage step. Showing them, exactly once, and recording the
re-drive as a run is :mod:`tidemark.runs.redrive`'s.

Registry-format keys and values (Avro, JSON Schema, Protobuf) are decoded with the feed's
reader schema *now* (its pinned version, else the subject's latest: a re-drive is for a
producer's or a schema's fix), their writers the schema ids the dead letters' raw bytes
carry (:func:`redrive_schemas`, asked of the registry once, on the driver, as a run's are;
Protobuf's message indexes are read as a run reads them). A writer that does not resolve
(an id the registry no longer has, another schema type, an Avro writer the reader cannot
resolve, a Protobuf message retyping a field number) leaves its dead letters failing with
a decode error naming it, and the others go on. Expectations that are not row rules (a
table's row count, say) are not re-checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, RecordPart, load_feed
from tidemark.errors import ConfigError, PublishError
from tidemark.job.stage import quarantine_writer, raw_kept_aside
from tidemark.kafka.registry import RegistryClient, RegistryConnection, require
from tidemark.kafka.registry import from_env as registry_from_env
from tidemark.output.base import Manifest, Publisher, StagedRecords
from tidemark.output.deadletters import DeadLetter, Key, dead_letters
from tidemark.output.staging import parquet_writer, spark_path, utc_date
from tidemark.planning.plan import Plan
from tidemark.spark import avro, json_schema, protobuf
from tidemark.spark.decode import annotate, raw_key_kept, raw_value_kept
from tidemark.spark.source import SCHEMA
from tidemark.spark.wire import HEADER_BYTES, MAGIC
from tidemark.staged import (
    DATE_COLUMN,
    DIGEST_COLUMNS,
    ERROR_COLUMN,
    OK_OUTCOME,
    OUTCOME_COLUMN,
    RAW_HEAD_COLUMNS,
    STAGED_PARTITION_COLUMNS,
    UNPUBLISHED_COLUMNS,
)
from tidemark.validation.rules import OutcomeCodes, column_paths

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tidemark.spark.decode import RunSchemas


@dataclass(frozen=True)
class Verdict:
    """A dead letter and what the feed's current schema and rules say of it now."""

    letter: DeadLetter
    passes: bool
    reason_codes: tuple[str, ...]  # the new reasons; empty when it passes
    reason: str = ""  # the new reason's text (``decode_error: <why>``, or the broken rules); empty when it passes


@dataclass(frozen=True)
class Recheck:
    """Dead letters re-checked: each one's verdict, and the frame the job would stage for them (``None``: none)."""

    verdicts: tuple[Verdict, ...]
    frame: DataFrame | None  # decoded, with the day and outcome columns, as the job stages a plan
    codes: OutcomeCodes | None

    @property
    def passing(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.passes)


def refuse_unsupported(feed: Feed) -> None:
    """Refuse a re-drive of a feed whose dead letters it cannot decode again or publish as they are: a masked feed's
    (its dead letters keep no raw bytes, and what it published would not be masked), a keyed table's (its late
    changes would be stale)."""
    if feed.masking is not None:
        raise ConfigError(
            f"feed '{feed.name}' masks sensitive fields (masking:): its dead letters keep masked columns and no raw "
            "bytes to decode again, so a re-drive of it is not supported; fix the producer and replay the window "
            "instead (tidemark replay)"
        )
    if feed.iceberg is not None and feed.iceberg.mode == "upsert":
        raise ConfigError(
            f"feed '{feed.name}' writes a keyed table (iceberg.mode: upsert), whose changes apply in offset order: "
            "a re-drive's changes lie behind the table ledger's ends and would all be skipped as stale, so a "
            "re-drive of it is not supported; fix the producer and send the changes again"
        )


def schema_id_of(raw: bytes | None) -> int | None:
    """The schema id in ``raw``'s wire-format header, or None when it is not framed so (null, short, another magic)."""
    if raw is None or len(raw) < HEADER_BYTES or raw[:1] != MAGIC:
        return None
    return int.from_bytes(raw[1:HEADER_BYTES], "big")


def redrive_schemas(
    spark: SparkSession, feed: Feed, letters: Sequence[DeadLetter], registry: RegistryConnection | None = None
) -> dict[str, RunSchemas]:
    """The schemas of each registry-format part (``key``, ``value``) of ``feed`` a re-drive of ``letters`` decodes
    with (:func:`current_schemas`): the reader schema now, and the writers of the schema ids their raw bytes carry;
    asked of the feed's registry (``registry``, else the environment's) here, on the driver, once. Empty for a feed
    without a registry format."""
    parts = feed.deserialization.registry_parts
    if not parts:
        return {}
    client = RegistryClient(require(registry if registry is not None else registry_from_env(), feed.name))
    found: dict[str, RunSchemas] = {}
    for part in parts:
        ids = {schema_id_of(d.value if part == "value" else d.key) for d in letters}
        found[part] = current_schemas(spark, feed, client, part, [i for i in ids if i is not None])
    return found


def current_schemas(
    spark: SparkSession, feed: Feed, client: RegistryClient, part: RecordPart, ids: Sequence[int]
) -> RunSchemas:
    """``part``'s reader schema now and the writers of ``ids``, by the part's format; a writer that does not resolve
    leaves its dead letters failing with a reason naming it, never the re-drive (each format's ``current_schemas``)."""
    fmt = feed.deserialization.part_format(part)
    if fmt == "json_schema":
        return json_schema.current_schemas(ids, feed, client, part=part)
    if fmt == "protobuf":
        return protobuf.current_schemas(ids, feed, client, part=part)
    return avro.current_schemas(spark, ids, feed, client, part=part)


def recheck(
    spark: SparkSession, feed: Feed, letters: Sequence[DeadLetter], registry: RegistryConnection | None = None
) -> Recheck:
    """``letters`` through ``feed``'s current decoding and row rules, as a run decodes and codes a plan's records
    (a registry format's with :func:`redrive_schemas`, from ``registry`` or the environment's)."""
    refuse_unsupported(feed)
    if not letters:
        return Recheck((), None, None)
    schemas = redrive_schemas(spark, feed, letters, registry)
    rows = [(d.topic, d.partition, d.offset, d.timestamp, d.timestamp_type, d.key, d.value,
             [{"key": k, "value": v} for k, v in d.headers], d.plan_id) for d in letters]  # fmt: skip
    source = spark.createDataFrame(rows, schema=SCHEMA)
    decoded = annotate(source, feed.deserialization, schemas.get("value"), schemas.get("key"))
    record_columns = [c for c in column_paths(decoded.schema) if c not in (*UNPUBLISHED_COLUMNS, "plan_id")]
    codes = OutcomeCodes.of(record_columns, feed, schemas)  # the reasons that name the schemas' fields and writers
    # As the job's decode step: the plan id stays, here, to tell the letters of two plans apart (a recreated
    # topic's offsets repeat); it is dropped before staging.
    columns = [c for c in decoded.columns if c != ERROR_COLUMN]
    frame = decoded.select(*columns, utc_date().alias(DATE_COLUMN), codes.column().alias(OUTCOME_COLUMN))
    deser = feed.deserialization
    if raw_value_kept(deser) or raw_key_kept(deser):
        frame = raw_kept_aside(frame, raw_value_kept(deser), raw_key_kept(deser))
    outcomes: Mapping[Key, str] = {
        (r["plan_id"], r["topic"], r["partition"], r["offset"]): r[OUTCOME_COLUMN]
        for r in frame.select("plan_id", "topic", "partition", "offset", OUTCOME_COLUMN).collect()
    }
    verdicts = []
    for d in letters:
        outcome = outcomes[d.key_of]
        passes = outcome == OK_OUTCOME
        verdicts.append(
            Verdict(d, passes, () if passes else codes.labels(outcome), "" if passes else codes.reason(outcome))
        )
    return Recheck(tuple(verdicts), frame, codes)


def redrive_dry_run(
    spark: SparkSession, feed: Feed | str, since: datetime | date | None = None, reason: str | None = None
) -> list[Verdict]:
    """Every dead letter of ``feed`` (filtered as :func:`dead_letters` filters) with its verdict now."""
    chosen = feed if isinstance(feed, Feed) else load_feed(feed)
    refuse_unsupported(chosen)
    return list(recheck(spark, chosen, dead_letters(chosen, since=since, reason=reason)).verdicts)


def stage_passing(
    checked: Recheck, plan: Plan, feed: Feed, publisher: Publisher, *, run_id: str, extra: Mapping[str, Any]
) -> Manifest:
    """Stage ``checked``'s passing records as plan ``plan``'s publication, pending for run ``run_id``.

    The records are written as the job writes a plan (partitioned by outcome, topic and day;
    the job's published columns), then the publisher publishes them pending: Parquet under
    ``_pending/<run id>/``, Iceberg as uploaded files and a pending record. Nothing is shown.
    """
    from pyspark.sql import functions as F

    if checked.frame is None or checked.codes is None or not checked.passing:
        raise PublishError(f"re-drive {plan.plan_id} of feed '{feed.name}': no dead letter passes; nothing to stage")
    frame = checked.frame.where(F.col(OUTCOME_COLUMN) == F.lit(OK_OUTCOME)).drop("plan_id")
    taken = {v.letter.key_of for v in checked.passing}
    spark = frame.sparkSession
    quarantined_schema = frame.drop(OUTCOME_COLUMN, *DIGEST_COLUMNS, *RAW_HEAD_COLUMNS.values()).schema
    published_schema = frame.drop(OUTCOME_COLUMN, *UNPUBLISHED_COLUMNS).schema

    def read_good(source: str) -> DataFrame:
        return spark.read.schema(published_schema).parquet(spark_path(source))

    publisher.check_schema(published_schema, plan)
    staging = publisher.new_staging(plan.plan_id)
    try:
        parquet_writer(frame, "errorifexists").partitionBy(*STAGED_PARTITION_COLUMNS).parquet(
            spark_path(staging.written_url)
        )
        return publisher.publish_staged(
            staging, plan, feed,
            staged=StagedRecords(OUTCOME_COLUMN, OK_OUTCOME, published_schema, read_good,
                                 unpublished=tuple(c for c in UNPUBLISHED_COLUMNS if c in frame.columns),
                                 write_quarantine=quarantine_writer(spark, quarantined_schema, checked.codes.reason,
                                                                    checked.codes.labels)),
            stats=[], extra=extra, expect_records=len(taken), expect_quarantined=0, run_id=run_id,
        )  # fmt: skip
    except BaseException:
        staging.discard()
        raise
