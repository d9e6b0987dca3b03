"""The Spark job's steps: read a saved plan once, validate what was read, publish, report.

``spark_jobs/tidemark_job.py`` is the thin ``spark-submit`` entry point around
:func:`main`; the benchmark calls :func:`run` directly. Kafka is read exactly once, by
one Spark write: every record, decoded and marked with its outcome (``ok``, or a short
code for why it is bad), goes to Parquet in a fresh staging folder. The records come from the
``tidemark_kafka`` data source in the executors or, for plans of at most the feed's
``driver_read_max_records``, from the same reader run in the driver beforehand
(:func:`tidemark.spark.source.read_plan_in_driver`: no Python worker starts for a small run).
The per-range statistics, the built-in checks, the bad-record counts and the feed's GX
suite then run on those staged files (reading only the columns each needs), and
publication is a matter of renames: good records become the plan's folder; bad ones are
rewritten into its quarantine with the full reason their code stands for. Nothing is cached, and a
failure at any step discards the staging folder.

The job writes ``<run_dir>/job.json`` in every case: ``published`` (bool), ``error``
(on failure), the manifest, counts, timings and the per-range statistics. The
pipeline reads it before committing. Nothing here imports Airflow or commits offsets.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark._types import TopicPartition as TP
from tidemark.config.models import Feed, RecordPart, load_feed, load_feeds
from tidemark.errors import ConfigError, PublishError, TidemarkError
from tidemark.faults import fault_point
from tidemark.kafka.connection import KafkaConnection, from_env
from tidemark.kafka.registry import RegistryClient, RegistryConnection
from tidemark.kafka.registry import from_env as registry_from_env
from tidemark.planning.plan import Plan
from tidemark.spark.secrets import load_secrets
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from tidemark.output.base import Publisher
    from tidemark.output.parquet import Manifest, Staging
    from tidemark.spark import arrow_avro
    from tidemark.spark.avro import AvroSchemas
    from tidemark.spark.decode import RunSchemas
    from tidemark.spark.stats import RangeStats
    from tidemark.validation.rules import OutcomeCodes, ValidationOutcome

JOB_FILE = "job.json"
SHIP_ENV = "TIDEMARK_SHIP_PACKAGE"
VALIDATOR = "tidemark.validation.rules.validate"


@dataclass
class JobResult:
    plan_id: str
    feed: str
    published: bool = False
    reused: bool = False
    error: str | None = None
    error_type: str | None = None
    manifest: dict[str, Any] | None = None
    records_read: int = 0
    records_published: int = 0
    records_quarantined: int = 0
    decode_failures: int = 0
    validation: dict[str, Any] | None = None
    validator: str = "builtin"
    reader: str | None = None  # "driver" (small plans) or "data_source" (Spark's Python data source in executors)
    staged_by: str | None = None  # "spark" (Spark's Parquet writer) or "read_tasks" (tidemark.spark.arrow_avro)
    ranges: list[dict[str, Any]] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    finished_at: str | None = None
    spark: dict[str, str] = field(default_factory=dict)
    spark_skipped: str | None = None  # why no Spark application was started (a plan with no records)
    window: list[dict[str, Any]] = field(default_factory=list)  # exact windows: per-partition counts
    events: list[dict[str, Any]] = field(default_factory=list)
    schemas: dict[str, Any] | None = None  # Schema Registry feeds: reader schema, writer ids seen (schemas_report)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


class _Timer:
    def __init__(self, result: JobResult) -> None:
        self.result = result

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return fn()
        finally:
            self.result.timings_s[name] = round(time.monotonic() - started, 3)


def preload_great_expectations() -> None:
    """Import Great Expectations in the background while the job reads Kafka.

    A fresh interpreter spends 5-10 s importing GX; started first, that overlaps the
    Spark session's start and the read instead of following them. The import lock makes
    a later ``import`` wait for it. Called again, it starts nothing new.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    if "great_expectations" in sys.modules or _GX_IMPORT:
        return

    def load() -> None:
        try:
            importlib.import_module("great_expectations")
        except Exception:  # noqa: BLE001 - the real import in validation reports any problem
            return

    thread = threading.Thread(target=load, name="tidemark-gx-import", daemon=True)
    _GX_IMPORT.append(thread)
    thread.start()


_GX_IMPORT: list[threading.Thread] = []


PARQUET_TIMESTAMPS = "TIMESTAMP_MICROS"  # Spark's name for Parquet's INT64 TIMESTAMP(MICROS, isAdjustedToUTC=true)


def run(
    spark: SparkSession,
    plan: Plan,
    feed: Feed,
    connection: KafkaConnection | None,
    run_dir: Path,
    *,
    output_dir: Path | Location | str | None = None,
    result: JobResult | None = None,
    run_id: str | None = None,
    registry: RegistryConnection | None = None,
) -> JobResult:
    """Read ``plan`` once into staging, check and validate it there, then publish; fill the result.

    1. ``write``: Kafka → decode → each record's outcome code (``ok``, or which decode
       failure or rules, :class:`tidemark.validation.rules.OutcomeCodes`) → Parquet under a
       fresh staging folder, partitioned by outcome, topic and date. The
       only read of Kafka; nothing is cached. A small plan is read by the driver just
       before (step ``read``) and handed to Spark as Arrow batches.
    2. ``validate``: one aggregation over the staged files (the columns it needs only) gives
       the per-range statistics, the built-in range checks and the bad-record counts, while
       the feed's GX suite runs beside it (:func:`tidemark.validation.rules.validate`); raises when
       the run must fail.
    3. ``publish``: the feed's publisher (:func:`tidemark.output.base.publisher_for`: a Parquet
       folder, where good records become the publication by rename and bad ones its
       quarantine, or an Iceberg table) publishes the staged records, after their counts
       are checked against what validation passed. ``output_dir`` forces a Parquet folder.
    Any failure discards the staging folder: nothing is visible, nothing to clean up.

    A feed whose keys or values are in a Schema Registry format asks ``registry`` (default:
    the ``TIDEMARK_SCHEMA_REGISTRY_*`` environment) for its schemas first, step ``schemas``.
    JSON Schema and Protobuf parts first run one aggregation over their schema ids (a read of
    Kafka) and resolve every writer schema seen to the reader schema; Avro parts decode with
    the subject's latest versions that resolve to the reader, and step ``schema_ids`` then
    checks them against the ids the staged records carry (one aggregation over their staged
    wire-format headers): records written with another schema are decoded again with every
    writer they need (step ``write_again``, a second read of Kafka). A framing, id or schema
    change that cannot be resolved fails the run before anything is published.

    Where the decoded columns lose the bytes Kafka holds (JSON and registry-format values,
    registry-format keys), each record is staged with a digest of its raw key and value (the
    hash and byte count the range statistics fold) and keeps the raw bytes only when it is
    bad, for the quarantine (:func:`raw_kept_aside`); publication then drops those columns
    from the good records' files by copying the others' column chunks, without decoding them.
    """
    from tidemark.job.guard import refuse_if_moved
    from tidemark.output.base import publisher_for

    if plan.feed != feed.name:
        raise ConfigError(f"plan {plan.plan_id} was made for feed '{plan.feed}', not '{feed.name}'")
    res = result or JobResult(plan.plan_id, feed.name)
    res.spark.update(master=spark.sparkContext.master, version=spark.version)
    res.validator = VALIDATOR
    timer = _Timer(res)
    run_dir.mkdir(parents=True, exist_ok=True)
    publisher = publisher_for(feed, plan, output_dir)

    # Shown already (another run of the same ranges), or staged by an earlier attempt of this
    # run: do not read Kafka again.
    done = publisher.published(plan.plan_id) or (publisher.staged(plan.plan_id, run_id) if run_id else None)
    if done is not None:
        res.manifest, res.reused, res.published = done.to_dict(), True, True
        res.records_published, res.records_quarantined = done.records, done.quarantined
        res.ranges = [dict(r) for r in done.ranges]
        res.records_read = sum(int(r.get("records", 0)) for r in done.ranges)
        return res

    if connection is not None and output_dir is None:
        refuse_if_moved(plan, connection, run_id)
    # One physical timestamp type in every file a run writes, whichever path stages it: the read tasks' pyarrow
    # writes INT64 microseconds adjusted to UTC, and Spark would write INT96 by default (docs/schemas.md).
    spark.conf.set("spark.sql.parquet.outputTimestampType", PARQUET_TIMESTAMPS)
    preload_great_expectations()
    source, positions = _read(spark, plan, feed, connection, timer, res)
    staging = publisher.new_staging(plan.plan_id, on_store=_stage_on_store(spark, publisher))
    try:
        manifest = _stage_validate_publish(
            spark, source, plan, feed, run_dir, publisher, staging, positions, timer, res, run_id, registry, connection
        )
    except BaseException:
        staging.discard()
        raise
    res.manifest = manifest.to_dict()
    res.reused = manifest.reused
    res.records_published = manifest.records
    res.records_quarantined = manifest.quarantined
    fault_point("job.after_publish")  # staged for publication, and job.json not yet written
    res.published = True
    return res


def _read(
    spark: SparkSession, plan: Plan, feed: Feed, connection: KafkaConnection | None, timer: _Timer, res: JobResult
) -> tuple[DataFrame, dict[tuple[str, int], int] | None]:
    """The plan's records as a DataFrame, and where the reader stopped in each range when it reports that.

    A small plan is read by the driver (no Python workers at all); the rest, and a small plan
    of large records, by the data source on the executors.
    """
    from tidemark.spark.source import DRIVER_READ_MAX_BYTES, DriverReadTooLarge, read_plan, read_plan_in_driver

    source = None
    # Where the reader stopped in each range, as it reports it: validation refuses a range
    # read short of its planned end. Only the driver's read reports them; the executors'
    # reader cannot hand them back, and raises on a short read itself (its stall error).
    reached: dict[tuple[str, int], int] = {}
    positions: dict[tuple[str, int], int] | None = None
    if 0 < plan.total_records <= feed.driver_read_max_records:  # small: no Python workers at all
        try:
            source = timer.step(
                "read",
                lambda: read_plan_in_driver(
                    spark, plan, connection, max_bytes=DRIVER_READ_MAX_BYTES, positions=reached
                ),
            )
            res.reader = "driver"
            positions = {p.key: reached.get(p.key, p.start) for p in plan.partitions}  # unread: still at its start
        except DriverReadTooLarge as exc:  # few records, but large ones: the executors read them
            print(f"tidemark job: {exc}; reading with the data source instead", file=sys.stderr)
    if source is None:
        res.reader = "data_source"
        source = read_plan(spark, plan, connection)
    return source, positions


def _stage_validate_publish(
    spark: SparkSession,
    source: DataFrame,
    plan: Plan,
    feed: Feed,
    run_dir: Path,
    publisher: Publisher,
    staging: Staging,
    positions: dict[tuple[str, int], int] | None,
    timer: _Timer,
    res: JobResult,
    run_id: str | None,
    registry: RegistryConnection | None = None,
    connection: KafkaConnection | None = None,
) -> Manifest:
    """Steps ``schemas`` (registry formats), ``write``, ``window``, ``validate`` and ``publish`` over ``staging``;
    fills ``res``."""
    from pyspark.sql import functions as F

    from tidemark.output.base import StagedRecords
    from tidemark.output.parquet import PASS_DIR, parquet_writer, spark_path, utc_date
    from tidemark.spark import arrow_avro
    from tidemark.spark.decode import (
        ERROR_COLUMN,
        OUTCOME_COLUMN,
        RAW_HEAD_COLUMNS,
        RAW_KEY_COLUMN,
        RAW_VALUE_COLUMN,
        annotate,
        raw_key_kept,
        raw_value_kept,
    )
    from tidemark.spark.stats import DIGEST_COLUMNS
    from tidemark.validation.rules import DECODE_CODE, OK_OUTCOME, OutcomeCodes, column_paths, validate

    schemas: dict[str, RunSchemas] = {}
    if feed.deserialization.registry_parts:
        client, pinned = _registry_client(plan, feed, registry)
        schemas = timer.step("schemas", lambda: _registry_schemas(spark, source, pinned, client))
    # Staged beside the record, never published: the raw value and key of feeds whose decoded columns lose them
    # (JSON, registry formats), each row's digest of them for the range statistics, and Avro parts' headers.
    raw_columns = (RAW_VALUE_COLUMN, RAW_KEY_COLUMN, *DIGEST_COLUMNS, *RAW_HEAD_COLUMNS.values())
    keeps_raw = raw_value_kept(feed.deserialization)  # JSON feeds stage the raw value beside the fields
    keeps_raw_key = raw_key_kept(feed.deserialization)  # registry-format keys: the raw key beside the decoded one
    digested = keeps_raw or keeps_raw_key  # each row's digest staged while its raw bytes were at hand (raw_kept_aside)
    time_filter = plan.time_filter

    def staged_frame() -> tuple[DataFrame, OutcomeCodes]:
        """Every record decoded with the run's ``schemas``, with its day and its outcome code."""
        decoded = annotate(source, feed.deserialization, schemas.get("value"), schemas.get("key"))
        codes = OutcomeCodes.of(
            [c for c in column_paths(decoded.schema) if c not in (*raw_columns, "plan_id")], feed, schemas
        )
        outcome = codes.column()
        if time_filter is not None:  # exact window: records stamped outside it are read, counted and left out
            outcome = F.when(_outside(time_filter), F.lit(OUTSIDE_WINDOW)).otherwise(outcome)
        columns = [c for c in decoded.columns if c not in (ERROR_COLUMN, "plan_id")]
        staged_df = decoded.select(*columns, utc_date().alias("date"), outcome.alias(OUTCOME_COLUMN))
        if digested:
            staged_df = raw_kept_aside(staged_df, keeps_raw, keeps_raw_key, _avro_parts(feed))
        return staged_df, codes

    def write(staged_df: DataFrame, *, by_spark: bool = False) -> DataFrame:
        """``staged_df`` written to the staging folder (a read of Kafka), and read back from there.

        Staged by the read tasks themselves when they can (:func:`stage_in_read_tasks`), else by Spark.
        Either way the records the reader produced are counted per partition as they pass, and
        compared with the rows staged (:func:`check_staged_counts`)."""
        staged_schema = None
        read: dict[TP, int] = {}
        if not by_spark:
            staged_schema = stage_in_read_tasks(spark, plan, feed, connection, staged_df, schemas, staging, res, read)
        if staged_schema is None:
            res.staged_by = "spark"
            counted, read_counts = counting_reads(staged_df, plan)
            parquet_writer(counted, "errorifexists").partitionBy(OUTCOME_COLUMN, "topic", "date").parquet(
                spark_path(staging.written_url)
            )
            read = read_counts()
            staged_schema = staged_df.schema
        # Explicit schema: partition values are read back as written ("007" stays a string topic).
        staged = spark.read.schema(staged_schema).parquet(spark_path(staging.written_url))
        check_staged_counts(plan, read, staged, staging.written_url)
        return staged

    staged_df, codes = staged_frame()
    # Before anything is staged: an Iceberg table that cannot take these columns refuses the run here.
    publisher.check_schema(staged_df.drop(OUTCOME_COLUMN, *raw_columns).schema, plan)
    staged = timer.step("write", lambda: write(staged_df))  # the one read of Kafka, unless the schemas change
    if _avro_parts(feed):  # decoded with the subject's versions: are they the ones the records were written with?
        schemas, again = timer.step("schema_ids", lambda: _settle_avro(spark, staged, schemas, pinned, client))
        if again:  # records of other writers: decode them all again with every writer they need
            staging.remove(PASS_DIR)
            staged_df, codes = staged_frame()
            staged = timer.step("write_again", lambda: write(staged_df))
    if schemas:
        res.schemas = schemas_report(schemas)
    undecoded = F.col(OUTCOME_COLUMN).startswith(DECODE_CODE)
    if time_filter is not None:
        res.window, res.events = timer.step("window", lambda: window_counts(staged, plan, time_filter))
        if plan.commit:  # the commit passes over them: each partition's count is an event
            res.events += outside_window_events(res.window, plan)
        staged = staged.where(F.col(OUTCOME_COLUMN) != OUTSIDE_WINDOW)
    res.events += [e for s in schemas.values() for e in s.events]

    def checked_records(staged: DataFrame) -> ValidationOutcome:
        """One aggregation over ``staged``: range statistics, built-in checks, bad-row counts; GX beside it."""
        in_tasks = res.staged_by == arrow_avro.WRITER  # each record's raw value staged beside it, no digests
        return validate(
            staged.where(~undecoded).select(*[c for c in staged.columns if c not in (OUTCOME_COLUMN, "date")]),
            plan, feed, run_dir,
            positions=positions,
            decode_failed=staged.where(undecoded).withColumn(ERROR_COLUMN, codes.decode_error(F.col(OUTCOME_COLUMN))),
            exact_duplicates=False,  # the reader yields each offset at most once
            raw_value_column=RAW_VALUE_COLUMN if in_tasks else None if digested else "value",
            digested=digested and not in_tasks,
        )  # fmt: skip

    checked = timer.step("validate", lambda: checked_records(staged))
    if res.staged_by == arrow_avro.WRITER and int(checked.summary["quarantined_records"]):
        # The read tasks staged every record as good; records that row rules quarantine need their outcome
        # codes, which Spark's staging gives them: stage the plan again that way, and validate it again.
        staging.remove(PASS_DIR)
        staged = timer.step("write_again", lambda: write(staged_df, by_spark=True))
        checked = timer.step("validate_again", lambda: checked_records(staged))
    # validate() already refused ranges read past their bounds or with more records
    # than offsets (its built-in checks run on these same figures).
    stats = checked.range_stats or []
    res.ranges = [s.to_dict() for s in stats]
    res.events += gap_events(stats)
    res.records_read = sum(s.records for s in stats)
    res.validation = checked.summary
    res.decode_failures = int(checked.summary["counts"]["decode_errors"])

    # The quarantine keeps a bad record's raw bytes, not the job's digests and headers of them.
    quarantined_schema = staged_df.drop(OUTCOME_COLUMN, *DIGEST_COLUMNS, *RAW_HEAD_COLUMNS.values()).schema
    published_schema = staged_df.drop(OUTCOME_COLUMN, *raw_columns).schema

    def read_good(source: str) -> DataFrame:
        return spark.read.schema(published_schema).parquet(spark_path(source))  # Parquet reads only these columns

    if time_filter is not None:  # neither published nor quarantined: they are outside the window
        staging.remove(PASS_DIR, f"{OUTCOME_COLUMN}={OUTSIDE_WINDOW}")
    manifest: Manifest = timer.step(
        "publish",
        lambda: publisher.publish_staged(
            staging, plan, feed,
            staged=StagedRecords(OUTCOME_COLUMN, OK_OUTCOME, published_schema, read_good,
                                 unpublished=tuple(c for c in raw_columns if c in staged.columns),
                                 write_quarantine=quarantine_writer(spark, quarantined_schema, codes.reason)),
            stats=stats, extra={"validator": res.validator},
            expect_records=int(checked.summary["good_records"]),
            expect_quarantined=int(checked.summary["quarantined_records"]),
            run_id=run_id,
        ),
    )  # fmt: skip
    if manifest.extra.get("schema_changes"):
        res.events.append(table_schema_event(manifest))
    return manifest


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
    res: JobResult,
    read: dict[TP, int] | None = None,
) -> StructType | None:
    """Stage the plan's records in the read tasks (:mod:`tidemark.spark.arrow_avro`) when they can; the staged
    files' schema, or None (nothing staged: Spark's write stages them).

    They can for an Avro value whose schemas that module decodes, read by the data source,
    with no exact window, into a staging folder the driver shares with the executors. Every
    record that decodes is staged as ``ok``, as ``staged_df`` lays it out, with its raw value
    in place of its digest; when validation then finds records the feed's row rules
    quarantine, the job stages the plan again with Spark (step ``write_again``), which codes
    each record's outcome. A task that meets a record it does not stage (one that does not
    decode, say) gives way, and Spark stages the whole plan instead; the reason is printed.
    ``TIDEMARK_READ_TASK_STAGING=0`` leaves every plan to Spark.
    """
    from pyspark.sql.types import StructType

    from tidemark.output.parquet import PASS_DIR
    from tidemark.spark import arrow_avro
    from tidemark.spark.avro import AvroSchemas
    from tidemark.spark.decode import RAW_VALUE_COLUMN
    from tidemark.spark.stats import DIGEST_COLUMNS

    value = schemas.get("value")
    if not (
        os.environ.get(arrow_avro.SWITCH_ENV, "1").strip() != "0"
        and isinstance(value, AvroSchemas) and "key" not in schemas and res.reader == "data_source"
        and plan.time_filter is None and staging.remote is None
        and RAW_VALUE_COLUMN in staged_df.columns
    ):  # fmt: skip
        return None
    columns = StructType([f for f in staged_df.schema.fields if f.name not in DIGEST_COLUMNS])
    stage = read_task_stage_plan(value, columns)
    if isinstance(stage, str):
        print(f"tidemark job: staging with Spark: {stage}", file=sys.stderr)
        return None
    gave_way = arrow_avro.stage_in_tasks(spark, plan, connection, stage, staging.root / PASS_DIR, read)
    if gave_way is not None:
        print(f"tidemark job: the read tasks gave way to Spark's write: {gave_way}", file=sys.stderr)
        return None
    res.staged_by = arrow_avro.WRITER
    return columns


def read_task_stage_plan(value: AvroSchemas, columns: StructType) -> arrow_avro.StagePlan | str:
    """How the read tasks stage records as ``columns`` (the job's staged columns, raw value in place of digests)
    from ``value``'s schemas, or why they cannot."""
    from tidemark.spark import arrow_avro
    from tidemark.spark.decode import OUTCOME_COLUMN, RAW_HEAD_COLUMNS, RAW_VALUE_COLUMN
    from tidemark.validation.rules import OK_OUTCOME

    head = RAW_HEAD_COLUMNS["value"]
    return arrow_avro.StagePlan.of(
        value, columns, partition_columns=(OUTCOME_COLUMN, "topic", "date"), ok=OK_OUTCOME, raw_value=RAW_VALUE_COLUMN,
        head=head if head in columns.fieldNames() else None, plain=(RAW_VALUE_COLUMN,),
    )  # fmt: skip


def raw_kept_aside(
    staged: DataFrame, raw_value: bool, raw_key: bool, avro_parts: Sequence[RecordPart] = ()
) -> DataFrame:
    """``staged`` (the decoded records with their outcome) with the raw value and key kept for bad records only.

    Every row gets its digest (:func:`tidemark.spark.stats.row_digest`: the hash and byte
    count the range statistics fold), computed from the raw bytes while they are at hand;
    ``raw_value`` / ``raw_key``: the raw columns to keep for rows whose outcome is not ``ok``
    (null for the rest: the quarantine needs a bad record's bytes, nothing needs a good
    one's). Each of ``avro_parts`` keeps its wire-format header, for the schema ids the
    records carry. So the good records' staged files hold the published columns and a few
    small ones, which publication drops without decoding the rest.
    """
    from pyspark.sql import functions as F

    from tidemark.spark.decode import OUTCOME_COLUMN, RAW_HEAD_COLUMNS, RAW_KEY_COLUMN, RAW_VALUE_COLUMN
    from tidemark.spark.stats import row_digest
    from tidemark.spark.wire import HEADER_BYTES
    from tidemark.validation.rules import OK_OUTCOME

    raw = {"value": RAW_VALUE_COLUMN if raw_value else "value", "key": RAW_KEY_COLUMN if raw_key else "key"}
    bad = F.col(OUTCOME_COLUMN) != F.lit(OK_OUTCOME)
    kept = {c: F.when(bad, F.col(c)).alias(c) for c in (RAW_VALUE_COLUMN, RAW_KEY_COLUMN) if c in staged.columns}
    heads = [F.substring(F.col(raw[p]), 1, HEADER_BYTES).alias(RAW_HEAD_COLUMNS[p]) for p in avro_parts]
    return staged.select(
        *[kept.get(c, F.col(c)) for c in staged.columns], *row_digest(raw["value"], raw["key"]), *heads
    )


def table_schema_event(manifest: Manifest) -> dict[str, Any]:
    """A ``table_schema_evolved`` event: the Iceberg table's schema changed in the snapshot that added the plan."""
    changes = list(manifest.extra["schema_changes"])
    table, snapshot = manifest.extra.get("table"), manifest.extra.get("snapshot_id")
    where = f"in snapshot {snapshot}" if snapshot is not None else "in the snapshot the commit step adds"
    return {
        "kind": "table_schema_evolved",
        "message": f"Iceberg table {table}: {'; '.join(changes)}, {where}, the one adding these records",
        "details": {"table": table, "snapshot_id": snapshot, "changes": changes},
    }


def _stage_on_store(spark: SparkSession, publisher: Publisher) -> bool:
    """Whether the executors stage on the output's object store, with the session's s3a set up for it if so."""
    from tidemark.output.parquet import stages_on_store
    from tidemark.spark.session import configure_s3a

    if not stages_on_store(publisher.location, spark.sparkContext.master):
        return False
    configure_s3a(spark)
    return True


def _registry_schemas(
    spark: SparkSession, source: DataFrame, feed: Feed, client: RegistryClient
) -> dict[str, RunSchemas]:
    """The run's reader and writer schemas of each registry-format part (``key``, ``value``) of ``feed`` (with the
    readers its plan recorded pinned, :func:`_registry_client`), fetched once here on the driver (the executors
    never ask the registry).

    Avro parts get their subject's candidate writers (:func:`tidemark.spark.avro.candidate_schemas`), settled
    against the staged records by :func:`_settle_avro`; the other formats need the records' schema ids first:
    one aggregation over their keys and values (a read of Kafka).
    """
    from tidemark.spark import avro, json_schema, protobuf
    from tidemark.spark.wire import scan_parts

    found: dict[str, RunSchemas] = {}
    scanned = [p for p in feed.deserialization.registry_parts if p not in _avro_parts(feed)]
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


def _avro_parts(feed: Feed) -> list[RecordPart]:
    return [p for p in feed.deserialization.registry_parts if feed.deserialization.part_format(p) == "avro"]


def _registry_client(plan: Plan, feed: Feed, registry: RegistryConnection | None) -> tuple[RegistryClient, Feed]:
    """A client of the feed's registry, and ``feed`` with the reader versions ``plan`` recorded pinned."""
    from tidemark.kafka.registry import require
    from tidemark.spark.wire import pin_planned

    client = RegistryClient(require(registry if registry is not None else registry_from_env(), feed.name))
    return client, pin_planned(feed, plan.readers)


def _settle_avro(
    spark: SparkSession, staged: DataFrame, schemas: dict[str, RunSchemas], feed: Feed, client: RegistryClient
) -> tuple[dict[str, RunSchemas], bool]:
    """``schemas`` with each Avro part settled against the schema ids its staged records carry (one aggregation
    over the staged keys' and values' wire-format headers), and whether any part must be decoded again
    (:func:`tidemark.spark.avro.settle`, which raises when records cannot be read)."""
    from pyspark.sql import functions as F

    from tidemark.spark import avro
    from tidemark.spark.decode import RAW_HEAD_COLUMNS
    from tidemark.spark.wire import scan_parts

    parts = _avro_parts(feed)
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


def gap_events(stats: Sequence[RangeStats]) -> list[dict[str, Any]]:
    """A ``gap`` event per range with offsets that hold no record the plan's isolation can see.

    Transaction markers, aborted records (under ``read_committed``) and compacted-away
    records leave offsets without a record; they are counted, not failed, and each range
    that has them says so in the report and the run's log, so a gap is never silent.
    """
    events = []
    for s in stats:
        if s.gaps:
            events.append({
                "kind": "gap", "topic": s.topic, "partition": s.partition,
                "message": (
                    f"{s.topic}[{s.partition}] offsets [{s.start}, {s.end}): {s.gaps} of {s.planned} offsets hold no "
                    f"record (transaction markers, aborted or compacted-away records); {s.records} records read, "
                    f"offsets {s.first_offset} to {s.last_offset}. Counted, not failed"
                ),
                "details": {"start": s.start, "end": s.end, "gaps": s.gaps, "records": s.records,
                            "first_offset": s.first_offset, "last_offset": s.last_offset},
            })  # fmt: skip
    return events


def quarantine_writer(
    spark: SparkSession, schema: StructType, reason: Callable[[str], str]
) -> Callable[[Sequence[str], str], None]:
    """Writes staged bad-outcome folders (``<outcome>=<code>/topic=*/date=*``, ``schema``) under a
    target folder, partitioned by topic and date, with ``reason(code)`` as the ``_reason`` column.

    The staging folders are named by short codes (a name built from every broken rule can
    exceed a file name's length); the quarantine carries the full reason as data.
    """
    from pyspark.sql import functions as F

    from tidemark.output.parquet import parquet_writer, spark_path
    from tidemark.storage import Location
    from tidemark.validation.rules import REASON_COLUMN

    def write(folders: Sequence[str], target: str) -> None:
        frames = [
            spark.read.schema(schema).parquet(spark_path(folder))
            .withColumn(REASON_COLUMN, F.lit(reason(Location.of(folder).name.partition("=")[2])))
            for folder in folders
        ]  # fmt: skip
        bad = functools.reduce(lambda a, b: a.unionByName(b), frames)
        parquet_writer(bad, "errorifexists").partitionBy("topic", "date").parquet(spark_path(target))
        for marker in ("_SUCCESS", "._SUCCESS.crc"):  # not Parquet: readers of the folder would trip on it
            (Location.of(target) / marker).remove_file()

    return write


# -- entry point -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tidemark_job", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--plan", required=True, help="path of the saved plan JSON")
    parser.add_argument("--feed", help="feed name or YAML path (default: the plan's feed)")
    parser.add_argument("--run-dir", required=True, help="folder for job.json, validation output and logs")
    parser.add_argument("--output", help="override the feed's output location")
    parser.add_argument(
        "--ship-package",
        action="store_true",
        default=_ship_setting(os.environ.get(SHIP_ENV, "")),
        help=(
            "zip the tidemark package and add it to the executors' Python path; by default only when "
            f"the master is not local[...] ({SHIP_ENV}=1 always, {SHIP_ENV}=0 never)"
        ),
    )
    return parser.parse_args(argv)


def session(app_name: str, *, avro: bool = False) -> SparkSession:
    """The spark-submit session when there is one, else a local session (with ``from_avro`` when ``avro``)."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit: its master and conf apply
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC").getOrCreate()
        return spark
    from tidemark.spark.session import local_session

    return local_session(app_name, avro=avro)


def _ship_setting(value: str) -> bool | None:
    """``TIDEMARK_SHIP_PACKAGE``: unset means decide by the master (None)."""
    value = value.strip().lower()
    if not value:
        return None
    return value not in ("0", "false", "no")


def should_ship(master: str, requested: bool | None) -> bool:
    """Ship the package to executors when asked, else whenever the master is not ``local[...]``.

    A local master's executors are threads of the driver's JVM whose Python workers share
    the driver's interpreter and path; a cluster's executors run wherever its workers do.
    """
    return requested if requested is not None else not master.startswith("local")


# Subpackages no executor imports: the layers above the job (import-linter checks that the
# job and everything below never import them) and the local stand-ins.
NOT_SHIPPED = frozenset({"cli", "devtools", "orchestration", "web"})


def package_zip(folder: Path) -> Path:
    """``folder/tidemark.zip``: the ``tidemark`` package as executors import it, without :data:`NOT_SHIPPED`."""
    import tidemark

    root = Path(tidemark.__file__).resolve().parent
    target = folder / "tidemark.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            inside = path.relative_to(root)
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            if len(inside.parts) > 1 and inside.parts[0] in NOT_SHIPPED:
                continue
            zf.write(path, str(Path("tidemark") / inside))
    return target


def ship_package(spark: SparkSession) -> Path:
    """Zip the ``tidemark`` package (:func:`package_zip`) and ``addPyFile`` it, for executors that lack it."""
    target = package_zip(Path(tempfile.mkdtemp(prefix="tidemark-pkg-")))
    spark.sparkContext.addPyFile(str(target))
    return target


def _package_origin(_: object) -> str:
    import tidemark

    return str(tidemark.__file__)


def executor_package_origin(spark: SparkSession) -> str:
    """Where an executor's Python imports ``tidemark`` from (one one-record task)."""
    origin: str = spark.sparkContext.parallelize([0], 1).map(_package_origin).collect()[0]
    return origin


def root_cause(exc: BaseException) -> tuple[str, str]:
    """The Tidemark error behind ``exc`` when a Spark task raised one, else ``exc`` itself."""
    if isinstance(exc, TidemarkError):
        return type(exc).__name__, str(exc)
    text = str(exc)
    for line in text.splitlines():
        if line.startswith("tidemark.errors."):
            name, _, message = line[len("tidemark.errors.") :].partition(": ")
            return name, message.strip()
    return type(exc).__name__, text.strip().splitlines()[0] if text.strip() else type(exc).__name__


OUTSIDE_WINDOW = "outside_window"  # the staging outcome of records stamped outside an exact window


def _outside(time_filter: Mapping[str, Any]) -> Column:
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    conditions = []
    if time_filter.get("start_ms") is not None:
        conditions.append(ts < F.timestamp_millis(F.lit(int(time_filter["start_ms"]))))
    if time_filter.get("end_ms") is not None:
        conditions.append(ts >= F.timestamp_millis(F.lit(int(time_filter["end_ms"]))))
    outside = F.lit(False)
    for condition in conditions:
        outside = outside | condition
    return outside


def window_counts(
    staged: DataFrame, plan: Plan, time_filter: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per partition of an exact window: records read, in the end margin, kept, dropped; skew events.

    The *end margin* is ``[cut end, planned end)``: the records past Kafka's own cut at the
    window's end, read only because of the skew bound. A record's *lateness* is how far its
    timestamp lies behind the newest timestamp read before it in its partition; the
    largest lateness seen is the skew the bound must cover. A partition whose largest
    lateness reaches half the bound gets a ``timestamp_skew`` event (at or past the bound,
    records stamped inside the window may lie beyond the range read: raise ``max_skew``).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from tidemark.spark.decode import OUTCOME_COLUMN

    cuts = {k: v for k, v in (time_filter.get("cut_ends") or {}).items()}
    bound = int(time_filter["max_skew_ms"])
    ts_ms = F.unix_millis(F.col("timestamp"))
    before = Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    cut = F.lit(None).cast("long")
    for key, value in cuts.items():
        if value is not None:
            topic, _, part = key.rpartition(":")
            cut = F.when((F.col("topic") == topic) & (F.col("partition") == int(part)), F.lit(value)).otherwise(cut)
    outside = F.col(OUTCOME_COLUMN) == OUTSIDE_WINDOW
    in_margin = cut.isNotNull() & (F.col("offset") >= cut)
    lateness = F.greatest(F.max(ts_ms).over(before) - ts_ms, F.lit(0))
    rows = (
        staged.select("topic", "partition", "offset", "timestamp", OUTCOME_COLUMN)
        .withColumn("_late", lateness)
        .groupBy("topic", "partition")
        .agg(
            F.count(F.lit(1)).alias("read"),
            F.sum(in_margin.cast("long")).alias("read_in_margin"),
            F.sum((~outside).cast("long")).alias("kept"),
            F.sum(outside.cast("long")).alias("dropped"),
            F.sum((in_margin & ~outside).cast("long")).alias("kept_in_margin"),
            F.max("_late").alias("largest_skew_ms"),
        )
        .collect()
    )
    counts = []
    events: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: (r["topic"], r["partition"])):
        doc = {k: (int(r[k]) if r[k] is not None else 0) for k in
               ("read", "read_in_margin", "kept", "dropped", "kept_in_margin", "largest_skew_ms")}  # fmt: skip
        doc = {"topic": r["topic"], "partition": int(r["partition"]), **doc}
        counts.append(doc)
        if bound and doc["largest_skew_ms"] * 2 >= bound:
            exceeded = doc["largest_skew_ms"] >= bound
            events.append({
                "kind": "timestamp_skew", "topic": doc["topic"], "partition": doc["partition"],
                "message": (
                    f"{doc['topic']}[{doc['partition']}]: a record's timestamp lies {doc['largest_skew_ms']} ms behind "
                    f"an earlier record's, {'at or past' if exceeded else 'over half of'} the window's skew bound "
                    f"max_skew={bound} ms; records stamped inside the window may lie beyond the range read. "
                    "Rerun with a larger max_skew to be sure"
                ),
                "details": {"largest_skew_ms": doc["largest_skew_ms"], "max_skew_ms": bound, "exceeded": exceeded},
            })  # fmt: skip
    return counts, events


def outside_window_events(window: Sequence[Mapping[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """``records_outside_window`` events of a committing exact window: records read, dropped, and committed past."""
    ranges = {(p.topic, p.partition): (p.start, p.end) for p in plan.partitions}
    events = []
    for w in window:
        if not w["dropped"]:
            continue
        start, end = ranges.get((w["topic"], w["partition"]), (None, None))
        events.append({
            "kind": "records_outside_window", "topic": w["topic"], "partition": w["partition"],
            "message": f"{w['topic']}[{w['partition']}]: {w['dropped']} records in [{start}, {end}) are stamped "
                       f"outside the window; the {plan.mode} leaves them out of the output and commits past them",
            "details": {"dropped": w["dropped"], "start": start, "end": end},
        })  # fmt: skip
    return events


def run_without_spark(plan: Plan, feed: Feed) -> JobResult:
    """The job's result for a plan with no records: nothing to read, validate or publish.

    Starting Spark for it would cost tens of seconds to learn nothing. The one check that
    still applies is the feed's ``validation.expect_records``: an empty run must fail
    instead of passing vacuously (the same rule the Spark job applies). The commit step
    then re-commits every partition's offset, so idle partitions do not expire.
    """
    if plan.total_records:
        raise TidemarkError(f"plan {plan.plan_id} has {plan.total_records} records; it needs the Spark job")
    res = JobResult(plan.plan_id, feed.name, spark_skipped="the plan has no records to read")
    res.finished_at = res.started_at
    if feed.validation.expect_records:
        ranges = ", ".join(f"{p.topic}[{p.partition}]@{p.start}" for p in plan.partitions)
        res.error_type = "ValidationFailedError"
        res.error = (
            f"plan {plan.plan_id} of feed '{feed.name}' has no records ({ranges}) and validation.expect_records "
            "is true: an empty run fails. Check the producers of the feed's topics, or set expect_records: false; "
            "the group's offsets were not committed"
        )
        return res
    res.published = True
    return res


def write_result(run_dir: Path | Location | str, result: JobResult) -> Location:
    """Write ``job.json`` into ``run_dir`` (a local folder or an object-store location), whole."""
    path = Location.of(run_dir) / JOB_FILE
    path.write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    return path


def upload_run_dir(local: Path, target: Location) -> bool:
    """Copy the job's local run folder to the state location, with local paths rewritten to URLs."""
    for name in (JOB_FILE, "validation.json"):
        path = local / name
        if path.exists():
            path.write_text(path.read_text().replace(str(local), target.url))
    try:
        target.upload_tree(local)
    except TidemarkError as exc:
        print(f"tidemark job: could not upload its run folder to {target}: {exc}", file=sys.stderr)
        return False
    shutil.rmtree(local, ignore_errors=True)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; 0 on success, 1 on any failure (with ``job.json`` saying why)."""
    args = parse_args(argv)
    target = Location.of(args.run_dir)
    # On an object store the job works in a local folder and uploads it at the end
    # (job.json, validation.json, the Data Docs), wherever this driver runs.
    run_dir = target.local_path() if target.is_local else Path(tempfile.mkdtemp(prefix="tidemark-run-"))
    result = JobResult(plan_id="?", feed=args.feed or "?")
    spark = None
    try:
        load_secrets()  # the connections, handed over in a private file (tidemark.spark.secrets), first
        plan = Plan.from_json(Location.of(args.plan).read_text())
        result.plan_id, result.feed = plan.plan_id, plan.feed
        feed = load_feed(args.feed or plan.feed)
        result.feed = feed.name
        if plan.output:  # checked at planning; again where the records are written, symlinks followed here
            from tidemark.output.base import check_replay_output
            from tidemark.planning.requests import output_roots

            roots = output_roots([feed.output_for(plan.mode)])
            check_replay_output(Location.of(plan.output), {**load_feeds(), feed.name: feed}, roots)
        connection = from_env()
        if plan.total_records:  # while the JVM starts the session, the main thread mostly waits
            preload_great_expectations()
        spark = _Timer(result).step(
            "spark_session", lambda: session(f"tidemark-{feed.name}", avro=feed.deserialization.decodes_avro)
        )
        if should_ship(spark.sparkContext.master, args.ship_package):
            ship_package(spark)
            result.spark["executor_package"] = executor_package_origin(spark)
        run(spark, plan, feed, connection, run_dir, output_dir=args.output or None, result=result, run_id=target.name)
    except Exception as exc:  # noqa: BLE001 - every failure must end as job.json + non-zero exit
        result.error_type, result.error = root_cause(exc)
        result.published = False
        print(f"tidemark job failed: {result.error_type}: {result.error}", file=sys.stderr)
        if not isinstance(exc, TidemarkError):
            traceback.print_exc()
    finally:
        result.finished_at = datetime.now(UTC).isoformat()
        write_result(run_dir, result)
        if not target.is_local and not upload_run_dir(run_dir, target):
            result.published = False
    status = "published" if result.published else "failed"
    print(f"tidemark job {status}: plan {result.plan_id}, {result.records_read} records read, "
          f"{result.records_published} published, {result.records_quarantined} quarantined")  # fmt: skip
    return 0 if result.published else 1
