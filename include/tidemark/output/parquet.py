"""The idempotent Parquet sink: one plan's output appears whole, once, or not at all.

Layout under the feed's output location (:meth:`tidemark.config.models.Feed.output_location`)::

    <output>/plan_id=<id>/topic=<topic>/date=<YYYY-MM-DD>/part-*.parquet   published records
    <output>/plan_id=<id>/_quarantine/topic=<t>/date=<d>/...               records kept aside, with _reason (the job)
    <output>/plan_id=<id>/_quarantine/<name>/part-*.parquet                records kept aside (publish())
    <output>/plan_id=<id>/_manifest.json                                   ranges, counts, checksums
    <output>/_staging/<id>.<nonce>/                                        work in progress

``date`` is the record timestamp's UTC date. Spark and pyarrow read ``<output>`` as one
dataset partitioned by ``plan_id``, ``topic`` and ``date`` and skip ``_``-prefixed
folders, so staging and quarantine never leak into it. A feed's ``parquet.partition_by``
chooses other Hive-style folders inside the plan folder (:mod:`tidemark.output.partitioning`):
``timestamp_hour=<h>/topic=<t>/`` of the Kafka timestamp, ``country_value=<value>/`` or
``order_ts_day=<d>/`` of a value field, or none; Spark then rewrites the good records into
them (the default layout is a rename of what the job staged). The job stages with
:func:`new_staging` and finishes with :func:`publish_staged` (renames the good records),
both behind :class:`ParquetPublisher` (the :class:`~tidemark.output.base.Publisher` of a folder);
:func:`publish` writes a DataFrame the same way. Either fills a fresh staging folder,
writes the manifest last, then renames the staging folder to its final name: one
atomic ``rename(2)``, so a crash at any point before it leaves nothing visible, and a
crash after it leaves a complete publication. Publishing a plan whose folder already
holds a manifest is a no-op that returns that manifest. The location must be a POSIX
filesystem seen by the driver and the executors (local disk, or a shared mount on a
cluster).

**Object stores** (``s3://bucket/prefix``, through :mod:`tidemark.storage`) have no atomic
rename, so there the manifest is the commit point. The job stages on local disk
(``TIDEMARK_STAGING_DIR``, default the temp dir) or, on a cluster whose executors share no
disk with the driver, under ``<output>/_staging/`` on the store (:func:`stages_on_store`);
everything is checked there, the driver assembles the publication locally, and
publishing then (1) uploads the data and quarantine files under names that belong to this
attempt alone (``part-00000.<attempt>.parquet``, ...), (2) looks for a manifest once more
and, if another publisher of the same plan wrote one meanwhile, deletes only its own
files and takes that publication, else (3) writes ``_manifest.json`` last, in one PUT.
Nothing under ``plan_id=<id>/`` is ever deleted except the files this attempt uploaded
and no manifest lists, so a second publisher of a plan (an Airflow zombie beside its
retry) can never remove files a manifest lists: the check and the delete need not be one
step. S3 has no conditional write that every S3 server honours (s3proxy ignores
``If-None-Match``), so two publishers passing step (2) together both write a manifest:
the last PUT wins, and both lists are complete publications of the same records. Files
of an interrupted or losing attempt stay beside the publication, listed by no manifest.
A reader must take a plan folder as published only once its manifest exists, and read
the files the manifest lists (:func:`published_files`); a rerun of a published plan
finds the manifest and adds nothing. ``docs/ARCHITECTURE.md`` ("Publishing on S3") says
what a reader sees meanwhile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import tidemark.output.output_schema as output_schema
from tidemark.config.models import Feed, PartitionChoice, SchemaChange
from tidemark.errors import PublishError, StateStoreError
from tidemark.faults import fault_point
from tidemark.output.base import QUARANTINE_DIR, STAGING_DIR, FileEntry, Manifest, StagedRecords
from tidemark.output.partitioning import PartitionField, folder_value, partition_fields
from tidemark.output.staging import (
    Staging,
    local_staging_base,
    make_root,
    name_by_place,
    parquet_writer,
    prepare_remote_staging,
    prepare_staging_base,
    remove_run_staging,
    spark_path,
    staging_name,
    utc_date,
)
from tidemark.planning.plan import Plan, RecoveredPosition
from tidemark.spark.arrow_avro import SPARK_SCHEMA_KEY
from tidemark.spark.session import session_conf
from tidemark.spark.stats import RangeStats
from tidemark.staged import DATE_COLUMN, PARQUET_TIMESTAMPS, PARTITION_COLUMNS, PASS_DIR
from tidemark.storage import Location, Where, fsync_dir, write_durably

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

MANIFEST_NAME = "_manifest.json"
PARTS_DIR = "_parts"  # inside a staging folder: the good records rewritten into the feed's partition folders
# A publication the job staged and the group has not committed yet: not visible to readers
# (Spark, pyarrow and Hive skip ``_``-prefixed folders), promoted after the commit.
PENDING_DIR = "_pending"


@overload
def published_dir(output: Path, plan_id: str) -> Path: ...
@overload
def published_dir(output: Location | str, plan_id: str) -> Location: ...
def published_dir(output: Where, plan_id: str) -> Path | Location:
    """The folder of ``plan_id``'s publication under ``output`` (a local ``Path`` stays a ``Path``)."""
    name = f"plan_id={plan_id}"
    return output / name if isinstance(output, Path) else Location.of(output) / name


def load_manifest(output: Where, plan_id: str) -> Manifest | None:
    """The manifest of ``plan_id`` under ``output``, or ``None`` when it was never published.

    Locally a plan folder without a manifest cannot come from Tidemark (it renames complete
    folders) and is refused. On an object store it is what an interrupted upload leaves:
    not published, and cleared by the next publish of that plan.
    """
    folder = published_dir(Location.of(output), plan_id)
    manifest = folder / MANIFEST_NAME
    if not manifest.exists():
        if folder.is_local and folder.exists():
            raise PublishError(
                f"{folder} exists without {MANIFEST_NAME}: it was not written by Tidemark's "
                f"publish (which renames complete folders only); move it away before publishing plan {plan_id}"
            )
        return None
    return Manifest.from_dict(json.loads(manifest.read_text()))


def published_files(output: Where) -> list[str]:
    """The data files of every published plan under ``output`` (paths or URLs), from their manifests.

    What a reader of an object-store output should read (``spark.read.parquet(*files)``):
    plan folders without a manifest (an upload in progress or interrupted) are left out,
    and so are quarantined records.
    """
    root = Location.of(output)
    found = []
    for folder in root.children():
        if not folder.name.startswith("plan_id="):
            continue
        manifest = load_manifest(root, folder.name[len("plan_id=") :])
        if manifest is not None:
            found += [str(folder / f.path) for f in manifest.files if not f.path.startswith(QUARANTINE_DIR)]
    return found


def publish(
    df: DataFrame,
    plan: Plan,
    feed: Feed,
    *,
    quarantine: Mapping[str, DataFrame] | None = None,
    stats: Sequence[RangeStats] = (),
    output_dir: Where | None = None,
    extra: Mapping[str, Any] | None = None,
    expect_records: int | None = None,
) -> Manifest:
    """Write ``df`` (and ``quarantine``) as plan ``plan``'s output, atomically and at most once.

    ``quarantine`` maps a name (``decode``, ``validation``) to records kept aside; each
    is written under ``_quarantine/<name>/``.
    ``df`` has the source's metadata columns (``topic``, ``timestamp``, ...) plus the
    decoded ones; ``plan_id`` is dropped from the files (it is the folder name).
    With ``expect_records``, the Parquet row count is checked against it before the
    publication becomes visible. Returns the manifest; ``manifest.reused`` is True when the plan was already
    published, in which case nothing was written.
    """

    if plan.feed != feed.name:
        raise PublishError(f"plan {plan.plan_id} belongs to feed '{plan.feed}', not '{feed.name}'")
    output = Location.of(output_dir or feed.output_location())
    existing = load_manifest(output, plan.plan_id)
    if existing is not None:
        return replace(existing, reused=True)

    staging = _staging_root(output, plan.plan_id) / f"{plan.plan_id}.{uuid.uuid4().hex[:12]}"
    try:
        data = df.drop("plan_id").withColumn(DATE_COLUMN, utc_date())
        # The job's timestamp type (INT64 micros, UTC), whatever the caller's session says: one schema per output.
        with session_conf(df.sparkSession, "spark.sql.parquet.outputTimestampType", PARQUET_TIMESTAMPS):
            parquet_writer(data, "errorifexists").partitionBy(*PARTITION_COLUMNS).parquet(str(staging))
            for name, rejected in (quarantine or {}).items():
                target = staging / QUARANTINE_DIR / name
                parquet_writer(rejected.drop("plan_id"), "errorifexists").parquet(str(target))

        def check(manifest: Manifest) -> None:
            if expect_records is not None and manifest.records != expect_records:
                raise PublishError(
                    f"plan {plan.plan_id}: the staged Parquet files hold {manifest.records} records, expected "
                    f"{expect_records}; nothing was published"
                )

        extra = {**(extra or {}), **settle_output_schema(staging, output, plan, feed)}
        return _seal(staging, output, plan, feed, stats=stats, extra=extra, check=check)
    except PublishError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise PublishError(f"publishing plan {plan.plan_id} of feed '{feed.name}' to {output} failed: {exc}") from exc


# -- staged publication: the job writes once, then validation decides ----------------------


def new_staging(output: Where, plan_id: str, on_store: bool = False, run_id: str | None = None) -> Staging:
    """A new, empty staging folder for ``plan_id``, named by run ``run_id`` (leftovers of its crashed attempts are
    removed, never another run's: :func:`tidemark.output.staging.staging_name`).

    ``on_store`` (an object-store output): Spark stages under ``<output>/_staging/`` (readers
    of the output skip ``_``-prefixed folders); the driver assembles the publication locally.
    """
    output = Location.of(output)
    if load_manifest(output, plan_id) is not None:
        raise PublishError(f"plan {plan_id} is already published under {output}; there is nothing to stage")
    name = staging_name(plan_id, run_id, uuid.uuid4().hex[:12])
    remote = prepare_remote_staging(output / STAGING_DIR, plan_id, run_id) / name if on_store else None
    base = (prepare_staging_base(local_staging_base(output), plan_id, run_id) if on_store
            else _staging_root(output, plan_id, run_id))  # fmt: skip
    return Staging(output, plan_id, make_root(base, name), remote)


def clear_staging(output: Where, run_id: str, *, dead_only: bool = False) -> None:
    """Remove what run ``run_id``'s jobs left in ``output``'s staging: the driver's folders (``<output>/_staging/``
    locally, else the local staging base) and, on an object store, ``<output>/_staging/``; ``dead_only``: only
    what no live job holds (:func:`tidemark.output.staging.remove_run_staging`)."""
    output = Location.of(output)
    remove_run_staging(staging_base(output), None if output.is_local else output / STAGING_DIR, run_id,
                       dead_only=dead_only)  # fmt: skip


def publish_staged(
    staging: Staging,
    plan: Plan,
    feed: Feed,
    *,
    outcome_column: str,
    ok_value: str,
    write_quarantine: Callable[[Sequence[str], str], None],
    unpublished: Sequence[str] = (),
    stats: Sequence[RangeStats] = (),
    extra: Mapping[str, Any] | None = None,
    expect_records: int | None = None,
    expect_quarantined: int | None = None,
    pending: str | None = None,
    partitioned: tuple[Callable[[str], DataFrame], tuple[PartitionField, ...]] | None = None,
) -> Manifest:
    """Publish what the job staged: good records by rename, the rest as quarantine.

    With ``partitioned`` (``(read_good, fields)``: a layout other than ``topic=/date=``) Spark
    rewrites the good records that ``read_good(folder)`` gives into ``fields``' folders instead
    (:func:`write_partitioned`).

    With ``pending`` (the run's id) the publication is left under ``_pending/<pending>/``,
    invisible, until :func:`promote` shows it after the group's commit.

    ``<written>/<outcome_column>=<ok_value>/topic=*/`` become the published topic folders
    (or, when the staged files carry ``unpublished`` columns, are copied without them by
    :func:`drop_columns`, which decodes nothing); every other outcome folder is
    handed to ``write_quarantine(folders, target)``, which writes their records with the
    full ``_reason`` as a column under ``_quarantine/topic=*/date=*/`` (an outcome is a
    short code: a folder named after the reasons could exceed a file name's length).
    Counts are checked against the Parquet footers
    before the manifest is written; then the folder is renamed into place, atomically.
    Raises :class:`PublishError` (and discards the staging folder) on any mismatch.
    """
    if plan.feed != feed.name or plan.plan_id != staging.plan_id:
        raise PublishError(f"plan {plan.plan_id} (feed '{plan.feed}') does not match staging {staging.root}")
    try:
        good = f"{outcome_column}={ok_value}"
        outcomes = staging.outcomes(outcome_column)
        if good in outcomes:
            if partitioned is not None:
                read_good, fields = partitioned
                write_partitioned(read_good(staging.url(PASS_DIR, good)), staging.url(PARTS_DIR), fields)
                parts = staging.root / PARTS_DIR
                staging.pull(PARTS_DIR, parts)
                for child in sorted(parts.iterdir()):
                    if not child.name.startswith(("_", ".")):  # Spark's _SUCCESS and .crc files stay behind
                        os.rename(child, staging.root / child.name)
                shutil.rmtree(parts, ignore_errors=True)
            elif unpublished:
                drop_columns(staging.url(PASS_DIR, good), staging.root, unpublished)
            elif staging.remote is not None:
                staging.pull(f"{PASS_DIR}/{good}", staging.root)
            else:
                for topic_dir in sorted((staging.written / good).iterdir()):
                    if topic_dir.is_dir():
                        os.rename(topic_dir, staging.root / topic_dir.name)
        bad = [staging.url(PASS_DIR, name) for name in outcomes if name != good]
        if bad:
            write_quarantine(bad, staging.url(QUARANTINE_DIR))
            staging.pull(QUARANTINE_DIR, staging.root / QUARANTINE_DIR)
        shutil.rmtree(staging.written, ignore_errors=True)

        def check(manifest: Manifest) -> None:
            for what, want, have in (("records", expect_records, manifest.records),
                                     ("quarantined records", expect_quarantined, manifest.quarantined)):  # fmt: skip
                if want is not None and have != want:
                    raise PublishError(
                        f"plan {plan.plan_id}: the staged Parquet files hold {have} {what}, validation passed on "
                        f"{want}; nothing was published"
                    )

        extra = {**(extra or {}), **settle_output_schema(staging.root, staging.output, plan, feed)}
        manifest = _seal(staging.root, staging.output, plan, feed, stats=stats, extra=extra, check=check,
                         pending=pending)  # fmt: skip
        staging.discard()  # the raw bytes staged (on the store too) go as soon as the publication holds its files
        return manifest
    except PublishError:
        staging.discard()
        raise
    except Exception as exc:
        staging.discard()
        raise PublishError(f"publishing plan {plan.plan_id} of feed '{feed.name}' failed: {exc}") from exc


def write_partitioned(good: DataFrame, target: str, fields: tuple[PartitionField, ...]) -> None:
    """Spark writes ``good`` under ``target`` in Hive-style folders of ``fields`` (in a UTC session, timestamps as
    micros like every staged file): a field partitioned by its value gets a folder beside its column
    (``country_value=DE/``; the files keep ``country``, so no reader takes a value or its type from a folder name),
    as a transform does (``order_ts_day=2026-11-27/``); a Kafka field (``topic=<t>/``) is the folder only. No fields:
    the files side by side."""
    keys: list[str] = []
    schema = good.schema
    for f in fields:
        if f.name != f.column:  # a folder beside its column: a transform's, or a field's own value (<field>_value)
            good = good.withColumn(f.name, folder_value(f, schema))
        keys.append(f.name)
    spark = good.sparkSession
    with (
        session_conf(spark, "spark.sql.parquet.outputTimestampType", PARQUET_TIMESTAMPS),
        session_conf(spark, "spark.sql.session.timeZone", "UTC"),  # the folders' times are UTC
    ):
        writer = parquet_writer(good, "errorifexists")
        (writer.partitionBy(*keys) if keys else writer).parquet(spark_path(target))


ROW_GROUP_BYTES = 128 * 1024 * 1024  # parquet-mr's default: the row groups copied keep their own sizes


def drop_columns(source: str, target: Path, columns: Sequence[str]) -> int:
    """Copy every Parquet file under ``source`` (a staged folder, local or on the store) to the same relative path
    under the local ``target``, without the top-level ``columns``; returns the number of files.

    The other columns' chunks are copied as they are, byte for byte, with their statistics,
    page indexes and bloom filters (parquet-mr's ``ParquetFileWriter.appendColumnChunk``, in
    the driver's JVM): nothing is decoded or encoded again, so this costs a copy of the
    files, not a Spark job. The footer's Parquet schema and its Spark schema lose ``columns``;
    the rest of its key-value metadata is kept. The copies are what Spark would have written
    for the same rows without those columns, as readers see them.
    """
    from pyspark.sql import SparkSession

    spark = SparkSession.active()
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()  # s3a's settings, for a folder staged on the store
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    parquet = jvm.org.apache.parquet
    create = getattr(parquet.hadoop, "ParquetFileWriter$Mode").CREATE
    options = parquet.HadoopReadOptions.builder(conf).build()
    drop = set(columns)
    # Java lists are walked by index: py4j ends an iteration with an exception, which costs
    # PySpark milliseconds to convert. The staged files share one schema: worked out once.
    pruned_for: dict[str, tuple[Any, list[tuple[int, Any]]]] = {}
    folder = Location.of(source)
    copied = 0
    for name, _ in folder.files():
        if not name.endswith(".parquet"):
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        source_file = parquet.hadoop.util.HadoopInputFile.fromPath(hadoop_path(spark_path(folder / name)), conf)
        stream = source_file.newStream()
        try:
            reader = parquet.hadoop.ParquetFileReader.open(source_file, options, stream)
        except Exception as exc:
            stream.close()
            raise PublishError(f"staged file {folder / name} cannot be read as Parquet: {_first_line(exc)}") from exc
        try:
            meta = reader.getFooter().getFileMetaData()
            schema = meta.getSchema()
            key = schema.toString()
            if key not in pruned_for:
                pruned_for[key] = _pruned(jvm, schema, drop)
            pruned, kept = pruned_for[key]
            out = parquet.hadoop.util.HadoopOutputFile.fromPath(hadoop_path(str(target / name)), conf)
            writer = parquet.hadoop.ParquetFileWriter(out, pruned, create, ROW_GROUP_BYTES, 0)
            try:
                writer.start()
                blocks = reader.getRowGroups()
                for b in range(blocks.size()):
                    block = blocks.get(b)
                    writer.startBlock(block.getRowCount())
                    chunks = block.getColumns()
                    for index, descriptor in kept:
                        chunk = chunks.get(index)
                        writer.appendColumnChunk(
                            descriptor, stream, chunk, reader.readBloomFilter(chunk), reader.readColumnIndex(chunk),
                            reader.readOffsetIndex(chunk),
                        )  # fmt: skip
                    writer.endBlock()
                writer.end(_pruned_metadata(jvm, meta, drop))
            except BaseException:
                with contextlib.suppress(Exception):  # the copy is half-written: its stream is closed, not ended
                    writer.abort()
                    writer.close()
                raise
        finally:
            reader.close()
        copied += 1
    return copied


def _first_line(exc: BaseException) -> str:
    """A Java exception's message without its stack trace (py4j puts both in ``str``)."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString() if java is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _pruned_metadata(jvm: Any, meta: Any, drop: set[str]) -> Any:
    """A file's key-value metadata (parquet-mr ``FileMetaData``) with the fields ``drop`` out of its Spark schema."""
    metadata = jvm.java.util.HashMap(meta.getKeyValueMetaData())
    spark_schema = metadata.get(SPARK_SCHEMA_KEY)
    if spark_schema is not None:
        doc = json.loads(spark_schema)
        doc["fields"] = [f for f in doc["fields"] if f["name"] not in drop]
        metadata.put(SPARK_SCHEMA_KEY, json.dumps(doc, separators=(",", ":")))
    return metadata


def _pruned(jvm: Any, schema: Any, drop: set[str]) -> tuple[Any, list[tuple[int, Any]]]:
    """``schema`` (a parquet-mr ``MessageType``) without the top-level fields ``drop``, and the leaf columns kept:
    their index in a row group of ``schema`` and their descriptor in the pruned one."""
    fields = schema.getFields()
    kept_fields = jvm.java.util.ArrayList()
    for i in range(fields.size()):
        field_ = fields.get(i)
        if field_.getName() not in drop:
            kept_fields.add(field_)
    pruned = jvm.org.apache.parquet.schema.MessageType(schema.getName(), kept_fields)
    leaves = schema.getColumns()
    kept = []
    for i in range(leaves.size()):
        path = leaves.get(i).getPath()  # a Java String[]: handed back as it is
        if path[0] not in drop:
            kept.append((i, pruned.getColumnDescription(path)))
    return pruned, kept


def staging_base(output: Location) -> Path:
    """Where ``output``'s staging folders live: ``<output>/_staging`` on a local disk (renamed into place).

    For an object store, a local folder: ``TIDEMARK_STAGING_DIR`` (default the temp dir)
    ``/tidemark-staging/<hash of the output URL>``. Where Spark stages on the store instead
    (:func:`stages_on_store`), the driver still assembles the publication there.
    """
    if output.is_local:
        return output.local_path() / STAGING_DIR
    return local_staging_base(output)


def _staging_root(output: Location, plan_id: str, run_id: str | None = None) -> Path:
    return prepare_staging_base(staging_base(output), plan_id, run_id)


def _seal(
    staging: Path,
    output: Location,
    plan: Plan,
    feed: Feed,
    *,
    stats: Sequence[RangeStats],
    extra: Mapping[str, Any] | None,
    check: Callable[[Manifest], None],
    pending: str | None = None,
) -> Manifest:
    """Manifest the staged files, ``check`` it, then make the folder the publication.

    Local: write the manifest durably, rename the folder into place. Object store: upload
    the files, then the manifest (the commit point). With ``pending`` the folder (locally)
    or the manifest (object store) goes to :func:`pending_dir` instead, for :func:`promote`.
    """
    if not output.is_local:
        name_by_place(staging, attempt=uuid.uuid4().hex[:12])
    files = _file_entries(staging)
    manifest = Manifest(
        plan_id=plan.plan_id,
        feed=feed.name,
        group=plan.group,
        location=str(published_dir(output, plan.plan_id)),
        published_at=datetime.now(UTC).isoformat(),
        records=sum(f.rows for f in files if not f.path.startswith(QUARANTINE_DIR)),
        quarantined=sum(f.rows for f in files if f.path.startswith(QUARANTINE_DIR)),
        ranges=tuple(s.to_dict() for s in stats),
        files=files,
        extra=dict(extra or {}),
    )
    check(manifest)
    text = json.dumps(manifest.to_dict(), indent=2, sort_keys=True)
    if not output.is_local:
        return _upload(staging, output, manifest, text, pending)
    write_durably(staging / MANIFEST_NAME, text.encode())
    if pending is not None:
        return _rename_pending(staging, output, manifest, pending)
    return _rename_into_place(staging, output, manifest)


def settle_output_schema(root: Path, output: Location, plan: Plan, feed: Feed) -> dict[str, Any]:
    """The plan's data files under ``root`` (a sealed-to-be plan folder) against ``output``'s one schema
    (:mod:`tidemark.output.output_schema`): refused on a conflict, or on a change the feed's ``schema_change``
    does not let through; else the files are conformed to the evolved schema, which is recorded at the output's
    root before the plan can be shown. Returns the manifest's ``output_schema`` entry (none without data files)."""
    files = output_schema.data_files(root, QUARANTINE_DIR)
    schema = output_schema.plan_schema(files)
    if schema is None:
        return {}
    current = output_schema.load(output)
    keys = output_schema.folder_keys(root, files)
    compared = output_schema.in_folders(schema, None if current is None else current.schema, keys)
    evolution = output_schema.evolve(None if current is None else current.schema, compared)
    readers = output_schema.readers_text(plan_readers(plan, feed), "the feed's declared fields")
    refuse_schema_change(output, evolution, current, readers, feed.schema_change, plan.plan_id)
    if evolution.conform:
        output_schema.conform(files, output_schema.without(evolution.schema, keys, schema))
    version = 1 if current is None else current.version + (1 if evolution.changes else 0)
    if current is None or evolution.changes:
        output_schema.record(output, evolution.schema, version=version, plan_id=plan.plan_id, readers=readers,
                             changes=evolution.changes)  # fmt: skip
    columns = {f.name: str(f.type) for f in evolution.schema}
    return {"output_schema": {"version": version, "changes": list(evolution.changes), "columns": columns,
                              "readers": readers}}  # fmt: skip


def refuse_schema_change(
    output: Location, evolution: output_schema.Evolution, current: output_schema.OutputSchema | None, readers: str,
    policy: SchemaChange, plan_id: str,
) -> None:  # fmt: skip
    """Raise :class:`PublishError` when ``evolution`` holds a conflict, or changes the output's schema while the
    feed's ``schema_change`` is not ``evolve``; the message names the columns, both readers and versions."""
    if current is None or not (evolution.conflicts or evolution.changes):
        return
    was = f"the output's schema (version {current.version}, set by plan {current.plan_id} read with {current.readers})"
    if evolution.conflicts:
        raise PublishError(
            f"{output}: plan {plan_id} (read with {readers}) cannot be written with {was}: "
            f"{'; '.join(evolution.conflicts)}. Pin the reader version the output was written with "
            "(deserialization.schema_version), or publish to another output; nothing was published or committed"
        )
    if policy != "evolve":
        raise PublishError(
            f"{output}: plan {plan_id} (read with {readers}) would change {was}: {'; '.join(evolution.changes)}. "
            f"The feed's schema_change is '{policy}'; set schema_change: evolve to let added columns and widened "
            "types evolve the output's schema, or pin deserialization.schema_version to the output's reader; "
            "nothing was published or committed"
        )


def plan_readers(plan: Plan, feed: Feed) -> dict[str, dict[str, Any]]:
    """The reader schema of each registry part of ``plan``: the version it recorded, else the feed's pinned one."""
    readers = {part: dict(r) for part, r in plan.readers.items()}
    deser = feed.deserialization
    for part, version in (("value", deser.schema_version), ("key", deser.key_schema_version)):
        if version is not None and part not in readers:
            try:
                subject = deser.reader_subject(plan.topics or feed.topics, part)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - a message's detail only
                subject = "?"
            readers[part] = {"subject": subject, "version": version}
    return readers


def _upload(staging: Path, output: Location, manifest: Manifest, text: str, pending: str | None = None) -> Manifest:
    """Publish on an object store: upload this attempt's files, look again, write the manifest last.

    Only this attempt's own files (named by the attempt) are ever deleted, and only while
    no manifest lists them; see the module docstring for the rule. With ``pending`` the
    manifest goes under :func:`pending_dir`: the files are listed by no visible manifest
    until :func:`promote` copies it into place.
    """
    final = published_dir(output, manifest.plan_id)
    names = [f.path for f in manifest.files]
    winner = load_manifest(output, manifest.plan_id)
    if winner is None:
        try:
            final.upload_tree(staging, names)
            winner = load_manifest(output, manifest.plan_id)  # another publisher may have finished meanwhile
            if winner is None:
                target = final if pending is None else pending_dir(output, manifest.plan_id, pending)
                (target / MANIFEST_NAME).write_text(text)  # the commit point (or the pending one): one PUT
        except Exception as exc:
            _remove_own(final, names)
            raise PublishError(
                f"uploading plan {manifest.plan_id} to {final} failed: {exc}. Nothing of this attempt is published "
                "(no manifest lists its files); rerun to publish it again"
            ) from exc
        if winner is not None:
            _remove_own(final, names)
    shutil.rmtree(staging, ignore_errors=True)
    return manifest if winner is None else replace(winner, reused=True)


def _remove_own(final: Location, names: Sequence[str]) -> None:
    """Delete files this attempt uploaded (named by the attempt, listed by no manifest); best effort."""
    for name in names:
        try:
            (final / name).remove_file()
        except (StateStoreError, FileNotFoundError):  # a leftover listed by no manifest is never read
            continue


def _rename_into_place(staging: Path, output: Location, manifest: Manifest) -> Manifest:
    final = published_dir(output, manifest.plan_id).local_path()
    try:
        os.rename(staging, final)  # atomic: the publication appears whole or not at all
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        winner = load_manifest(output, manifest.plan_id)
        if winner is not None:  # a concurrent publisher of the same plan got there first
            return replace(winner, reused=True)
        raise PublishError(f"could not move {staging} to {final}: {exc.strerror}") from exc
    fsync_dir(output.local_path())
    return manifest


def _file_entries(root: Path) -> tuple[FileEntry, ...]:
    import pyarrow.parquet as pq

    entries = []
    for path in sorted(root.rglob("*.parquet")):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        entries.append(
            FileEntry(
                path=str(path.relative_to(root)),
                bytes=path.stat().st_size,
                rows=pq.read_metadata(path).num_rows,
                sha256=digest.hexdigest(),
            )
        )
    return tuple(entries)


def verify(manifest: Manifest) -> list[str]:
    """Problems found re-checking a publication's files against its manifest."""
    root = Location.of(manifest.location)
    problems = []
    for entry in manifest.files:
        path = root / entry.path
        if not path.exists():
            problems.append(f"{path} is missing")
            continue
        if hashlib.sha256(path.read_bytes()).hexdigest() != entry.sha256:
            problems.append(f"{path} does not match its checksum")
    return problems


def pending_dir(output: Where, plan_id: str, key: str) -> Location:
    """Where run ``key`` leaves ``plan_id``'s publication until the group's commit: ``_pending/<key>/plan_id=<id>/``."""
    return Location.of(output) / PENDING_DIR / key / f"plan_id={plan_id}"


def load_pending(output: Where, plan_id: str, key: str) -> Manifest | None:
    """The manifest run ``key`` staged for ``plan_id``, or ``None`` when it staged nothing (or it was promoted)."""
    manifest = pending_dir(output, plan_id, key) / MANIFEST_NAME
    return Manifest.from_dict(json.loads(manifest.read_text())) if manifest.exists() else None


def _rename_pending(staging: Path, output: Location, manifest: Manifest, key: str) -> Manifest:
    """Locally: the sealed folder becomes run ``key``'s pending publication (an earlier attempt's is replaced)."""
    target = pending_dir(output, manifest.plan_id, key).local_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # an earlier attempt of this run's job: never visible, never committed
        old = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(staging, target)
    fsync_dir(target.parent)
    return manifest


def promote(output: Where, plan_id: str, key: str) -> Manifest:
    """Show run ``key``'s pending publication of ``plan_id``: its commit decided. Idempotent.

    Locally one ``rename(2)`` of the pending folder to ``plan_id=<id>/``; on an object store
    one PUT of the pending manifest to ``plan_id=<id>/_manifest.json`` (the data files are
    already there, under this attempt's names). A plan already shown (by this run's earlier
    promotion, or by another run of the same ranges) stays as it is and its manifest is
    returned with ``reused=True``; the pending copy is dropped.
    """
    root = Location.of(output)
    pending = pending_dir(root, plan_id, key)
    clear_staging(root, key)
    shown = load_manifest(root, plan_id)
    if shown is not None:
        if root.is_local:
            shutil.rmtree(pending.local_path(), ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError, StateStoreError):
                (pending / MANIFEST_NAME).remove_file()
        return replace(shown, reused=True)
    staged = load_pending(root, plan_id, key)
    if staged is None:
        raise PublishError(
            f"plan {plan_id} of run {key}: nothing is staged under {pending} and the plan is not shown in {root}; "
            "the run's job did not finish staging it"
        )
    if root.is_local:
        final = published_dir(root, plan_id).local_path()
        os.rename(pending.local_path(), final)
        fsync_dir(root.local_path())
        with contextlib.suppress(OSError):  # the run's pending folder, now empty (another plan's keeps it)
            pending.local_path().parent.rmdir()
    else:
        (published_dir(root, plan_id) / MANIFEST_NAME).write_text((pending / MANIFEST_NAME).read_text())
        (pending / MANIFEST_NAME).remove_file()
    return staged


def discard(output: Where, plan_id: str, key: str) -> Manifest | None:
    """Drop run ``key``'s pending publication of ``plan_id`` (never shown: its commit was refused).

    On an object store the data files it uploaded go too: they carry this attempt's names,
    which no visible manifest lists. Returns what was dropped, or ``None``.
    """
    root = Location.of(output)
    staged = load_pending(root, plan_id, key)
    pending = pending_dir(root, plan_id, key)
    clear_staging(root, key)
    if root.is_local:
        fault_point("discard.before_pending")  # the run's staging removed, its pending publication not yet
        shutil.rmtree(pending.local_path(), ignore_errors=True)
        with contextlib.suppress(OSError):  # the run's pending folder, now empty (another plan's keeps it)
            pending.local_path().parent.rmdir()
        return staged
    if staged is not None:
        shown = load_manifest(root, plan_id)
        listed = {f.path for f in shown.files} if shown is not None else set()
        _remove_own(published_dir(root, plan_id), [f.path for f in staged.files if f.path not in listed])
        fault_point("discard.before_pending")  # the run's own files removed, its pending manifest not yet
        (pending / MANIFEST_NAME).remove_file()
    return staged


class ParquetPublisher:
    """A Parquet folder with one manifest per plan (this module's functions behind the :class:`Publisher` protocol)."""

    kind = "parquet"

    def __init__(
        self, location: Location, partitioning: PartitionChoice = "date", schema_change: SchemaChange = "fail"
    ) -> None:
        self.location = location
        self.partitioning = partitioning  # the feed's (``parquet.partition_by``, :mod:`tidemark.output.partitioning`)
        self.schema_change = schema_change  # the feed's: what a change of the output's one schema does

    def describe(self) -> str:
        return str(self.location)

    def check_schema(self, schema: StructType, plan: Plan) -> None:
        """A schema the feed's partitioning can partition, whose columns the output's one schema can take (checked
        again on the files when the plan is published: :func:`settle_output_schema`)."""
        fields = partition_fields(self.partitioning, schema, "parquet", plan.feed)
        current = output_schema.load(self.location)
        if current is None:
            return
        in_folders = set(PARTITION_COLUMNS) | {f.name for f in fields if f.identity} | {"plan_id"}
        run = output_schema.arrow_of(schema, in_folders)
        if run is None:
            return
        evolution = output_schema.evolve(current.schema, run)
        readers = output_schema.readers_text(plan.readers, "the feed's declared fields")
        refuse_schema_change(self.location, evolution, current, readers, self.schema_change, plan.plan_id)

    def published(self, plan_id: str) -> Manifest | None:
        found = load_manifest(self.location, plan_id)
        return None if found is None else replace(found, reused=True)

    def new_staging(self, plan_id: str, on_store: bool = False, run_id: str | None = None) -> Staging:
        return new_staging(self.location, plan_id, on_store, run_id)

    def publish_staged(
        self,
        staging: Staging,
        plan: Plan,
        feed: Feed,
        *,
        staged: StagedRecords,
        stats: Sequence[RangeStats],
        extra: Mapping[str, Any],
        expect_records: int,
        expect_quarantined: int,
        run_id: str | None,
    ) -> Manifest:
        # The manifest names the run that published (as an Iceberg snapshot does): a failed
        # run that shares the plan id is then not taken for "published, not committed".
        extra = {**extra, "run_id": run_id} if run_id else extra
        partitioned = None
        if self.partitioning != "date":
            partitioned = (staged.read_good, partition_fields(self.partitioning, staged.schema, "parquet", feed.name))
        return publish_staged(
            staging, plan, feed, outcome_column=staged.outcome_column, ok_value=staged.ok_value,
            write_quarantine=staged.write_quarantine, unpublished=staged.unpublished,
            stats=stats, extra=extra,
            expect_records=expect_records, expect_quarantined=expect_quarantined, pending=run_id,
            partitioned=partitioned,
        )  # fmt: skip

    def positions(self, feed: Feed) -> RecoveredPosition | None:
        return None  # manifests name plans, not which of them the group committed last

    def staged(self, plan_id: str, run_id: str) -> Manifest | None:
        return load_pending(self.location, plan_id, run_id)

    def promote(self, plan_id: str, run_id: str) -> Manifest:
        return promote(self.location, plan_id, run_id)

    def discard(self, plan_id: str, run_id: str) -> Manifest | None:
        return discard(self.location, plan_id, run_id)

    def clear_staging(self, run_id: str, *, dead_only: bool = False) -> None:
        clear_staging(self.location, run_id, dead_only=dead_only)
