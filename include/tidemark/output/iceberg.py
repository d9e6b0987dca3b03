"""Iceberg tables as a feed's output: Spark writes the data files, one pyiceberg catalog commit publishes them.

No ``iceberg-spark-runtime`` release works on pyspark 4.3, so Spark does not talk to
Iceberg here. The job stages and validates exactly as for a Parquet folder; then
:meth:`IcebergPublisher.publish_staged`

1. has Spark rewrite the good records into Parquet files of one partition each (the
   feed's ``iceberg.partition_by``: ``(date, topic)`` by default, :data:`SPECS`, or a value
   field's value or event time, :mod:`tidemark.output.partitioning`), each
   file *containing* the source columns (pyiceberg's ``add_files`` derives a file's
   partition from its column statistics; Spark's ``partitionBy`` would drop them) with
   ``TIMESTAMP_MICROS`` timestamps (Iceberg has no INT96);
2. loads the table (created on first use from the feed's decoded schema, partitioned as
   the feed says, ``commit.retry.num-retries=0``) and looks for the plan id in
   the feed's **ledger** (:mod:`tidemark.output.ledger`, a table property that snapshot
   expiry and compaction leave alone), then in the snapshot history still kept: found, the
   plan is published and nothing is written; then checks the decoded schema against the
   table's (:func:`schema_changes`: columns to add, types to promote, or a refusal);
3. uploads quarantined records to a sibling Parquet folder of the run's own
   (``<output>.quarantine/run_id=<run>/plan_id=<id>/``; a job outside any run:
   ``<output>.quarantine/plan_id=<id>/``, where plans published before are read too), replaced
   whole by a rerun of the run's job, removed when the run is discarded) and the data
   files under the table's location (``data/<partition folders>/<plan id>-<attempt>-<n>.parquet``;
   a file no snapshot references is invisible to readers);
4. for a run's job (the commit protocol, ``docs/ARCHITECTURE.md``): writes a *pending*
   record (``<table location>.pending/<run id>/plan_id=<id>.json``: the files, the snapshot
   properties, the schema to evolve to) and stops; the run's commit step, after the
   group's commit, calls :meth:`IcebergPublisher.promote`, which commits them in **one**
   ``add_files`` with the plan id, run id, feed, group and the per-partition ranges
   (with topic ids) in the snapshot summary, in the same transaction as the schema change,
   if any, as the partition spec's evolution when the feed's choice changed, and as the
   feed's ledger updated with the plan (:func:`commit_files`; a plan
   starting below the ledger's ends is refused). The commit is a compare-and-set on the
   metadata it loaded: if anyone committed to the table since, the catalog refuses it
   (retries off: pyiceberg does not rebase it) and ``promote`` looks at the new ledger
   again, so a plan is never committed twice. A job outside any run commits at once.
5. after the data's commit (or on finding the plan committed: a promotion entered again
   after a crash, a job outside any run rerun), appends the plan's quarantine folder to the
   feed's dead-letter table once (:meth:`IcebergPublisher.append_dead_letters`,
   :mod:`tidemark.output.dead_letter_table`); ``fault_point("iceberg.before_dead_letters")``
   sits between the two commits.

The group's position for recovery (:meth:`IcebergPublisher.positions`) is the ledger's ends
too, as the current snapshot's ancestry bears them out (:func:`checked_ledger`: a rolled-back
plan is taken out and named in a ``table_ledger_mismatch`` event); tables written before the
ledger are read from their history, and their first commit now writes a ledger rebuilt from
it (:func:`ledger_from_history`).

The catalog is whatever pyiceberg opens as the catalog named ``tidemark``:
``TIDEMARK_ICEBERG_CATALOG_URI`` chooses it by scheme (a SQLAlchemy URL for the SQL
catalog, ``postgresql://`` reached through psycopg 3; ``http(s)://`` for a REST catalog;
``thrift://`` for a Hive metastore), ``TIDEMARK_ICEBERG_CATALOG_TYPE`` where the URI does
not say (``glue``); without either, SQLite at ``<state dir>/iceberg_catalog.sqlite``.
Further catalog properties (a REST catalog's ``credential`` or ``token``, ``warehouse``,
Glue's region) come from pyiceberg's own ``PYICEBERG_CATALOG__TIDEMARK__<PROPERTY>``
variables. Credentials come from the environment (or the Airflow connection
``tidemark_iceberg``, see :func:`tidemark.orchestration.dags.iceberg_env`), never from feed
files; S3 settings are the ones :mod:`tidemark.storage` uses. Whatever the catalog, the
commit below is a compare-and-set: pyiceberg sends the metadata it read as the commit's
requirement (SQL: a conditional update of the pointer row; REST: the server checks it;
Glue: the table version), and the table's ``commit.retry.num-retries=0`` keeps it from
rebasing a refused commit.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, state_location
from tidemark.errors import ConfigError, PublishError, SchemaError, StateStoreError
from tidemark.faults import fault_point
from tidemark.output.base import QUARANTINE_DIR, STAGING_DIR, FileEntry, Manifest, StagedRecords
from tidemark.output.dead_letter_table import append_plan, other_feeds
from tidemark.output.ledger import Ledger, LedgerPlan, Reconciled, SnapshotFacts, ledger_key, overlap, reconcile
from tidemark.output.owner import OWNER_KEY, adopt, check_owner
from tidemark.output.partitioning import (
    PartitionField,
    folder_value,
    kafka_fields,
    partition_fields,
    spec_pairs,
)
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
)
from tidemark.planning.plan import Event, Plan, RecoveredPosition
from tidemark.redaction import redact, redact_url
from tidemark.spark.session import session_conf
from tidemark.spark.stats import RangeStats
from tidemark.staged import PARQUET_TIMESTAMPS, PASS_DIR
from tidemark.storage import Location, remove_objects, s3_settings

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.types import IcebergType
    from pyspark.sql.types import StructType

CATALOG_URI_ENV = "TIDEMARK_ICEBERG_CATALOG_URI"
CATALOG_TYPE_ENV = "TIDEMARK_ICEBERG_CATALOG_TYPE"
CATALOG_NAME = "tidemark"
# The table's partition spec per Kafka-timestamp choice (``iceberg.partition_by``): (source column, transform), in
# spec order. ``date`` is the spec every table had before the choice: the date column first, then topic. A value
# field's spec depends on the field's type (:func:`tidemark.output.partitioning.partition_fields`).
SPECS: dict[str, tuple[tuple[str, str], ...]] = {
    choice: tuple((f.column, f.transform) for f in kafka_fields(choice))
    for choice in ("date", "hour", "day", "month", "none")
}
NO_RETRY = {"commit.retry.num-retries": "0"}
# Snapshot summary properties: what names the plan in the table's history.
PLAN_KEY = "tidemark.plan-id"
RUN_KEY = "tidemark.run-id"
FEED_KEY = "tidemark.feed"
GROUP_KEY = "tidemark.group"
RANGES_KEY = "tidemark.ranges"
RECORDS_KEY = "tidemark.records"
QUARANTINED_KEY = "tidemark.quarantined"
# On a snapshot that took a plan's files out again: written by Tidemark versions that retracted
# refused runs' publications (before the commit protocol showed only committed plans); still read.
RETRACTED_KEY = "tidemark.retracted-plan-id"
_COPY_PREFIX = "_tidemark_"  # Spark's partition folders are copies of the partition values: the files keep the columns
TABLE_FILES_DIR = "_iceberg"  # inside a staging folder: the good records rewritten as table files


def catalog_uri() -> str | None:
    """The catalog's URI: ``TIDEMARK_ICEBERG_CATALOG_URI``, else SQLite in a local state dir.

    ``None`` when ``TIDEMARK_ICEBERG_CATALOG_TYPE`` names a catalog that needs no URI (Glue).
    """
    chosen = os.environ.get(CATALOG_URI_ENV) or None
    if chosen is None and os.environ.get(CATALOG_TYPE_ENV):
        return None
    if chosen is None:
        state = state_location()
        if not state.is_local:
            raise ConfigError(
                f"the state dir {state.url} is on an object store, so the Iceberg catalog must be shared too: set "
                f"{CATALOG_URI_ENV}=postgresql://user:password@host:port/db (or the Airflow connection)"
            )
        state.local_path().mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{state.local_path() / 'iceberg_catalog.sqlite'}"
    scheme, sep, rest = chosen.partition("://")
    if scheme in ("postgresql", "postgres"):  # psycopg 3 is installed, psycopg2 (SQLAlchemy's default) is not
        return f"postgresql+psycopg{sep}{rest}"
    return chosen


def open_catalog() -> Catalog:
    return _catalog(catalog_uri(), os.environ.get(CATALOG_TYPE_ENV) or None, *_s3_properties())


def catalog_properties(uri: str | None, kind: str | None, endpoint: str | None, region: str | None) -> dict[str, str]:
    """What Tidemark passes to pyiceberg's ``load_catalog`` (pyiceberg adds its own ``PYICEBERG_CATALOG__*``)."""
    properties = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    if uri is not None:
        properties["uri"] = uri
    if kind is not None:
        properties["type"] = kind
    # Only where to reach S3: the credentials stay with the SDK's own chain (AWS_* variables,
    # profiles, roles), so no secret is ever a catalog or table property.
    if endpoint:
        properties["s3.endpoint"] = endpoint
    if region:
        properties["s3.region"] = region
    return properties


@lru_cache(maxsize=4)
def _catalog(uri: str | None, kind: str | None, endpoint: str | None, region: str | None) -> Catalog:
    from pyiceberg.catalog import load_catalog

    where = redact_url(uri) if uri is not None else f"{CATALOG_TYPE_ENV}={kind}"
    try:
        return load_catalog(CATALOG_NAME, **catalog_properties(uri, kind, endpoint, region))
    except Exception as exc:  # noqa: BLE001 - any driver error; re-raised with the password scrubbed
        message = str(exc)
        message = redact(message, {_password(uri) if uri is not None else None})
        raise ConfigError(
            f"cannot open the Iceberg catalog at {where}: {message}. Set {CATALOG_URI_ENV} (sqlite:///..., "
            f"postgresql://..., https://... for REST, thrift://... for Hive) or {CATALOG_TYPE_ENV} (glue)"
        ) from None


def _password(uri: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        return make_url(uri).password  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - not a URL: nothing to hide
        return None


def _s3_properties() -> tuple[str | None, str | None]:
    """The catalog's S3 endpoint and region: :func:`tidemark.storage.s3_settings`, a region for an endpoint."""
    endpoint, region, _ = s3_settings()
    return endpoint, region or ("us-east-1" if endpoint else None)


def table_schema(schema: StructType) -> pa.Schema:
    """The table's schema from the feed's decoded Spark schema: every field optional, timestamps in µs UTC.

    Optional because Spark writes every Parquet column as optional; a required table
    field would refuse its own files.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    def loosen(t: pa.DataType) -> pa.DataType:
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, loosen(f.type), nullable=True) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(pa.field("element", loosen(t.value_type), nullable=True))
        if pa.types.is_map(t):
            return pa.map_(loosen(t.key_type), loosen(t.item_type))
        return t

    arrow = to_arrow_schema(schema, timezone="UTC")
    return pa.schema([pa.field(f.name, loosen(f.type), nullable=True) for f in arrow])


def plan_history(table: Table) -> list[Snapshot]:
    """The snapshots of the table's main branch, newest first (rolled-back ones are not history)."""
    from pyiceberg.table.snapshots import ancestors_of

    return list(ancestors_of(table.current_snapshot(), table.metadata))


def _transform(name: str) -> Any:
    from pyiceberg.transforms import (
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )

    if name.startswith("truncate["):
        return TruncateTransform(int(name[len("truncate[") : -1]))
    transforms = {"identity": IdentityTransform, "hour": HourTransform, "day": DayTransform, "month": MonthTransform,
                  "year": YearTransform}  # fmt: skip
    return transforms[name]()


PartitionSpecArg = str | Sequence[PartitionField]  # a Kafka-timestamp choice by name, or the fields themselves


def _fields(spec: PartitionSpecArg) -> tuple[PartitionField, ...]:
    return kafka_fields(spec) if isinstance(spec, str) else tuple(spec)


def spec_of(table: Table) -> set[tuple[str, str]]:
    """The table's current partition spec as (source column, transform) pairs (void fields left out)."""
    schema = table.schema()
    return {(schema.find_column_name(f.source_id) or "?", str(f.transform)) for f in table.spec().fields
            if str(f.transform) != "void"}  # fmt: skip


def evolve_spec(tx: Any, table: Table, partition_by: PartitionSpecArg) -> bool:
    """In transaction ``tx``: make ``table``'s spec ``partition_by``'s (a choice of :data:`SPECS`, or the fields of a
    value field's, :mod:`tidemark.output.partitioning`); whether it changed.

    Iceberg's partition evolution: files already in the table keep the spec they were
    written with, new files take the new one; readers prune both.
    """
    fields = _fields(partition_by)
    wanted = spec_pairs(fields)
    current = spec_of(table)
    if current == wanted:
        return False
    with tx.update_spec() as update:
        for f in table.spec().fields:
            source = table.schema().find_column_name(f.source_id)
            if (source, str(f.transform)) not in wanted and str(f.transform) != "void":
                update.remove_field(f.name)
        for part in fields:
            if (part.column, part.transform) not in current:
                update.add_field(part.column, _transform(part.transform), part.name)
    return True


class TableChangedError(PublishError):
    """The catalog refused a commit because the table changed since it was loaded (the compare-and-set)."""


def table_ledger(table: Table, feed: str) -> Ledger | None:
    """What ``table`` holds of ``feed``: its ledger property as the current snapshot's ancestry bears it out
    (:func:`checked_ledger`), else (a table written by an older Tidemark) the ledger rebuilt from the snapshot
    summaries still in its history; ``None`` when neither names the feed."""
    if ledger_key(feed) in table.properties:
        return checked_ledger(table, feed).ledger
    return ledger_from_history(table, feed)


def checked_ledger(table: Table, feed: str) -> Reconciled:
    """``feed``'s ledger property checked against the table's current ancestry
    (:func:`~tidemark.output.ledger.reconcile`): a plan of it that was rolled back is taken out, with the ends it
    moved. Only for a table with the property."""
    ancestry = plan_history(table)
    ids = {s.snapshot_id for s in ancestry}
    detached = {s.snapshot_id: _facts(s, feed) for s in table.snapshots() if s.snapshot_id not in ids}
    return reconcile(Ledger.from_json(table.properties[ledger_key(feed)]), [_facts(s, feed) for s in ancestry],
                     detached)  # fmt: skip


def _facts(snapshot: Snapshot, feed: str) -> SnapshotFacts:
    props: Mapping[str, str] = {} if snapshot.summary is None else snapshot.summary.additional_properties
    ours = props.get(FEED_KEY) == feed and bool(props.get(PLAN_KEY))
    return SnapshotFacts(
        snapshot.snapshot_id, snapshot.timestamp_ms, plan_id=str(props[PLAN_KEY]) if ours else None,
        ranges=tuple(json.loads(props.get(RANGES_KEY) or "[]")) if ours else (),
        tidemark=any(k.startswith("tidemark.") for k in props), added_records=int(props.get("added-records") or 0),
    )  # fmt: skip


def mismatch_events(checked: Reconciled, table_name: str) -> tuple[Event, ...]:
    """What disagreed between a table's ledger and its current ancestry, as ``table_ledger_mismatch`` events."""
    events = []
    ledger = checked.ledger
    if checked.rolled_back:
        plans = []
        for p in checked.rolled_back:
            ranges = checked.rolled_back_ranges.get(p.plan_id)
            said = ("its snapshot is gone, its ranges unknown" if ranges is None else ", ".join(
                f"{r['topic']}[{r['partition']}] [{r['start']}, {r['end']})" for r in ranges
                if int(r["end"]) > int(r["start"])) or "no records")  # fmt: skip
            plans.append(f"plan {p.plan_id} (run {p.run_id}, snapshot {p.snapshot_id}: {said})")
        events.append(Event(
            "table_ledger_mismatch",
            f"Iceberg table {table_name}: the ledger of feed '{ledger.feed}' names {len(plans)} plan(s) that are not "
            f"in the current snapshot's ancestry (rolled back): {'; '.join(plans[:10])}. Their records are not in the "
            "table: the position is taken from the plans the ancestry holds, so those ranges are read again",
            details={"table": table_name, "rolled_back": [p.plan_id for p in checked.rolled_back],
                     "snapshots": [p.snapshot_id for p in checked.rolled_back]},
        ))  # fmt: skip
    for u in checked.unplaced:
        events.append(Event(
            "table_ledger_mismatch",
            f"Iceberg table {table_name}: {u.topic}[{u.partition}] cannot be placed: the ledger of feed "
            f"'{ledger.feed}' records the table holding up to offset {u.recorded}, counting a rolled-back plan whose "
            "ranges are gone with its snapshot, and no plan in the current ancestry shows where the table ends. No "
            "position is recovered for it (the feed's reset policy decides), and no plan starting below "
            f"{u.recorded} is committed to the table. Reset the group to where the table ends (`tidemark` runs "
            "then follow it)",
            topic=u.topic, partition=u.partition,
            details={"table": table_name, "unplaced": True, "recorded_end": u.recorded, "topic_id": u.topic_id},
        ))  # fmt: skip
    if checked.foreign:
        named = ", ".join(f"{s.snapshot_id} ({s.added_records} records)" for s in checked.foreign[:10])
        events.append(Event(
            "table_ledger_mismatch",
            f"Iceberg table {table_name}: snapshot(s) {named} of the current ancestry added records and were "
            f"written by no Tidemark plan (another writer, or a compaction by another engine). The ledger of feed "
            f"'{ledger.feed}' did not write them; its positions stand, and which offsets those records are is not "
            "placed",
            details={"table": table_name, "snapshots": [s.snapshot_id for s in checked.foreign]},
        ))  # fmt: skip
    return tuple(events)


def ledger_from_history(table: Table, feed: str) -> Ledger | None:
    """The ledger of an old table: its main branch's snapshots of ``feed``, oldest first, as if committed now."""
    retracted: set[str] = set()
    found: list[tuple[Snapshot, Mapping[str, str]]] = []
    for snapshot in plan_history(table):  # newest first: a retraction comes before what it retracted
        summary = snapshot.summary
        if summary is None:
            continue
        if summary.get(RETRACTED_KEY):
            retracted.add(str(summary.get(RETRACTED_KEY)))
        if summary.get(FEED_KEY) == feed and summary.get(PLAN_KEY) and summary.get(PLAN_KEY) not in retracted:
            found.append((snapshot, summary.additional_properties))
    if not found:
        return None
    ledger = Ledger(feed=feed, group=str(found[0][1].get(GROUP_KEY)))
    for snapshot, props in reversed(found):
        entry = _ledger_plan(props, snapshot.snapshot_id, snapshot.timestamp_ms)
        ledger = ledger.with_plan(json.loads(props.get(RANGES_KEY) or "[]"), entry, str(props.get(GROUP_KEY)))
    return replace(ledger, source="history")


def _ledger_plan(properties: Mapping[str, str], snapshot_id: int | None, committed_ms: int) -> LedgerPlan:
    return LedgerPlan(
        plan_id=str(properties[PLAN_KEY]),
        run_id=properties.get(RUN_KEY),
        records=int(properties.get(RECORDS_KEY) or 0),
        quarantined=int(properties.get(QUARANTINED_KEY) or 0),
        snapshot_id=snapshot_id,
        committed_ms=committed_ms,
    )


def schema_changes(current: Schema, decoded: pa.Schema, table_name: str, records: str) -> list[str]:
    """How the table's schema must change to take records of the ``decoded`` schema; raises when it cannot.

    The rule: a column the records have and the table lacks is added (optional; older data
    files read it as null); a column whose table type the records widen the way Iceberg
    allows (int → long, float → double, a decimal's precision at the same scale) is
    promoted; a column the table has and the records lack stays, null in the new files.
    Any other difference (a narrowing such as long → int, another type, a struct where a
    value was) is refused with a :class:`SchemaError` naming the table, the column, both
    types and ``records`` (which records were refused). Nested fields follow the same rule.
    Returned: one line per change (``added channel: string``, ``promoted id: int -> long``).
    """
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids

    changes: list[str] = []
    refused: list[str] = []
    _compare(current.as_struct(), _pyarrow_to_schema_without_ids(decoded).as_struct(), "", changes, refused)
    if refused:
        raise SchemaError(
            f"Iceberg table {table_name} cannot take {records}: {'; '.join(refused)}. An Iceberg column only "
            "widens (int -> long, float -> double, a decimal's precision); the table keeps what it has. Make the "
            "feed's decoded schema fit the table: pin deserialization.schema_version to a version with the "
            "table's type or a wider one (Avro resolves newer records to it), or restore the field's type in the "
            "producer's schema, or publish to a new table (iceberg.table); nothing was published or committed"
        )
    return changes


def _compare(table: IcebergType, decoded: IcebergType, path: str, changes: list[str], refused: list[str]) -> None:
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(table, StructType) and isinstance(decoded, StructType):
        for f in decoded.fields:
            name = f"{path}.{f.name}" if path else f.name
            existing = table.field_by_name(f.name)
            if existing is None:
                changes.append(f"added {name}: {f.field_type}")
            else:
                _compare(existing.field_type, f.field_type, name, changes, refused)
    elif isinstance(table, ListType) and isinstance(decoded, ListType):
        _compare(table.element_type, decoded.element_type, f"{path}.element", changes, refused)
    elif isinstance(table, MapType) and isinstance(decoded, MapType):
        _compare(table.key_type, decoded.key_type, f"{path}.key", changes, refused)
        _compare(table.value_type, decoded.value_type, f"{path}.value", changes, refused)
    elif table.is_primitive and decoded.is_primitive and table == decoded:
        return
    elif _widens(table, decoded):
        changes.append(f"promoted {path}: {table} -> {decoded}")
    else:
        kind = "a narrowing" if _widens(decoded, table) else "not a promotion Iceberg allows"
        refused.append(f"column '{path}' is {table} in the table and {decoded} in the records ({kind})")


def _widens(old: IcebergType, new: IcebergType) -> bool:
    """Iceberg's type promotions (the table format's own list, narrower than Avro's: no int -> double)."""
    from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType

    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return old.scale == new.scale and new.precision > old.precision
    return (isinstance(old, IntegerType) and isinstance(new, LongType)) or (
        isinstance(old, FloatType) and isinstance(new, DoubleType)
    )


def _records_of(plan: Plan) -> str:
    """The plan's records as a refusal names them: its id and its non-empty ranges (the first five)."""
    ranges = [f"{t}[{n}] offsets [{start}, {end})" for t, n, start, end in plan.ranges() if end > start]
    shown = ", ".join(ranges[:5]) + (f" and {len(ranges) - 5} more ranges" if len(ranges) > 5 else "")
    return f"the records of plan {plan.plan_id} ({shown or 'no records'})"


class IcebergPublisher:
    """The feed's Iceberg table (see the module docstring)."""

    kind = "iceberg"

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.table_name = feed.iceberg_table
        self.location = feed.output_location()
        chosen = feed.iceberg.quarantine if feed.iceberg is not None else None
        self.quarantine = Location.of(chosen) if chosen else self.location.with_name(f"{self.location.name}.quarantine")
        self.dead_letters_name = feed.iceberg_dead_letters
        self.dead_letters_location = self.location.with_name(f"{self.location.name}.dead_letters")
        self.partitioning = feed.partitioning

    def describe(self) -> str:
        return f"iceberg:{self.table_name} ({self.location})"

    # -- the table -----------------------------------------------------------------------

    def load(self) -> Table | None:
        """The feed's table, or ``None`` before its first commit; refused when another feed owns it
        (:func:`tidemark.output.owner.check_owner`)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = open_catalog().load_table(self.table_name)
        except NoSuchTableError:
            return None
        check_owner(table, self.table_name, self.feed.name)
        return table

    def partition_fields(self, schema: StructType) -> tuple[PartitionField, ...]:
        """The feed's partitioning of records of ``schema`` (:func:`tidemark.output.partitioning.partition_fields`)."""
        return partition_fields(self.partitioning, schema, "iceberg", self.feed.name)

    def load_or_create(self, schema: StructType) -> Table:
        """The table, created on first use from ``schema``: partitioned as the feed says (:meth:`partition_fields`),
        no commit retries."""
        from pyiceberg.exceptions import TableAlreadyExistsError

        table = self.load()
        if table is None:
            catalog = open_catalog()
            namespace = self.table_name.split(".", 1)[0]
            catalog.create_namespace_if_not_exists(namespace)
            try:
                with (
                    catalog.create_table_transaction(
                        self.table_name,
                        schema=self.table_arrow(schema),
                        location=self.location.url,
                        properties={**NO_RETRY, OWNER_KEY: self.feed.name},
                    ) as create,
                    create.update_spec() as spec,
                ):
                    for f in self.partition_fields(schema):
                        spec.add_field(f.column, _transform(f.transform), f.name)
            except TableAlreadyExistsError:
                pass  # created meanwhile by another run: use it
            table = catalog.load_table(self.table_name)
        table = adopt(table, self.table_name, self.feed.name)
        if table.properties.get("commit.retry.num-retries") != "0":
            # A rebased retry would commit past the history check below: never allow one.
            with table.transaction() as tx:
                tx.set_properties(NO_RETRY)
            table = open_catalog().load_table(self.table_name)
        return table

    # -- what a keyed table (tidemark.output.changes.ChangesPublisher) does otherwise ------------

    def check_staged(self, plan_id: str, paths: Sequence[Path]) -> None:
        """Refuse, before anything is committed, staged data files the commit could not take (a keyed table's merge
        checks its changes here); an append takes any."""
        del plan_id, paths

    def table_arrow(self, schema: StructType) -> pa.Schema:
        """The table's schema for records of the decoded ``schema``: the records' own columns (:func:`table_schema`)."""
        return table_schema(schema)

    def commit(
        self,
        table: Table,
        paths: list[str],
        properties: Mapping[str, str],
        evolve_to: pa.Schema | None,
        partition_by: PartitionSpecArg | None,
    ) -> dict[str, Any]:
        """The plan's one commit (:func:`commit_files`); what it adds to the publication's ``extra``."""
        commit_files(table, paths, properties, self.table_name, evolve_to=evolve_to, partition_by=partition_by)
        return {}

    # -- the Publisher protocol ------------------------------------------------------------

    def check_schema(self, schema: StructType, plan: Plan) -> None:
        """Refuse, before anything is staged, records the table cannot take (:func:`schema_changes`) or the feed's
        partitioning cannot partition (a value field missing or of another type)."""
        self.partition_fields(schema)
        table = self.load()
        if table is not None:
            schema_changes(table.schema(), self.table_arrow(schema), self.table_name, _records_of(plan))

    def published(self, plan_id: str) -> Manifest | None:
        table = self.load()
        return None if table is None else self._find(table, plan_id)

    def _find(self, table: Table, plan_id: str) -> Manifest | None:
        """``plan_id``'s publication: the feed's ledger first (it survives snapshot expiry and compaction), then
        the history still kept (a plan older than the ledger's recent plans, or a table without a ledger)."""
        # a table without one: the history below; a plan of it rolled back is not in the table
        ledger = (
            checked_ledger(table, self.feed.name).ledger if ledger_key(self.feed.name) in table.properties else None
        )
        entry = None if ledger is None else ledger.find(plan_id)
        if ledger is not None and entry is not None:
            kept = None if entry.snapshot_id is None else table.metadata.snapshot_by_id(entry.snapshot_id)
            summary = kept.summary if kept is not None else None
            return Manifest(
                plan_id=plan_id,
                feed=self.feed.name,
                group=ledger.group,
                location=self.describe(),
                published_at=datetime.fromtimestamp(entry.committed_ms / 1000, UTC).isoformat(),
                records=entry.records,
                quarantined=entry.quarantined,
                # the ranges live in the snapshot's summary; an expired snapshot's are gone (reports only)
                ranges=tuple(json.loads(summary.get(RANGES_KEY) or "[]")) if summary is not None else (),
                files=(),
                extra={
                    "format": "iceberg",
                    "table": self.table_name,
                    "snapshot_id": entry.snapshot_id,
                    "run_id": entry.run_id,
                    "found_in": "ledger",
                },
                reused=True,
            )
        for snapshot in plan_history(table):
            summary = snapshot.summary
            if summary is not None and summary.get(RETRACTED_KEY) == plan_id:
                return None  # newest first: retracted after its last publication
            if summary is not None and summary.get(PLAN_KEY) == plan_id:
                return Manifest(
                    plan_id=plan_id,
                    feed=str(summary.get(FEED_KEY)),
                    group=str(summary.get(GROUP_KEY)),
                    location=self.describe(),
                    published_at=datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC).isoformat(),
                    records=int(summary.get(RECORDS_KEY) or 0),
                    quarantined=int(summary.get(QUARANTINED_KEY) or 0),
                    ranges=tuple(json.loads(summary.get(RANGES_KEY) or "[]")),
                    files=(),
                    extra={
                        "format": "iceberg",
                        "table": self.table_name,
                        "snapshot_id": snapshot.snapshot_id,
                        "run_id": summary.get(RUN_KEY),
                    },
                    reused=True,
                )
        return None

    def new_staging(self, plan_id: str, on_store: bool = False, run_id: str | None = None) -> Staging:
        # The driver's folder is local and outside the table's location (a local table's
        # location would otherwise hold it, and orphan-file cleanup would race with it).
        # On the store Spark stages under <location>/_staging/, which no snapshot references:
        # orphan-file removal may take it only once it is older than the run.
        name = staging_name(plan_id, run_id, uuid.uuid4().hex[:12])
        root = make_root(prepare_staging_base(local_staging_base(self.location), plan_id, run_id), name)
        remote = prepare_remote_staging(self.location / STAGING_DIR, plan_id, run_id) / name if on_store else None
        return Staging(self.location, plan_id, root, remote)

    def clear_staging(self, run_id: str, *, dead_only: bool = False) -> None:
        remove_run_staging(local_staging_base(self.location), None if self.location.is_local
                           else self.location / STAGING_DIR, run_id, dead_only=dead_only)  # fmt: skip

    # -- the quarantine: one folder per run, beside the table ---------------------------------

    def run_quarantine(self, plan_id: str, run_id: str | None) -> Location:
        """Where run ``run_id``'s job writes ``plan_id``'s quarantine: ``<quarantine>/run_id=<run>/plan_id=<id>/``,
        the run's own (two runs of one plan never share it); a job outside any run:
        ``<quarantine>/plan_id=<id>/``."""
        if run_id is None:
            return self.quarantine / f"plan_id={plan_id}"
        return self.quarantine / f"run_id={run_id}" / f"plan_id={plan_id}"

    def quarantine_folder(self, plan_id: str, run_id: str | None) -> Location:
        """The quarantine folder of ``plan_id`` as run ``run_id`` published it: the run's own folder, else (a plan
        published before quarantines were kept per run, or by a job outside any run) ``<quarantine>/plan_id=<id>/``.
        """
        own = self.run_quarantine(plan_id, run_id)
        return own if run_id is None or own.exists() else self.run_quarantine(plan_id, None)

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
        try:
            return self._publish(staging, plan, feed, staged, stats, extra, expect_records, expect_quarantined, run_id)
        except (PublishError, SchemaError):
            staging.discard()
            raise
        except Exception as exc:
            staging.discard()
            raise PublishError(
                f"publishing plan {plan.plan_id} of feed '{feed.name}' to Iceberg table {self.table_name} failed: "
                f"{exc}. Nothing was committed to the table; rerun to publish it"
            ) from exc

    def _publish(
        self,
        staging: Staging,
        plan: Plan,
        feed: Feed,
        staged: StagedRecords,
        stats: Sequence[RangeStats],
        extra: Mapping[str, Any],
        expect_records: int,
        expect_quarantined: int,
        run_id: str | None,
    ) -> Manifest:
        if plan.feed != feed.name or plan.plan_id != staging.plan_id:
            raise PublishError(f"plan {plan.plan_id} (feed '{plan.feed}') does not match staging {staging.root}")
        fields = self.partition_fields(staged.schema)
        data, bad, records, quarantined = self._staged_files(
            staging, plan, staged, expect_records, expect_quarantined, fields
        )
        self.check_staged(plan.plan_id, [path for path, _ in data])

        table = self.load_or_create(staged.schema)  # the compare-and-set basis of the commit below
        done = self._find(table, plan.plan_id)
        if done is not None:  # published by an earlier attempt: write nothing
            staging.discard()
            if run_id is None:  # that attempt committed at once, and may have crashed before its dead letters
                run = done.extra.get("run_id")
                self.append_dead_letters(plan.plan_id, run, done.published_at, done.quarantined)
            return done
        # Checked again on the table the commit is based on: it may have changed since check_schema.
        decoded = self.table_arrow(staged.schema)
        changes = schema_changes(table.schema(), decoded, self.table_name, _records_of(plan))

        quarantine = self._replace_quarantine(staging, plan, staged, bad, run_id)
        names, entries = self._upload_data(staging, plan, data)

        ends = {(p.topic, p.partition): p for p in plan.partitions}
        counted = {(s.topic, s.partition): s.records for s in stats}
        ranges = [{"topic": t, "partition": n, "start": p.start, "end": p.end, "records": counted.get((t, n), 0),
                   **({"topic_id": p.topic_id} if p.topic_id else {})}
                  for (t, n), p in sorted(ends.items())]  # fmt: skip
        properties = {
            PLAN_KEY: plan.plan_id, FEED_KEY: feed.name, GROUP_KEY: plan.group, RANGES_KEY: json.dumps(ranges),
            RECORDS_KEY: str(records), QUARANTINED_KEY: str(quarantined), **({RUN_KEY: run_id} if run_id else {}),
        }  # fmt: skip
        paths = [str(self.location / n) for n in names]
        manifest = Manifest(
            plan_id=plan.plan_id,
            feed=feed.name,
            group=plan.group,
            location=self.describe(),
            published_at=datetime.now(UTC).isoformat(),
            records=records,
            quarantined=quarantined,
            ranges=tuple(s.to_dict() for s in stats),
            files=tuple(entries),
            extra={
                **extra,
                "format": "iceberg",
                "table": self.table_name,
                "run_id": run_id,
                "quarantine": str(quarantine) if bad else None,
                "schema_changes": changes,
            },
        )
        if run_id is not None:  # pending: the data files are in no snapshot until promote() commits them
            pending = {"manifest": manifest.to_dict(), "paths": paths, "properties": properties,
                       "schema": _schema_text(decoded) if changes else None,
                       "partition_spec": [f.as_list() for f in fields]}  # fmt: skip
            self._pending(plan.plan_id, run_id).write_text(json.dumps(pending, indent=2, sort_keys=True))
            staging.discard()
            return manifest
        fault_point("iceberg.before_commit")  # data files written, catalog not committed
        done_extra = self.commit(table, paths, properties, decoded if changes else None, fields)
        snapshot = table.current_snapshot()
        staging.discard()
        fault_point("iceberg.before_dead_letters")  # data committed, its dead letters not yet appended
        self.append_dead_letters(plan.plan_id, None, _committed_at(snapshot), quarantined)
        return replace(
            manifest,
            extra={**manifest.extra, **done_extra, "snapshot_id": None if snapshot is None else snapshot.snapshot_id},
        )

    # -- pending publications: staged by a run's job, committed to the table after the group's commit --

    def _pending(self, plan_id: str, run_id: str) -> Location:
        return self.location.with_name(f"{self.location.name}.pending") / run_id / f"plan_id={plan_id}.json"

    def _load_pending(self, plan_id: str, run_id: str) -> dict[str, Any] | None:
        path = self._pending(plan_id, run_id)
        return json.loads(path.read_text()) if path.exists() else None

    def staged(self, plan_id: str, run_id: str) -> Manifest | None:
        doc = self._load_pending(plan_id, run_id)
        return None if doc is None else Manifest.from_dict(doc["manifest"])

    def promote(self, plan_id: str, run_id: str) -> Manifest:
        """Commit run ``run_id``'s staged files to the table in one snapshot, unless the plan is already in it.

        The history check and the commit are one compare-and-set (``commit_files``); when
        another writer (maintenance, another feed) committed in between, the check is made
        again on the new metadata, so a plan is never committed twice.
        """
        doc = self._load_pending(plan_id, run_id)
        self.clear_staging(run_id)
        for _ in range(5):
            table = self.load()
            found = None if table is None else self._find(table, plan_id)
            if found is not None:  # committed by an earlier promotion, which may have crashed before its dead letters
                run = found.extra.get("run_id") or run_id
                folder = self._pending_quarantine(doc, plan_id, run_id) if doc is not None and run == run_id else None
                self.append_dead_letters(plan_id, run, found.published_at, found.quarantined, folder)
                self._remove_pending(plan_id, run_id) if doc is not None else None
                return found
            if doc is None or table is None:
                raise PublishError(
                    f"plan {plan_id} of run {run_id}: nothing is staged for Iceberg table {self.table_name} and the "
                    "plan is not in the table; the run's job did not finish staging it"
                )
            evolve_to = _schema_of(doc["schema"]) if doc.get("schema") else None
            if evolve_to is not None:
                schema_changes(table.schema(), evolve_to, self.table_name, f"plan {plan_id}")
            fault_point("iceberg.before_commit")  # data files written, catalog not committed
            try:
                done_extra = self.commit(table, list(doc["paths"]), doc["properties"], evolve_to, _pending_spec(doc))
            except TableChangedError:
                continue  # the table changed meanwhile: look at its ledger again
            snapshot = table.current_snapshot()
            fault_point("iceberg.before_dead_letters")  # data committed, its dead letters not yet appended
            manifest = Manifest.from_dict(doc["manifest"])
            self.append_dead_letters(plan_id, run_id, _committed_at(snapshot), manifest.quarantined,
                                     self._pending_quarantine(doc, plan_id, run_id))  # fmt: skip
            self._remove_pending(plan_id, run_id)
            extra = {**manifest.extra, **done_extra, "snapshot_id": None if snapshot is None else snapshot.snapshot_id}
            return replace(manifest, extra=extra)
        raise PublishError(
            f"Iceberg table {self.table_name}: the commit of plan {plan_id} (run {run_id}) was refused 5 times because "
            "the table kept changing; the group's offsets are committed and the plan stays pending: the feed's next "
            "run commits it to the table before planning"
        )

    def append_dead_letters(
        self,
        plan_id: str,
        run_id: str | None,
        committed_at: datetime | str,
        quarantined: int,
        folder: Location | None = None,
    ) -> int:
        """Append committed plan ``plan_id``'s quarantine folder (``quarantined`` records, as its commit recorded) to
        the feed's dead-letter table, unless the table holds the plan's rows already; the rows appended
        (:func:`tidemark.output.dead_letter_table.append_plan`). ``folder``: the one the run's pending record names,
        else :meth:`quarantine_folder` of the run that committed the plan.

        Called after the plan's catalog commit, by the promotion and by every later promotion of
        the same plan (promote is re-entered after a crash), and by a job outside any run.
        """
        if not quarantined:  # nothing to append, whatever another run left in a folder of the same plan
            return 0
        at = committed_at if isinstance(committed_at, datetime) else datetime.fromisoformat(committed_at)
        properties = {PLAN_KEY: plan_id, FEED_KEY: self.feed.name, **({RUN_KEY: run_id} if run_id else {})}
        return append_plan(
            open_catalog(), self.dead_letters_name, self.dead_letters_location,
            folder if folder is not None else self.quarantine_folder(plan_id, run_id),
            feed=self.feed.name, plan_id=plan_id, run_id=run_id, dead_lettered_at=at, snapshot_properties=properties,
            table_properties={**NO_RETRY, OWNER_KEY: self.feed.name}, expected=quarantined,
        )  # fmt: skip

    def dead_letter_table(self) -> Table | None:
        """The feed's dead-letter table, or ``None`` before its first dead letter."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = open_catalog().load_table(self.dead_letters_name)
        except NoSuchTableError:
            return None
        check_owner(table, self.dead_letters_name, self.feed.name, other_feeds)
        return table

    def discard(self, plan_id: str, run_id: str) -> Manifest | None:
        """Delete run ``run_id``'s own staged files: its data files (in no snapshot: its commit of the group was
        refused), its quarantine folder (:meth:`run_quarantine`, never another run's), what its jobs left in
        staging, then its pending record. Idempotent, so a discard cut short is finished by the next call.

        When the table holds the plan as this run committed it (the run is given up after its catalog commit, e.g.
        by ``tidemark abandon`` of a run stuck on its dead letters), the snapshot references the files: only the
        pending record goes.
        """
        doc = self._load_pending(plan_id, run_id)
        self.clear_staging(run_id)
        quarantine = self.run_quarantine(plan_id, run_id)
        kept = quarantine.exists()
        table = self.load() if doc is not None or kept else None
        found = None if table is None else self._find(table, plan_id)
        if found is not None and found.extra.get("run_id") == run_id:  # its files and dead letters are the table's
            if doc is None:
                return None
            self._remove_pending(plan_id, run_id)
            return Manifest.from_dict(doc["manifest"])
        for path in doc["paths"] if doc is not None else ():
            with contextlib.suppress(FileNotFoundError, StateStoreError):
                Location.of(path).remove_file()
        if kept:  # the run's own folder, which no commit of the plan by this run references
            with contextlib.suppress(FileNotFoundError, StateStoreError):
                remove_objects(quarantine)
        if doc is None:
            return None
        fault_point("discard.before_pending")  # the run's own files removed, its pending record not yet
        self._remove_pending(plan_id, run_id)
        return Manifest.from_dict(doc["manifest"])

    def _remove_pending(self, plan_id: str, run_id: str) -> None:
        """Delete run ``run_id``'s pending record of ``plan_id``, and its folder once empty (locally)."""
        record = self._pending(plan_id, run_id)
        record.remove_file()
        if record.is_local:
            with contextlib.suppress(OSError):
                record.local_path().parent.rmdir()

    def _pending_quarantine(self, doc: Mapping[str, Any], plan_id: str, run_id: str) -> Location:
        """The quarantine folder a pending record names (the run's own, or where an older Tidemark put it)."""
        named = doc["manifest"].get("extra", {}).get("quarantine")
        return Location.of(named) if named else self.run_quarantine(plan_id, run_id)

    def _staged_files(
        self,
        staging: Staging,
        plan: Plan,
        staged: StagedRecords,
        expect_records: int,
        expect_quarantined: int,
        fields: tuple[PartitionField, ...],
    ) -> tuple[list[tuple[Path, PartitionKey]], list[str], int, int]:
        """The staged data files (rewritten as table files) and quarantine folders, counted against validation."""
        import pyarrow.parquet as pq

        good = f"{staged.outcome_column}={staged.ok_value}"
        outcomes = staging.outcomes(staged.outcome_column)
        files_root = staging.root / TABLE_FILES_DIR
        if good in outcomes:
            _write_table_files(staged.read_good(staging.url(PASS_DIR, good)), staging.url(TABLE_FILES_DIR), fields)
            staging.pull(TABLE_FILES_DIR, files_root)
        data = _by_partition(files_root)
        bad = [staging.url(PASS_DIR, name) for name in outcomes if name != good]
        records = sum(pq.read_metadata(path).num_rows for path, _ in data)
        quarantined = staging.parquet_rows(bad)
        for what, want, have in (("records", expect_records, records),
                                 ("quarantined records", expect_quarantined, quarantined)):  # fmt: skip
            if have != want:
                raise PublishError(
                    f"plan {plan.plan_id}: the staged Parquet files hold {have} {what}, validation passed on {want}; "
                    f"nothing was committed to Iceberg table {self.table_name}"
                )
        return data, bad, records, quarantined

    def _replace_quarantine(
        self, staging: Staging, plan: Plan, staged: StagedRecords, bad: list[str], run_id: str | None
    ) -> Location:
        """Quarantine first: the run's own Parquet folder beside the table (:meth:`run_quarantine`), replaced whole
        by any rerun of this run's job."""
        quarantine = self.run_quarantine(plan.plan_id, run_id)
        quarantine.remove_tree()
        if bad:
            local = staging.root / QUARANTINE_DIR
            staged.write_quarantine(bad, staging.url(QUARANTINE_DIR))
            staging.pull(QUARANTINE_DIR, local)
            name_by_place(local)
            quarantine.upload_tree(local)
        return quarantine

    def _upload_data(
        self, staging: Staging, plan: Plan, data: list[tuple[Path, PartitionKey]]
    ) -> tuple[list[str], list[FileEntry]]:
        """Upload the data files under the table's location; their names relative to it and their entries.

        Named per attempt: a crashed attempt's files are never overwritten by a later one
        (which might commit them with other sizes).
        """
        attempt = uuid.uuid4().hex[:8]
        upload = staging.root / "_upload"
        names: list[str] = []
        entries: list[FileEntry] = []
        counters: dict[str, int] = {}
        for path, key in data:
            part_dir = "/".join(["data", *(f"{name}={value}" for name, value in key)])
            index = counters[part_dir] = counters.get(part_dir, -1) + 1
            name = f"{part_dir}/{plan.plan_id}-{attempt}-{index:05d}.parquet"
            (upload / name).parent.mkdir(parents=True, exist_ok=True)
            path.rename(upload / name)
            names.append(name)
            entries.append(_entry(upload / name, name))
        if names:
            self.location.upload_tree(upload, names)
        return names, entries

    def positions(self, feed: Feed) -> RecoveredPosition | None:
        """The feed's ends in the table's ledger (whatever snapshots were expired); a table without one: its
        history's newest snapshot of the feed and group."""
        table = self.load()
        if table is None:
            return None
        checked = checked_ledger(table, feed.name) if ledger_key(feed.name) in table.properties else None
        ledger = None if checked is None else checked.ledger
        if (
            checked is not None
            and ledger is not None
            and ledger.group == feed.group
            and (ledger.recent or checked.rolled_back)
        ):
            # Only positions of plans the current ancestry holds; an unplaced partition gets none (named instead).
            unplaced = {(u.topic, u.partition) for u in checked.unplaced if ledger.current.get(u.topic) == u.topic_id}
            last = ledger.recent[-1] if ledger.recent else None
            return RecoveredPosition(
                ends={tp: end for tp, end in ledger.positions().items() if tp not in unplaced},
                topic_ids={t: tid for t, tid in ledger.current.items() if tid},
                source=f"Iceberg table {self.table_name}, its ledger (last plan "
                f"{last.plan_id if last else None}, snapshot {last.snapshot_id if last else None}"
                f"{'' if checked.agrees else ', without the plans rolled back'})",
                details={
                    "table": self.table_name,
                    "snapshot_id": last.snapshot_id if last else None,
                    "plan_id": last.plan_id if last else None,
                    "run_id": last.run_id if last else None,
                    "from": "ledger",
                },
                events=mismatch_events(checked, self.table_name),
            )
        retracted: set[str] = set()
        for snapshot in plan_history(table):
            summary = snapshot.summary
            if summary is not None and summary.get(RETRACTED_KEY):
                retracted.add(str(summary.get(RETRACTED_KEY)))
            if summary is None or summary.get(GROUP_KEY) != feed.group or summary.get(FEED_KEY) != feed.name:
                continue
            if summary.get(PLAN_KEY) in retracted:
                continue
            ranges = json.loads(summary.get(RANGES_KEY) or "[]")
            return RecoveredPosition(
                ends={(str(r["topic"]), int(r["partition"])): int(r["end"]) for r in ranges},
                topic_ids={str(r["topic"]): str(r["topic_id"]) for r in ranges if r.get("topic_id")},
                source=f"Iceberg table {self.table_name}, snapshot {snapshot.snapshot_id} "
                f"(plan {summary.get(PLAN_KEY)})",
                details={
                    "table": self.table_name,
                    "snapshot_id": snapshot.snapshot_id,
                    "plan_id": summary.get(PLAN_KEY),
                    "run_id": summary.get(RUN_KEY),
                },
            )
        return None


def _committed_at(snapshot: Snapshot | None) -> datetime:
    """When a plan's data was committed: its snapshot's time (the dead letters' ``dead_lettered_at``)."""
    return datetime.now(UTC) if snapshot is None else datetime.fromtimestamp(snapshot.timestamp_ms / 1000, UTC)


def _pending_spec(doc: Mapping[str, Any]) -> PartitionSpecArg | None:
    """The spec a pending publication's files were written for: its fields, or (staged by an older Tidemark) the
    Kafka-timestamp choice by name."""
    if doc.get("partition_spec") is not None:
        return tuple(PartitionField(c, t, n) for c, t, n in doc["partition_spec"])
    chosen = doc.get("partition_by")
    return None if chosen is None else str(chosen)


def _schema_text(schema: pa.Schema) -> str:
    """An Arrow schema as text (a pending publication keeps the schema its commit evolves the table to)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_of(text: str) -> pa.Schema:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def commit_files(
    table: Table,
    paths: list[str],
    properties: Mapping[str, str],
    table_name: str,
    evolve_to: pa.Schema | None = None,
    partition_by: PartitionSpecArg | None = None,
) -> None:
    """One ``add_files`` commit of ``paths``: a compare-and-set on the metadata ``table`` was loaded with.

    With ``partition_by`` (the spec the files were written for: a choice of :data:`SPECS` or
    the fields of a value field's, :mod:`tidemark.output.partitioning`) the same
    commit first evolves the table's partition spec to it, if it differs (:func:`evolve_spec`).

    With ``evolve_to`` the same commit first unions the table's schema with it (columns
    added, types promoted, as :func:`schema_changes` allowed), so the snapshot that adds
    the files is the first one with the new schema: no reader sees the schema change
    without its data, and no file has a column the table lacks.

    The same commit sets the feed's ledger (:mod:`tidemark.output.ledger`, the table property
    ``tidemark.ledger.<feed>``) to the ledger read from ``table`` plus this plan, so what the
    table holds of the feed changes exactly when its data does. A plan with a range starting
    below the ledger's end of its partition is refused (:class:`PublishError`) before
    anything is committed: it would put offsets in the table twice.

    With ``commit.retry.num-retries=0`` pyiceberg does not rebase a refused commit onto
    whatever another writer committed meanwhile (that would slip past the ledger check
    made on ``table``); the refusal becomes a :class:`TableChangedError` naming table and plan.
    """
    from pyiceberg.exceptions import CommitFailedException

    plan_id = properties.get(PLAN_KEY, "?")
    feed = properties.get(FEED_KEY)
    ledger = None
    ranges = json.loads(properties.get(RANGES_KEY) or "[]")
    if feed is not None:
        ledger = table_ledger(table, feed) or Ledger(feed=feed, group=str(properties.get(GROUP_KEY)))
        repeated = overlap(ledger, ranges)
        if repeated:
            raise PublishError(
                f"Iceberg table {table_name}: plan {plan_id} of feed '{feed}' was not committed: its ranges "
                f"{'; '.join(repeated[:5])} start below what the table's ledger records the table holding "
                f"(property {ledger_key(feed)}), so they would be in the table twice. The plan is not in the "
                f"table's recent plans; nothing of it was committed. If its run is stuck on this, give it up with "
                f"`tidemark abandon {feed} RUN` (its ranges are then named by an event)"
            )
    try:
        with table.transaction() as tx:
            if evolve_to is not None:
                with tx.update_schema() as update:
                    update.union_by_name(evolve_to)
            if partition_by is not None:
                evolve_spec(tx, table, partition_by)
            tx.add_files(paths, snapshot_properties=dict(properties))
            if ledger is not None and feed is not None:
                snapshot = tx.table_metadata.current_snapshot()
                entry = _ledger_plan(properties, None if snapshot is None else snapshot.snapshot_id,
                                     snapshot.timestamp_ms if snapshot is not None else 0)  # fmt: skip
                after = ledger.with_plan(ranges, entry, str(properties.get(GROUP_KEY)))
                tx.set_properties({ledger_key(feed): after.to_json()})
    except CommitFailedException as exc:
        raise TableChangedError(
            f"Iceberg table {table_name}: the commit of plan {plan_id} was refused because the table changed since "
            f"it was read ({exc}); it was not retried on top of the other commit. Nothing of this plan is in the "
            "table; rerun to decide again from the table's ledger"
        ) from exc


def _write_table_files(good: Any, target: str, partition_by: PartitionSpecArg = "date") -> None:
    """Spark writes one folder per partition of ``partition_by``'s spec whose files keep every column (``add_files``
    derives a file's partition from its columns' statistics), timestamps as micros (Iceberg reads no INT96)."""
    spark = good.sparkSession
    keys: list[str] = []
    schema = good.schema
    for f in _fields(partition_by):
        name = _COPY_PREFIX + f.name
        good = good.withColumn(name, folder_value(f, schema))
        keys.append(name)
    with (
        session_conf(spark, "spark.sql.parquet.outputTimestampType", PARQUET_TIMESTAMPS),
        session_conf(spark, "spark.sql.session.timeZone", "UTC"),  # Iceberg's time transforms are in UTC
    ):
        writer = parquet_writer(good, "errorifexists")
        (writer.partitionBy(*keys) if keys else writer).parquet(spark_path(target))


PartitionKey = tuple[tuple[str, str], ...]  # a file's partition folders: (field name, value), in spec order


def _by_partition(root: Path) -> list[tuple[Path, PartitionKey]]:
    """Spark's files under ``root`` with their partition (from the folder names, the copies' prefix dropped)."""
    found = []
    for path in sorted(root.rglob("*.parquet")) if root.exists() else []:
        parts = [p.split("=", 1) for p in path.relative_to(root).parts[:-1] if "=" in p]
        found.append((path, tuple((name.removeprefix(_COPY_PREFIX), value) for name, value in parts)))
    return found


def _entry(path: Path, name: str) -> FileEntry:
    import pyarrow.parquet as pq

    return FileEntry(
        path=name,
        bytes=path.stat().st_size,
        rows=pq.read_metadata(path).num_rows,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
    )
