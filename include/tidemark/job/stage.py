"""How the job writes a plan's records into staging, checks what it wrote, and writes a quarantine.

One write stages every record (step ``write``): Spark's Parquet writer, partitioned by
:data:`tidemark.staged.STAGED_PARTITION_COLUMNS` and observed as it reads
(:func:`counting_reads`), or, for Avro values they decode, the read tasks themselves
(:func:`stage_in_read_tasks`). Either way the rows staged must equal the records the reader
produced, per partition (:func:`check_staged_counts`). Where decoded columns lose the bytes
Kafka holds, each record keeps a digest of its raw bytes and, when bad, the bytes
themselves (:func:`raw_kept_aside`). :func:`quarantine_writer` rewrites bad outcome folders
with their full reason.
"""

from __future__ import annotations

import functools
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tidemark._types import TopicPartition as TP
from tidemark.config.models import Feed, RecordPart
from tidemark.errors import PublishError
from tidemark.kafka.connection import KafkaConnection
from tidemark.output.base import Publisher
from tidemark.output.staging import Staging, parquet_writer, spark_path, stages_on_store
from tidemark.planning.plan import Plan
from tidemark.spark import arrow_avro
from tidemark.spark.arrow_plain import PlainPlan
from tidemark.spark.avro import AvroSchemas
from tidemark.spark.masking import split_raw
from tidemark.spark.session import configure_s3a
from tidemark.spark.stats import masked_row_digest, row_digest
from tidemark.spark.wire import HEADER_BYTES
from tidemark.staged import (
    DATE_COLUMN,
    DIGEST_COLUMNS,
    OK_OUTCOME,
    OUTCOME_COLUMN,
    PARTITION_COLUMNS,
    PASS_DIR,
    RAW_HEAD_COLUMNS,
    RAW_KEY_COLUMN,
    RAW_VALUE_COLUMN,
    READ_BY_DATA_SOURCE,
    REASON_CODES_COLUMN,
    REASON_COLUMN,
    STAGED_PARTITION_COLUMNS,
    UNPUBLISHED_COLUMNS,
    Reader,
    reason_codes,
)
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from tidemark.spark.decode import RunSchemas


def counting_reads(source: DataFrame, plan: Plan) -> tuple[DataFrame, Callable[[], dict[TP, int]]]:
    """``source`` observed as Spark reads it: how many records the reader produced per partition of ``plan``.

    The counts come from the executors with the write's own job (Spark's observed metrics),
    so they say what was read, whatever then reached the staging folder.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    keys = [p.key for p in plan.partitions if p.end > p.start]
    observation = Observation(f"tidemark-read-{uuid.uuid4().hex[:8]}")
    hit = F.lit(1)
    metrics = [F.sum(F.when((F.col("topic") == t) & (F.col("partition") == n), hit).otherwise(0)).alias(f"r{i}")
               for i, (t, n) in enumerate(keys)]  # fmt: skip
    if not metrics:
        return source, dict
    observed = source.observe(observation, *metrics)

    def counts() -> dict[TP, int]:
        got = observation.get
        return {key: int(got.get(f"r{i}") or 0) for i, key in enumerate(keys)}

    return observed, counts


def check_staged_counts(plan: Plan, read: Mapping[TP, int], staged: DataFrame, where: str) -> None:
    """Refuse a plan whose staged rows differ from the records the reader produced, per partition.

    The broker explains records missing from a range (compaction, transaction markers,
    aborted records): the reader never produces those. A record it produced and the staging
    folder lacks is lost between the executors and the driver (a staging folder the
    executors do not share, a file removed), and a surplus is a stray file: either fails.
    """
    from pyspark.sql import functions as F

    rows = staged.groupBy("topic", "partition").agg(F.count(F.lit(1)).alias("n")).collect()
    have = {(str(r["topic"]), int(r["partition"])): int(r["n"]) for r in rows}
    wrong = [f"{p.topic}[{p.partition}] [{p.start}, {p.end}): read {read.get(p.key, 0)}, staged {have.get(p.key, 0)}"
             for p in plan.partitions if read.get(p.key, 0) != have.get(p.key, 0)]  # fmt: skip
    if wrong:
        raise PublishError(
            f"plan {plan.plan_id}: the rows staged in {where} differ from the records the reader produced "
            f"({'; '.join(wrong)}). Nothing was published and offsets were not committed. If the executors run on "
            "other machines, the staging folder must be shared with them (TIDEMARK_STAGING_DIR on a shared mount, or "
            "staging on the object store); rerun once it is"
        )


def stage_in_read_tasks(
    spark: SparkSession,
    plan: Plan,
    feed: Feed,
    connection: KafkaConnection | None,
    staged_df: DataFrame,
    schemas: Mapping[str, RunSchemas],
    staging: Staging,
    reader: Reader | None,
    read: dict[TP, int] | None = None,
) -> StructType | None:
    """Stage the plan's records in the read tasks (:mod:`tidemark.spark.arrow_avro`) when they can; the staged
    files' schema, or None (nothing staged: Spark's write stages them). ``reader``: who reads the plan.

    They can for an Avro value whose schemas that module decodes, and for a raw, text or JSON
    value with declared fields (:mod:`tidemark.spark.arrow_plain`), with a text or bytes key, read by the data
    source, with no exact window and no masking, into a staging folder the driver shares with the executors. Every
    record that decodes is staged as ``ok``, as ``staged_df`` lays it out, with its raw value
    in place of its digest (JSON, Avro); when validation then finds records the feed's row rules
    quarantine, the job stages the plan again with Spark (step ``write_again``), which codes
    each record's outcome. A task that meets a record it does not stage (one that does not
    decode, say) gives way, and Spark stages the whole plan instead; the reason is printed.
    ``TIDEMARK_READ_TASK_STAGING=0`` leaves every plan to Spark.
    """
    from pyspark.sql.types import StructType

    if not (
        os.environ.get(arrow_avro.SWITCH_ENV, "1").strip() != "0"
        and reader == READ_BY_DATA_SOURCE and plan.time_filter is None and staging.remote is None
    ):  # fmt: skip
        return None
    if feed.masking is not None:
        print("tidemark job: staging with Spark: the feed masks sensitive fields (Spark's column functions)",
              file=sys.stderr)  # fmt: skip
        return None
    columns = StructType([f for f in staged_df.schema.fields if f.name not in DIGEST_COLUMNS])
    stage = _task_staging(feed, schemas, columns)
    if isinstance(stage, str):
        print(f"tidemark job: staging with Spark: {stage}", file=sys.stderr)
        return None
    gave_way = arrow_avro.stage_in_tasks(spark, plan, connection, stage, staging.root / PASS_DIR, read)
    if gave_way is not None:
        print(f"tidemark job: the read tasks gave way to Spark's write: {gave_way}", file=sys.stderr)
        return None
    return columns


def _task_staging(feed: Feed, schemas: Mapping[str, RunSchemas], columns: StructType) -> arrow_avro.TaskStaging | str:
    """How the read tasks stage ``feed``'s records as ``columns``: a flat Avro value's plan
    (:mod:`tidemark.spark.arrow_avro`), a raw, text or JSON value's (:mod:`tidemark.spark.arrow_plain`); or why not."""
    value = schemas.get("value")
    if "key" in schemas:
        return "the key is in a Schema Registry format, which only Spark's decoder reads"
    if isinstance(value, AvroSchemas) and RAW_VALUE_COLUMN in columns.fieldNames():
        return read_task_stage_plan(value, columns, tombstones=feed.tombstones_are_changes)
    if value is not None:
        return f"the read tasks do not decode {value.format} values"
    return PlainPlan.of(
        feed.deserialization, columns, partition_columns=STAGED_PARTITION_COLUMNS, ok=OK_OUTCOME,
        raw_value=RAW_VALUE_COLUMN, tombstones=feed.tombstones_are_changes,
    )  # fmt: skip


def read_task_stage_plan(
    value: AvroSchemas, columns: StructType, *, tombstones: bool = False
) -> arrow_avro.StagePlan | str:
    """How the read tasks stage records as ``columns`` (the job's staged columns, raw value in place of digests)
    from ``value``'s schemas, or why they cannot; ``tombstones``: a null value is a change, staged (else the tasks
    give way to Spark, which quarantines it)."""
    head = RAW_HEAD_COLUMNS["value"]
    return arrow_avro.StagePlan.of(
        value, columns, partition_columns=STAGED_PARTITION_COLUMNS, ok=OK_OUTCOME, raw_value=RAW_VALUE_COLUMN,
        head=head if head in columns.fieldNames() else None, plain=(RAW_VALUE_COLUMN,), tombstones=tombstones,
    )  # fmt: skip


def raw_kept_aside(
    staged: DataFrame, raw_value: bool, raw_key: bool, avro_parts: Sequence[RecordPart] = (), *, masked: bool = False
) -> DataFrame:
    """``staged`` (the decoded records with their outcome) with the raw value and key kept for bad records only.

    Every row gets its digest (:func:`tidemark.spark.stats.row_digest`: the hash and byte
    count the range statistics fold), computed from the raw bytes while they are at hand;
    ``raw_value`` / ``raw_key``: the raw columns to keep for rows whose outcome is not ``ok``
    (null for the rest: the quarantine needs a bad record's bytes, nothing needs a good
    one's). Each of ``avro_parts`` keeps its wire-format header, for the schema ids the
    records carry. So the good records' staged files hold the published columns and a few
    small ones, which publication drops without decoding the rest. ``masked``: the feed masks, so the
    digest is of the masked records instead (:func:`tidemark.spark.stats.masked_row_digest`).
    """
    from pyspark.sql import functions as F

    raw = {"value": RAW_VALUE_COLUMN if raw_value else "value", "key": RAW_KEY_COLUMN if raw_key else "key"}
    bad = F.col(OUTCOME_COLUMN) != F.lit(OK_OUTCOME)
    kept = {c: F.when(bad, F.col(c)).alias(c) for c in (RAW_VALUE_COLUMN, RAW_KEY_COLUMN) if c in staged.columns}
    heads = [F.substring(F.col(raw[p]), 1, HEADER_BYTES).alias(RAW_HEAD_COLUMNS[p]) for p in avro_parts]
    own = [c for c in staged.columns if c not in (*UNPUBLISHED_COLUMNS, OUTCOME_COLUMN, DATE_COLUMN, "plan_id")]
    digest = masked_row_digest(own) if masked else row_digest(raw["value"], raw["key"])
    return staged.select(*[kept.get(c, F.col(c)) for c in staged.columns], *digest, *heads)


def quarantine_writer(
    spark: SparkSession,
    schema: StructType,
    reason: Callable[[str], str],
    codes: Callable[[str], Sequence[str]] | None = None,
    *,
    keep_raw: str | None = None,
) -> Callable[[Sequence[str], str], None]:
    """Writes staged bad-outcome folders (``<outcome>=<code>/topic=*/date=*``, ``schema``) under a
    target folder, partitioned by topic and date, with ``reason(code)`` as the ``_reason`` column
    and ``codes(code)`` as the ``_reason_codes`` one (an array of strings: what the dead-letter
    reader groups and filters by, :mod:`tidemark.output.deadletters`); without ``codes``, the
    parts of the reason (:func:`tidemark.staged.reason_codes`).

    The staging folders are named by short codes (a name built from every broken rule can
    exceed a file name's length); the quarantine carries the full reason as data.

    ``keep_raw`` (a masked feed's, for this plan): the bad records' raw key, value and headers
    go there (replacing what an earlier attempt wrote), and the quarantine keeps none of them
    (:func:`tidemark.spark.masking.split_raw`).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    labels_of = codes or (lambda code: reason_codes(reason(code)))
    labels_type = ArrayType(StringType(), containsNull=False)

    def write(folders: Sequence[str], target: str) -> None:
        frames = []
        for folder in folders:
            code = Location.of(folder).name.partition("=")[2]
            labels = F.array(*[F.lit(c) for c in labels_of(code)]).cast(labels_type)
            rows = spark.read.schema(schema).parquet(spark_path(folder))
            frames.append(rows.withColumn(REASON_COLUMN, F.lit(reason(code))).withColumn(REASON_CODES_COLUMN, labels))
        bad = functools.reduce(lambda a, b: a.unionByName(b), frames)
        if keep_raw is not None:
            if not Location.of(keep_raw).is_local:  # Spark writes it: s3a pointed at the store as for staging
                configure_s3a(spark)
            bad, raw = split_raw(bad)
            parquet_writer(raw, "overwrite").partitionBy(*PARTITION_COLUMNS).parquet(spark_path(keep_raw))
        parquet_writer(bad, "errorifexists").partitionBy(*PARTITION_COLUMNS).parquet(spark_path(target))
        for marker in ("_SUCCESS", "._SUCCESS.crc"):  # not Parquet: readers of the folder would trip on it
            (Location.of(target) / marker).remove_file()

    return write


def stage_on_store(spark: SparkSession, publisher: Publisher) -> bool:
    """Whether the executors stage on the output's object store, with the session's s3a set up for it if so."""

    if not stages_on_store(publisher.location, spark.sparkContext.master):
        return False
    configure_s3a(spark)
    return True
