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
re-drive as a run is :mod:`tidemark.runs.redrive`'s; :func:`staged_result` is the job's result it reports.

Registry-format keys and values (Avro, JSON Schema, Protobuf) are decoded with the feed's
reader schema *now* (its pinned version, else the subject's latest: a re-drive is for a
producer's or a schema's fix), their writers the schema ids the dead letters' raw bytes
carry (:func:`redrive_schemas`, asked of the registry once, on the driver, as a run's are;
Protobuf's message indexes are read as a run reads them). A writer that does not resolve
(an id the registry no longer has, another schema type, an Avro writer the reader cannot
resolve, a Protobuf message retyping a field number) leaves its dead letters failing with
a decode error naming it, and the others go on. Expectations that are not row rules (a
table's row count, say) are not re-checked.

A masked feed's dead letters hold masked columns, not the bytes Kafka held: its re-drive
needs ``masking.keep_raw`` (:func:`refuse_masked_without_raw`), joins each dead letter to the
raw key, value and headers the job kept for it in ``<keep_raw>/plan_id=<id>/`` (:func:`kept_raw`),
decodes those, and masks the decoded records with the job's own :func:`mask_records` and key
before the rules code them (:func:`masked_records`), so what it stages is masked as the run
would have published it and its new reasons name rules, never values. A dead letter whose raw
bytes are gone stays one (:data:`RAW_MISSING`, naming the plan, the record and the folder);
nothing is ever decoded or published from masked columns. The verdicts carry the letters as
listed (masked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tidemark.config.models import Feed, RecordPart, load_feed
from tidemark.errors import ConfigError, PublishError
from tidemark.job.result import JobResult
from tidemark.job.stage import quarantine_writer, raw_kept_aside
from tidemark.kafka.registry import RegistryClient, RegistryConnection, require
from tidemark.kafka.registry import from_env as registry_from_env
from tidemark.output.base import Manifest, Publisher, StagedRecords
from tidemark.output.deadletters import DeadLetter, Key, dead_letters
from tidemark.output.staging import parquet_writer, spark_path, utc_date
from tidemark.planning.plan import Plan
from tidemark.spark import avro, json_schema, protobuf
from tidemark.spark.decode import annotate, raw_key_kept, raw_value_kept
from tidemark.spark.masking import mask_records, masking_key, raw_columns
from tidemark.spark.source import SCHEMA
from tidemark.spark.wire import HEADER_BYTES, MAGIC
from tidemark.staged import (
    DATE_COLUMN,
    DIGEST_COLUMNS,
    ERROR_COLUMN,
    OK_OUTCOME,
    OUTCOME_COLUMN,
    PARQUET_TIMESTAMPS,
    RAW_HEAD_COLUMNS,
    STAGED_PARTITION_COLUMNS,
    UNPUBLISHED_COLUMNS,
)
from tidemark.storage import Location
from tidemark.validation.rules import OutcomeCodes, column_paths

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tidemark.spark.decode import RunSchemas

RAW_MISSING = "raw_bytes_missing"  # the reason code of a masked feed's dead letter whose kept raw bytes are gone


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
    that keeps no raw bytes (:func:`refuse_masked_without_raw`), a keyed table's (its late changes would be stale)."""
    refuse_masked_without_raw(feed)
    if feed.iceberg is not None and feed.iceberg.mode == "upsert":
        raise ConfigError(
            f"feed '{feed.name}' writes a keyed table (iceberg.mode: upsert), whose changes apply in offset order: "
            "a re-drive's changes lie behind the table ledger's ends and would all be skipped as stale, so a "
            "re-drive of it is not supported; fix the producer and send the changes again"
        )


def refuse_masked_without_raw(feed: Feed) -> None:
    """Refuse a re-drive of a masked feed without ``masking.keep_raw``: its dead letters hold masked columns and no
    raw bytes, so there is nothing to decode again, and publishing the masked columns would skip decoding."""
    masking = feed.masking
    if masking is None or masking.keep_raw is not None:
        return
    raise ConfigError(
        f"feed '{feed.name}' masks sensitive fields (masking:) and keeps no raw bytes of its dead letters: they "
        "hold masked columns only, which a re-drive cannot decode again. To re-drive it, set masking.keep_raw to a "
        "separately secured location outside the feed's output; only dead letters quarantined after that are "
        "re-drivable (for earlier ones, fix the producer and replay the window instead: tidemark replay)"
    )


@dataclass(frozen=True)
class KeptRaw:
    """A masked feed's dead letters joined to their raw bytes in its ``keep_raw`` location."""

    found: tuple[DeadLetter, ...]  # each with the kept raw key, value and headers in place of its masked columns
    missing: tuple[Verdict, ...]  # the listed letters whose raw bytes are gone: failing, the reason saying where


def kept_raw(feed: Feed, letters: Sequence[DeadLetter]) -> KeptRaw:
    """``letters`` (of a masked feed with ``keep_raw``) with the raw key, value and headers the job kept for each in
    ``<keep_raw>/plan_id=<id>/`` (:func:`tidemark.job.stage.quarantine_writer`), matched by plan, topic, partition
    and offset; a letter whose raw bytes are not there stays failing with :data:`RAW_MISSING`, never decoded from
    its masked columns."""
    masking = feed.masking
    assert masking is not None and masking.keep_raw is not None  # refuse_masked_without_raw refused the others
    root = Location.of(masking.keep_raw)
    by_plan: dict[str, dict[tuple[str, int, int], _Raw]] = {}
    found: list[DeadLetter] = []
    missing: list[Verdict] = []
    for d in letters:
        folder = root / f"plan_id={d.plan_id}"
        if d.plan_id not in by_plan:
            by_plan[d.plan_id] = _raw_records(folder)
        raw = by_plan[d.plan_id].get((d.topic, d.partition, d.offset))
        if raw is None:
            why = (f"{RAW_MISSING}(plan {d.plan_id}, {d.topic}[{d.partition}] offset {d.offset}: its raw key, "
                   f"value and headers are not in {folder}, so it stays a dead letter; restore them there to "
                   "re-drive it)")  # fmt: skip
            missing.append(Verdict(d, False, (why,)))
        else:
            found.append(replace(d, key=raw.key, value=raw.value, headers=raw.headers))
    return KeptRaw(tuple(found), tuple(missing))


@dataclass(frozen=True)
class _Raw:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _raw_records(folder: Location) -> dict[tuple[str, int, int], _Raw]:
    """The raw records a plan's quarantine kept in ``folder`` (``topic=<t>/date=<d>/*.parquet``), by topic,
    partition and offset."""
    import pyarrow.parquet as pq

    found: dict[tuple[str, int, int], _Raw] = {}
    if not folder.exists():
        return found
    for name, _ in folder.files():
        if not name.endswith(".parquet") or any(p[:1] in "._" for p in name.split("/")):  # Spark's markers, .crc
            continue
        topic = next((unquote(p[len("topic=") :]) for p in name.split("/") if p.startswith("topic=")), None)
        file = folder / name
        for row in pq.read_table(file.fs_path, filesystem=file.fs).to_pylist():
            headers = tuple((str(h["key"]), _raw_bytes(h["value"])) for h in row.get("headers") or ())
            found[(str(row.get("topic") or topic), int(row["partition"]), int(row["offset"]))] = _Raw(
                _raw_bytes(row.get("key")), _raw_bytes(row.get("value")), headers
            )
    return found


def _raw_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else bytes(value)


def masked_records(decoded: DataFrame, feed: Feed) -> DataFrame:
    """``decoded`` with ``feed``'s sensitive fields masked as its runs mask them (:func:`mask_records`, the key from
    ``TIDEMARK_MASKING_KEY``), before the rules see them; unchanged for a feed without ``masking:``."""
    masking = feed.masking
    if masking is None:
        return decoded
    return mask_records(decoded, masking, masking_key(masking, feed.name), feed.name)


def without_raw_bytes(frame: DataFrame, feed: Feed) -> DataFrame:
    """A masked feed's re-checked ``frame`` with no raw bytes on any row (:func:`raw_columns`): a re-drive stages
    only passing records, and its failing ones keep theirs where the job put them."""
    masking = feed.masking
    if masking is None:
        return frame
    return raw_columns(frame, masking.model_copy(update={"keep_raw": None}))


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
    (a registry format's with :func:`redrive_schemas`, from ``registry`` or the environment's); a masked feed's
    from their kept raw bytes (:func:`recheck_masked`)."""
    refuse_unsupported(feed)
    if feed.masking is not None:
        return recheck_masked(spark, feed, letters, registry)
    return _recheck(spark, feed, letters, registry)


def recheck_masked(
    spark: SparkSession, feed: Feed, letters: Sequence[DeadLetter], registry: RegistryConnection | None = None
) -> Recheck:
    """A masked feed's ``letters`` re-checked from the raw bytes ``keep_raw`` holds for them (:func:`kept_raw`),
    decoded and masked as a run does before its rules (:func:`masked_records`); each verdict names the letter as
    listed (masked), and a letter without raw bytes fails with :data:`RAW_MISSING`. Verdicts in ``letters``'
    order."""
    kept = kept_raw(feed, letters)
    checked = _recheck(spark, feed, kept.found, registry)
    listed = {d.key_of: d for d in letters}
    verdicts = {v.letter.key_of: replace(v, letter=listed[v.letter.key_of]) for v in checked.verdicts}
    verdicts.update((v.letter.key_of, v) for v in kept.missing)
    return Recheck(tuple(verdicts[d.key_of] for d in letters), checked.frame, checked.codes)


def _recheck(
    spark: SparkSession, feed: Feed, letters: Sequence[DeadLetter], registry: RegistryConnection | None
) -> Recheck:
    """:func:`recheck` of ``letters`` holding the bytes Kafka held (a masked feed's: their kept raw bytes)."""
    if not letters:
        return Recheck((), None, None)
    schemas = redrive_schemas(spark, feed, letters, registry)
    rows = [(d.topic, d.partition, d.offset, d.timestamp, d.timestamp_type, d.key, d.value,
             [{"key": k, "value": v} for k, v in d.headers], d.plan_id) for d in letters]  # fmt: skip
    source = spark.createDataFrame(rows, schema=SCHEMA)
    decoded = masked_records(annotate(source, feed.deserialization, schemas.get("value"), schemas.get("key")),
                             feed)  # fmt: skip
    record_columns = [c for c in column_paths(decoded.schema) if c not in (*UNPUBLISHED_COLUMNS, "plan_id")]
    codes = OutcomeCodes.of(record_columns, feed, schemas)  # the reasons that name the schemas' fields and writers
    # As the job's decode step: the plan id stays, here, to tell the letters of two plans apart (a recreated
    # topic's offsets repeat); it is dropped before staging.
    columns = [c for c in decoded.columns if c != ERROR_COLUMN]
    frame = decoded.select(*columns, utc_date().alias(DATE_COLUMN), codes.column().alias(OUTCOME_COLUMN))
    deser = feed.deserialization
    if raw_value_kept(deser) or raw_key_kept(deser):
        frame = raw_kept_aside(frame, raw_value_kept(deser), raw_key_kept(deser))
    frame = without_raw_bytes(frame, feed)
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
    # The job's physical timestamp type (INT64 microseconds adjusted to UTC, job.steps), not Spark's INT96: an
    # output keeps one schema across its plans, the re-drive's included.
    spark.conf.set("spark.sql.parquet.outputTimestampType", PARQUET_TIMESTAMPS)
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


def staged_result(plan: Plan, manifest: Manifest) -> JobResult:
    """The re-drive's job result (``job.json`` in its run dir, as a run's job writes one): the dead letters its plan
    claims were read and staged pending; the commit protocol shows them (:mod:`tidemark.runs.finish`)."""
    result = JobResult(plan.plan_id, plan.feed, published=True, manifest=manifest.to_dict(),
                       records_read=len(plan.letters), records_published=manifest.records)  # fmt: skip
    result.finished_at = datetime.now(UTC).isoformat()
    return result
