"""The Spark job's steps: read a saved plan once, stage it, check and validate it there, publish.

:func:`run` takes the steps below in this order, each a function of its own over a small
frozen value (:class:`Job`: what every step reads; :class:`Source`: the records as read;
:class:`Staged`: one staging of them), each timed under its name in ``job.json``'s
``timings_s``; what a step finds goes into the :class:`~tidemark.job.result.JobResult` as
soon as it is known, so a failed job's ``job.json`` says how far it got.

1. *reused* (:func:`_done_before`): a plan the output shows already, or one this run staged
   in an earlier attempt, is not read again.
2. ``read`` (:func:`_read`): Kafka is read exactly once, by one Spark write: the
   ``tidemark_kafka`` data source in the executors or, for plans of at most the feed's
   ``driver_read_max_records``, the same reader run in the driver beforehand
   (:func:`tidemark.spark.source.read_plan_in_driver`: no Python worker starts for a small run).
3. ``schemas`` (:func:`_schemas`): a feed whose keys or values are in a Schema Registry
   format asks the registry for its reader and writer schemas (:mod:`tidemark.job.schemas`).
4. ``write`` (:func:`_stage`): every record decoded and marked with its outcome (``ok``, or
   a short code for why it is bad) goes to Parquet in a fresh staging folder, and the rows
   staged are checked against the records read (:mod:`tidemark.job.stage`).
5. ``schema_ids``, ``write_again`` (:func:`_settle_schemas`): Avro parts checked against the
   schema ids the staged records carry; records of other writers are decoded again.
6. ``window`` (:func:`_window`): an exact window's counts; records stamped outside it are
   left out (:mod:`tidemark.job.windows`).
7. ``validate`` (:func:`_validate`): the per-range statistics, the built-in checks, the
   bad-record counts and the feed's GX suite on the staged files (the columns each needs
   only); ``write_again``, ``validate_again`` when the read tasks staged records that row
   rules quarantine.
8. ``publish`` (:func:`_publish`): good records become the publication (a rename for a
   Parquet folder), bad ones its quarantine with the full reason their code stands for.

Nothing is cached, and a failure at any step discards the staging folder. The thin
``spark-submit`` program around :func:`run` is :mod:`tidemark.job.entry`; the benchmark
calls :func:`run` directly. Nothing here imports Airflow or commits offsets.

pyspark (and :mod:`tidemark.spark.source`, which imports it) is imported inside the
functions of ``job/`` that use it: the entry point starts Great Expectations' slow import in
the background first (:func:`preload_great_expectations`), so that it overlaps the session's
start instead of waiting behind pyspark's import.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tidemark._types import TopicPartition as TP
from tidemark.config.models import Feed
from tidemark.errors import ConfigError
from tidemark.faults import fault_point
from tidemark.job.events import gap_events, output_schema_event, table_schema_event
from tidemark.job.guard import refuse_if_moved
from tidemark.job.result import JobResult
from tidemark.job.schemas import avro_parts, registry_client, registry_schemas, schemas_report, settle_avro
from tidemark.job.stage import (
    check_staged_counts,
    counting_reads,
    quarantine_writer,
    raw_kept_aside,
    stage_in_read_tasks,
    stage_on_store,
)
from tidemark.job.windows import outside_window_events, stamped_outside, window_counts
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import RegistryClient, RegistryConnection
from tidemark.output import publisher_for
from tidemark.output.base import Manifest, Publisher, StagedRecords
from tidemark.output.staging import Staging, parquet_writer, spark_path, utc_date
from tidemark.planning.plan import Plan
from tidemark.spark.decode import annotate, raw_key_kept, raw_value_kept
from tidemark.spark.masking import mask_records, masking_key, raw_columns, with_raw
from tidemark.staged import (
    DATE_COLUMN,
    DECODE_CODE,
    DIGEST_COLUMNS,
    ERROR_COLUMN,
    OK_OUTCOME,
    OUTCOME_COLUMN,
    OUTSIDE_WINDOW,
    PARQUET_TIMESTAMPS,
    PASS_DIR,
    RAW_HEAD_COLUMNS,
    RAW_VALUE_COLUMN,
    READ_BY_DATA_SOURCE,
    READ_BY_DRIVER,
    STAGED_BY_READ_TASKS,
    STAGED_BY_SPARK,
    STAGED_PARTITION_COLUMNS,
    UNPUBLISHED_COLUMNS,
    Reader,
    StagedBy,
)
from tidemark.storage import Location, Where
from tidemark.validation.rules import OutcomeCodes, ValidationOutcome, column_paths, validate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tidemark.spark.decode import RunSchemas

VALIDATOR = "tidemark.validation.rules.validate"
T = TypeVar("T")


class Timer:
    """Times the job's steps into ``result.timings_s``, each under its name."""

    def __init__(self, result: JobResult) -> None:
        self.result = result

    def step(self, name: str, fn: Callable[[], T]) -> T:
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


# -- the values the steps pass on ----------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What every step of one run of the job reads, fixed before the first record is read."""

    spark: SparkSession
    plan: Plan
    feed: Feed
    connection: KafkaConnection | None
    run_dir: Path
    run_id: str | None
    publisher: Publisher
    timer: Timer
    registry: RegistryConnection | None = None

    @property
    def digested(self) -> bool:
        """Whether each record is staged with its digest: of its raw bytes (its decoded columns lose them), or of its
        masked columns (a masked feed's statistics are never of raw bytes)."""
        deser = self.feed.deserialization
        return raw_value_kept(deser) or raw_key_kept(deser) or self.feed.masking is not None


@dataclass(frozen=True)
class Source:
    """The plan's records as read (step ``read``), who read them, and where the reader stopped when it says."""

    records: DataFrame
    reader: Reader
    positions: dict[TP, int] | None


@dataclass(frozen=True)
class Schemas:
    """The run's registry schemas per part (step ``schemas``), and the client and feed that settle them again."""

    parts: dict[str, RunSchemas]
    client: RegistryClient | None = None
    pinned: Feed | None = None  # the feed with the reader versions its plan recorded


@dataclass(frozen=True)
class Staged:
    """One staging of the plan's records: the frame written, its outcome codes, the files read back, who wrote them."""

    frame: DataFrame  # the decoded records with their day and outcome, as written
    codes: OutcomeCodes
    files: DataFrame  # the staged files, read back
    schemas: Schemas
    staged_by: StagedBy


# -- the run -------------------------------------------------------------------------------


def run(
    spark: SparkSession,
    plan: Plan,
    feed: Feed,
    connection: KafkaConnection | None,
    run_dir: Path,
    *,
    output_dir: Where | None = None,
    result: JobResult | None = None,
    run_id: str | None = None,
    registry: RegistryConnection | None = None,
) -> JobResult:
    """Read ``plan`` once into staging, check and validate it there, then publish; fill the result.

    The steps are the module docstring's. ``output_dir`` forces a Parquet folder; otherwise
    the feed's publisher (:func:`tidemark.output.publisher_for`: a Parquet folder, or an
    Iceberg table) publishes. ``registry`` (default: the ``TIDEMARK_SCHEMA_REGISTRY_*``
    environment) serves registry-format feeds. Any failure discards the staging folder:
    nothing is visible, nothing to clean up.
    """
    if plan.feed != feed.name:
        raise ConfigError(f"plan {plan.plan_id} was made for feed '{plan.feed}', not '{feed.name}'")
    res = result or JobResult(plan.plan_id, feed.name)
    res.spark.update(master=spark.sparkContext.master, version=spark.version)
    res.validator = VALIDATOR
    run_dir.mkdir(parents=True, exist_ok=True)
    job = Job(spark, plan, feed, connection, run_dir, run_id, publisher_for(feed, plan, output_dir), Timer(res),
              registry)  # fmt: skip
    done = _done_before(job)
    if done is not None:
        _record_publication(res, done, before=True)
        return res
    if connection is not None and output_dir is None:
        refuse_if_moved(plan, connection, run_id)
    # One physical timestamp type in every file a run writes, whichever path stages it: the read tasks' pyarrow
    # writes INT64 microseconds adjusted to UTC, and Spark would write INT96 by default (docs/schemas.md).
    spark.conf.set("spark.sql.parquet.outputTimestampType", PARQUET_TIMESTAMPS)
    preload_great_expectations()
    source = _read(job)
    res.reader = source.reader
    staging = job.publisher.new_staging(plan.plan_id, on_store=stage_on_store(spark, job.publisher), run_id=run_id)
    try:
        manifest = _stage_validate_publish(job, source, staging, res)
    except BaseException:
        staging.discard()
        raise
    _record_publication(res, manifest)
    fault_point("job.after_publish")  # staged for publication, and job.json not yet written
    res.published = True
    return res


def _done_before(job: Job) -> Manifest | None:
    """Step 1: the plan's publication when it is shown already (another run of the same ranges) or staged by an
    earlier attempt of this run; then Kafka is not read again."""
    plan_id, run_id = job.plan.plan_id, job.run_id
    return job.publisher.published(plan_id) or (job.publisher.staged(plan_id, run_id) if run_id else None)


def _record_publication(res: JobResult, manifest: Manifest, *, before: bool = False) -> None:
    """What ``manifest`` says into ``res``; ``before``: found from before (step 1), so it also gives the ranges
    and the records read, and the job is done."""
    res.manifest, res.reused = manifest.to_dict(), manifest.reused or before
    res.records_published, res.records_quarantined = manifest.records, manifest.quarantined
    if before:
        res.published = True
        res.ranges = [dict(r) for r in manifest.ranges]
        res.records_read = sum(int(r.get("records", 0)) for r in manifest.ranges)


def _stage_validate_publish(job: Job, source: Source, staging: Staging, res: JobResult) -> Manifest:
    """Steps 3 to 8 over ``staging``; what each finds goes into ``res`` as soon as it is known."""
    timer, feed = job.timer, job.feed
    schemas = timer.step("schemas", lambda: _schemas(job, source)) if feed.deserialization.registry_parts \
        else Schemas({})  # fmt: skip
    staged = _stage(job, source, staging, schemas, res, step="write", check_schema=True)
    fault_point("job.after_stage")  # the records are in staging (raw bytes of bad ones too), nothing published
    staged = _settle_schemas(job, source, staging, staged, res)
    if staged.schemas.parts:
        res.schemas = schemas_report(staged.schemas.parts)
    if job.plan.time_filter is not None:
        res.window, res.events, staged = timer.step("window", lambda: _window(job, staged))
    res.events += [e for s in staged.schemas.parts.values() for e in s.events]
    staged, checked = _validate(job, source, staging, staged, res)
    # validate() already refused ranges read past their bounds or with more records than offsets
    # planned (its built-in checks run on these same figures).
    stats = checked.range_stats or []
    res.ranges = [s.to_dict() for s in stats]
    res.events += gap_events(stats)
    res.records_read = sum(s.records for s in stats)
    res.validation = checked.summary
    res.decode_failures = int(checked.summary["counts"]["decode_errors"])
    manifest = timer.step("publish", lambda: _publish(job, staging, staged, checked))
    if manifest.extra.get("schema_changes"):
        res.events.append(table_schema_event(manifest))
    evolved = output_schema_event(manifest)
    if evolved is not None:
        res.events.append(evolved)
    return manifest


# -- the steps -----------------------------------------------------------------------------


def _read(job: Job) -> Source:
    """Step 2: the plan's records as a DataFrame, and where the reader stopped in each range when it reports that.

    A small plan is read by the driver (no Python workers at all); the rest, and a small plan
    of large records, by the data source on the executors (lazily: Spark's write reads them).
    """
    # The data source module imports pyspark: see the module docstring.
    from tidemark.spark.source import DRIVER_READ_MAX_BYTES, DriverReadTooLarge, read_plan, read_plan_in_driver

    spark, plan, connection = job.spark, job.plan, job.connection
    # Where the reader stopped in each range, as it reports it: validation refuses a range
    # read short of its planned end. Only the driver's read reports them; the executors'
    # reader cannot hand them back, and raises on a short read itself (its stall error).
    reached: dict[TP, int] = {}
    if 0 < plan.total_records <= job.feed.driver_read_max_records:  # small: no Python workers at all
        try:
            records = job.timer.step(
                "read",
                lambda: read_plan_in_driver(
                    spark, plan, connection, max_bytes=DRIVER_READ_MAX_BYTES, positions=reached
                ),
            )
            positions = {p.key: reached.get(p.key, p.start) for p in plan.partitions}  # unread: still at its start
            return Source(records, READ_BY_DRIVER, positions)
        except DriverReadTooLarge as exc:  # few records, but large ones: the executors read them
            print(f"tidemark job: {exc}; reading with the data source instead", file=sys.stderr)
    return Source(read_plan(spark, plan, connection), READ_BY_DATA_SOURCE, None)


def _schemas(job: Job, source: Source) -> Schemas:
    """Step 3: the reader and writer schemas of the feed's registry-format parts, with the readers the plan
    recorded pinned (:mod:`tidemark.job.schemas`)."""
    client, pinned = registry_client(job.plan, job.feed, job.registry)
    return Schemas(registry_schemas(job.spark, source.records, pinned, client), client, pinned)


def _decode(job: Job, source: Source, schemas: Schemas) -> tuple[DataFrame, OutcomeCodes]:
    """Every record decoded with the run's ``schemas``, with its day and its outcome code (part of step 4)."""
    from pyspark.sql import functions as F

    feed, time_filter = job.feed, job.plan.time_filter
    decoded = annotate(source.records, feed.deserialization, schemas.parts.get("value"), schemas.parts.get("key"),
                       tombstones=feed.tombstones_are_changes)  # fmt: skip
    masking = feed.masking
    if masking is not None:  # right after decoding: rules, staging, validation and publication see masked values
        decoded = with_raw(decoded) if masking.keep_raw is not None else decoded
        decoded = mask_records(decoded, masking, masking_key(masking, feed.name), feed.name)
    record_columns = [c for c in column_paths(decoded.schema) if c not in (*UNPUBLISHED_COLUMNS, "plan_id")]
    codes = OutcomeCodes.of(record_columns, feed, schemas.parts)
    outcome = codes.column()
    if time_filter is not None:  # exact window: records stamped outside it are read, counted and left out
        outcome = F.when(stamped_outside(time_filter), F.lit(OUTSIDE_WINDOW)).otherwise(outcome)
    columns = [c for c in decoded.columns if c not in (ERROR_COLUMN, "plan_id")]
    frame = decoded.select(*columns, utc_date().alias(DATE_COLUMN), outcome.alias(OUTCOME_COLUMN))
    if job.digested:
        deser = feed.deserialization
        frame = raw_kept_aside(frame, raw_value_kept(deser), raw_key_kept(deser), avro_parts(feed),
                               masked=masking is not None)  # fmt: skip
    if masking is not None:  # after the digests: the raw bytes go, or stay for keep_raw's bad records only
        frame = raw_columns(frame, masking)
    return frame, codes


def _stage(
    job: Job, source: Source, staging: Staging, schemas: Schemas, res: JobResult, *, step: str,
    check_schema: bool = False,
) -> Staged:  # fmt: skip
    """Step 4 (or a ``write_again``): decode, then the one write of the records to the staging folder (a read of
    Kafka), read back from there.

    ``check_schema``: first ask the output whether it can take these columns (an Iceberg table that cannot
    refuses the run before anything is staged).
    """
    frame, codes = _decode(job, source, schemas)
    if check_schema:
        job.publisher.check_schema(frame.drop(OUTCOME_COLUMN, *UNPUBLISHED_COLUMNS).schema, job.plan)
    return job.timer.step(step, lambda: _write(job, source, staging, schemas, frame, codes, res, by_spark=False))


def _write(
    job: Job, source: Source, staging: Staging, schemas: Schemas, frame: DataFrame, codes: OutcomeCodes,
    res: JobResult, *, by_spark: bool,
) -> Staged:  # fmt: skip
    """``frame`` written to the staging folder, and read back from there; ``res.staged_by`` says who wrote it.

    Staged by the read tasks themselves when they can (:func:`tidemark.job.stage.stage_in_read_tasks`), else by
    Spark. Either way the records the reader produced are counted per partition as they pass, and compared with
    the rows staged (:func:`tidemark.job.stage.check_staged_counts`).
    """
    spark, plan = job.spark, job.plan
    read: dict[TP, int] = {}
    columns = None
    if not by_spark:
        columns = stage_in_read_tasks(
            spark, plan, job.feed, job.connection, frame, schemas.parts, staging, source.reader, read
        )
    staged_by: StagedBy = STAGED_BY_SPARK if columns is None else STAGED_BY_READ_TASKS
    if columns is None:
        counted, read_counts = counting_reads(frame, plan)
        parquet_writer(counted, "errorifexists").partitionBy(*STAGED_PARTITION_COLUMNS).parquet(
            spark_path(staging.written_url)
        )
        read = read_counts()
        columns = frame.schema
    res.staged_by = staged_by
    # Explicit schema: partition values are read back as written ("007" stays a string topic).
    files = spark.read.schema(columns).parquet(spark_path(staging.written_url))
    check_staged_counts(plan, read, files, staging.written_url)
    return Staged(frame, codes, files, schemas, staged_by)


def _settle_schemas(job: Job, source: Source, staging: Staging, staged: Staged, res: JobResult) -> Staged:
    """Step 5: Avro parts decoded with the subject's versions: are they the ones the records were written with?
    Records of other writers are all decoded again with every writer they need (step ``write_again``)."""
    schemas = staged.schemas
    if not avro_parts(job.feed) or schemas.client is None or schemas.pinned is None:
        return staged
    client, pinned = schemas.client, schemas.pinned
    parts, again = job.timer.step(
        "schema_ids", lambda: settle_avro(job.spark, staged.files, schemas.parts, pinned, client)
    )
    settled = Schemas(parts, client, pinned)
    if not again:
        return Staged(staged.frame, staged.codes, staged.files, settled, staged.staged_by)
    staging.remove(PASS_DIR)
    return _stage(job, source, staging, settled, res, step="write_again")


def _window(job: Job, staged: Staged) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Staged]:
    """Step 6: an exact window's per-partition counts and events, and the staged records inside the window."""
    from pyspark.sql import functions as F

    plan, time_filter = job.plan, job.plan.time_filter
    assert time_filter is not None  # only exact windows take this step
    window, events = window_counts(staged.files, plan, time_filter)
    if plan.commit:  # the commit passes over them: each partition's count is an event
        events += outside_window_events(window, plan)
    inside = staged.files.where(F.col(OUTCOME_COLUMN) != OUTSIDE_WINDOW)
    return window, events, Staged(staged.frame, staged.codes, inside, staged.schemas, staged.staged_by)


def _validate(
    job: Job, source: Source, staging: Staging, staged: Staged, res: JobResult
) -> tuple[Staged, ValidationOutcome]:
    """Step 7: one aggregation over the staged files (range statistics, built-in checks, bad-row counts) with GX
    beside it; raises when the run must fail.

    The read tasks stage every record as good; records that row rules quarantine need their outcome codes, which
    Spark's staging gives them: then the plan is staged again that way (``write_again``) and validated again.
    """
    checked = job.timer.step("validate", lambda: _checked(job, source, staged))
    if staged.staged_by == STAGED_BY_READ_TASKS and int(checked.summary["quarantined_records"]):
        staging.remove(PASS_DIR)
        frame, codes, schemas = staged.frame, staged.codes, staged.schemas
        staged = job.timer.step(
            "write_again", lambda: _write(job, source, staging, schemas, frame, codes, res, by_spark=True)
        )
        checked = job.timer.step("validate_again", lambda: _checked(job, source, staged))
    return staged, checked


def _checked(job: Job, source: Source, staged: Staged) -> ValidationOutcome:
    """:func:`tidemark.validation.rules.validate` on ``staged``'s files, each frame with the columns it needs."""
    from pyspark.sql import functions as F

    files = staged.files
    undecoded = F.col(OUTCOME_COLUMN).startswith(DECODE_CODE)
    in_tasks = staged.staged_by == STAGED_BY_READ_TASKS  # each record's raw value staged beside it, no digests
    return validate(
        files.where(~undecoded).select(*[c for c in files.columns if c not in (OUTCOME_COLUMN, DATE_COLUMN)]),
        job.plan, job.feed, job.run_dir,
        positions=source.positions,
        decode_failed=files.where(undecoded).withColumn(ERROR_COLUMN, staged.codes.decode_error(F.col(OUTCOME_COLUMN))),
        exact_duplicates=False,  # the reader yields each offset at most once
        # The read tasks stage a decoded value's raw bytes beside it (JSON, Avro), a raw or text value as it is.
        raw_value_column=(RAW_VALUE_COLUMN if in_tasks else None) if job.digested else "value",
        digested=job.digested and not in_tasks,
    )  # fmt: skip


def _publish(job: Job, staging: Staging, staged: Staged, checked: ValidationOutcome) -> Manifest:
    """Step 8: the publisher publishes the staged records, after their counts are checked against what
    validation passed; the quarantine keeps a bad record's raw bytes, not the job's digests and headers of them."""
    spark = job.spark
    quarantined_schema = staged.frame.drop(OUTCOME_COLUMN, *DIGEST_COLUMNS, *RAW_HEAD_COLUMNS.values()).schema
    published_schema = staged.frame.drop(OUTCOME_COLUMN, *UNPUBLISHED_COLUMNS).schema

    def read_good(source: str) -> DataFrame:
        return spark.read.schema(published_schema).parquet(spark_path(source))  # Parquet reads only these columns

    if job.plan.time_filter is not None:  # neither published nor quarantined: they are outside the window
        staging.remove(PASS_DIR, f"{OUTCOME_COLUMN}={OUTSIDE_WINDOW}")
    return job.publisher.publish_staged(
        staging, job.plan, job.feed,
        staged=StagedRecords(OUTCOME_COLUMN, OK_OUTCOME, published_schema, read_good,
                             unpublished=tuple(c for c in UNPUBLISHED_COLUMNS if c in staged.files.columns),
                             write_quarantine=quarantine_writer(spark, quarantined_schema, staged.codes.reason,
                                                                    staged.codes.labels, keep_raw=_kept_raw(job))),
        stats=checked.range_stats or [], extra={"validator": VALIDATOR},
        expect_records=int(checked.summary["good_records"]),
        expect_quarantined=int(checked.summary["quarantined_records"]),
        run_id=job.run_id,
    )  # fmt: skip


def _kept_raw(job: Job) -> str | None:
    """Where a masked feed keeps its quarantined records' raw bytes for this plan (``keep_raw``), or None."""
    masking = job.feed.masking
    if masking is None or masking.keep_raw is None:
        return None
    return (Location.of(masking.keep_raw) / f"plan_id={job.plan.plan_id}").url
