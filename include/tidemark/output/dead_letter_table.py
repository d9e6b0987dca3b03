"""An Iceberg feed's dead-letter table: its quarantined records as rows, appended once per plan after the data's commit.

The job keeps a plan's bad records in the quarantine folder beside the table
(``<output>.quarantine/plan_id=<id>/``, :mod:`tidemark.output.iceberg`), written before the
catalog commit. :meth:`~tidemark.output.iceberg.IcebergPublisher.promote` commits the data,
then :func:`append_plan` appends that folder's rows to the feed's dead-letter table
(``iceberg.dead_letters``, default ``<table>_dead_letters`` in the table's namespace,
located at ``<output>.dead_letters``) in one snapshot naming the plan, unless the table
already holds a row of the plan (:func:`holds_plan`: a scan filtered on ``plan_id``). The
rows are the check, not the snapshot history: expiry and compaction drop snapshots, never
rows. The table's columns (:func:`schema`) are the record as the quarantine kept it
(:func:`file_rows`: the raw key and value where the job kept them aside, else the record's
own bytes; a masked feed's masked columns as the job masked them), the feed, plan and run,
the reason codes and text, ``dead_lettered_at`` (the data commit's time) and ``day``, the record
timestamp's UTC date, by which the table is partitioned (identity: pyiceberg writes Iceberg's
``day`` transform only with its optional Rust extension), so a listing ``--since`` a time
prunes the days before it (:func:`scan_rows`).

The catalog and the table properties are passed in: this module sits below the publisher.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tidemark.errors import ConfigError, PublishError
from tidemark.output.owner import OWNER_KEY, adopt
from tidemark.staged import RAW_KEY_COLUMN, RAW_VALUE_COLUMN, REASON_CODES_COLUMN, REASON_COLUMN, reason_codes
from tidemark.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

DAY = "day"  # the partition column: the record timestamp's UTC date
ATTEMPTS = 5  # appends refused because the table changed meanwhile (another plan's append, maintenance)


def schema() -> pa.Schema:
    """The dead-letter table's columns, every one optional (a tombstone has no value, a record may have no key)."""
    import pyarrow as pa

    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return pa.schema([
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("element", header))),
        pa.field("feed", pa.string()),  # a table two feeds name (iceberg.dead_letters) is read per feed
        pa.field("plan_id", pa.string()),
        pa.field("run_id", pa.string()),
        pa.field("reason_codes", pa.list_(pa.field("element", pa.string()))),
        pa.field("reason", pa.string()),
        pa.field("dead_lettered_at", pa.timestamp("us", tz="UTC")),
        pa.field(DAY, pa.date32()),
    ])  # fmt: skip


def file_rows(
    file: Location, path: str, *, feed: str, plan_id: str, run_id: str | None, dead_lettered_at: datetime | None
) -> list[dict[str, Any]]:
    """The rows of one quarantine file (``path``: relative to the plan's folder; its ``topic=<t>/`` names the topic
    where the file has no ``topic`` column), as :func:`schema` holds them."""
    import pyarrow.parquet as pq

    table = pq.read_table(file.fs_path, filesystem=file.fs)
    return table_rows(table, path, feed=feed, plan_id=plan_id, run_id=run_id, dead_lettered_at=dead_lettered_at)


def table_rows(
    table: pa.Table, path: str, *, feed: str, plan_id: str, run_id: str | None, dead_lettered_at: datetime | None
) -> list[dict[str, Any]]:
    """:func:`file_rows` of rows already read (some rows of a quarantine file, as a table)."""
    import pyarrow as pa

    for name in ("key", "value"):  # a string column may hold bytes that are not UTF-8 (the records that did not decode)
        if name in table.column_names and pa.types.is_string(table.schema.field(name).type):
            table = table.set_column(table.column_names.index(name), name, table.column(name).cast(pa.binary()))
    folder_topic = next((unquote(p[len("topic=") :]) for p in path.split("/") if p.startswith("topic=")), None)
    rows = []
    for row in table.to_pylist():
        text = str(row.get(REASON_COLUMN) or "")
        codes = row.get(REASON_CODES_COLUMN)
        stamp = aware(row.get("timestamp"))
        rows.append({
            "topic": str(row.get("topic") or folder_topic),
            "partition": int(row["partition"]),
            "offset": int(row["offset"]),
            "timestamp": stamp,
            "timestamp_type": int(row.get("timestamp_type") or 0),
            "key": _bytes(row[RAW_KEY_COLUMN] if row.get(RAW_KEY_COLUMN) is not None else row.get("key")),
            "value": _bytes(row[RAW_VALUE_COLUMN] if row.get(RAW_VALUE_COLUMN) is not None else row.get("value")),
            "headers": [{"key": k, "value": v} for k, v in _headers(row.get("headers"))],
            "feed": feed,
            "plan_id": plan_id,
            "run_id": run_id,
            "reason_codes": list(codes) if codes else list(reason_codes(text)),
            "reason": text,
            "dead_lettered_at": dead_lettered_at,
            DAY: None if stamp is None else stamp.astimezone(UTC).date(),
        })  # fmt: skip
    return rows


def quarantine_files(folder: Location) -> list[tuple[Location, str]]:
    """The Parquet files of a plan's quarantine folder and their paths relative to it (none: it quarantined
    nothing)."""
    if not folder.exists():
        return []
    return [(folder / name, name) for name, _ in folder.files()
            if name.endswith(".parquet") and not any(p[:1] in "._" for p in name.split("/"))]  # fmt: skip


def open_table(catalog: Catalog, name: str, location: Location, properties: Mapping[str, str]) -> Table:
    """The dead-letter table ``name``, created on first use at ``location`` with ``properties`` (the publisher's:
    no commit retries, so a refused append is decided again, never rebased past :func:`holds_plan`; the owning feed,
    ``tidemark.owner``: a table another feed owns is refused, one without an owner adopted unless it holds another
    feed's rows, :mod:`tidemark.output.owner`)."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
    from pyiceberg.transforms import IdentityTransform

    owner = properties.get(OWNER_KEY)
    try:
        found = _evolved(catalog.load_table(name), name)
        return _with(found if owner is None else adopt(found, name, owner, other_feeds), properties)
    except NoSuchTableError:
        pass
    catalog.create_namespace_if_not_exists(name.split(".", 1)[0])
    try:
        with (
            catalog.create_table_transaction(
                name, schema=schema(), location=location.url, properties=dict(properties)
            ) as create,
            create.update_spec() as spec,
        ):
            spec.add_field(DAY, IdentityTransform(), DAY)
    except TableAlreadyExistsError:
        pass  # created meanwhile by another run: use it
    return _with(catalog.load_table(name), properties)


def other_feeds(table: Table, feed: str) -> list[str]:
    """The feeds other than ``feed`` with a row in dead-letter table ``table`` (one row is enough to say so)."""
    from pyiceberg import expressions

    if "feed" not in {f.name for f in table.schema().fields}:
        return []  # written before rows named their feed: nothing in it names another feed
    differ: Any = expressions.NotEqualTo  # typed by pydantic as its fields, as in holds_plan
    scan = table.scan(row_filter=differ("feed", feed), selected_fields=("feed",), limit=1)
    return sorted({str(f) for f in scan.to_arrow().column("feed").to_pylist()})


def _evolved(table: Table, name: str) -> Table:
    """``table`` with every column of :func:`schema` (one a later Tidemark added is added, null in the rows before);
    refused, naming it, when it is no dead-letter table (another table named by ``iceberg.dead_letters``)."""
    have = {f.name for f in table.schema().fields}
    if not {"plan_id", "reason", "offset"} <= have:
        raise ConfigError(
            f"Iceberg table {name}, named as the feed's dead-letter table (iceberg.dead_letters), is not one: it has "
            f"no plan_id, offset and reason columns (its columns: {', '.join(sorted(have))}). Name a table of its "
            "own (the default is <table>_dead_letters)"
        )
    if {f.name for f in schema()} <= have:
        return table
    with table.update_schema() as update:
        update.union_by_name(schema())
    return table.refresh()


def _with(table: Table, properties: Mapping[str, str]) -> Table:
    """``table`` with ``properties`` set back where someone changed them (a rebased retry would append past the
    run-once check)."""
    if all(table.properties.get(k) == v for k, v in properties.items()):
        return table
    with table.transaction() as tx:
        tx.set_properties(dict(properties))
    return table.refresh()


def holds_plan(table: Table, plan_id: str) -> bool:
    """Whether ``table`` holds a row of ``plan_id`` (its rows outlive snapshot expiry and compaction)."""
    from pyiceberg import expressions

    equal: Any = expressions.EqualTo  # typed by pydantic as its fields (term, value), called as (term, literal)
    scan = table.scan(row_filter=equal("plan_id", plan_id), selected_fields=("plan_id",), limit=1)
    return int(scan.to_arrow().num_rows) > 0


def append_plan(
    catalog: Catalog,
    name: str,
    location: Location,
    folder: Location,
    *,
    feed: str,
    plan_id: str,
    run_id: str | None,
    dead_lettered_at: datetime,
    snapshot_properties: Mapping[str, str],
    table_properties: Mapping[str, str],
    expected: int,
) -> int:
    """Append plan ``plan_id``'s quarantine ``folder`` to the dead-letter table ``name`` once; the rows appended.

    Nothing when the plan quarantined nothing (``expected``: the quarantined records its
    commit recorded; no table is created for it) or the table already holds the plan's rows.
    A folder that holds another number of rows than ``expected`` (removed or cut after the
    data's commit) is refused, naming it: its dead letters would be lost without a word. The
    check and the append are one compare-and-set on the metadata the table was loaded with:
    an append refused because the table changed meanwhile (another plan's append, a feed
    sharing the table, maintenance) is decided again on the new metadata, after a pause.
    """
    import pyarrow as pa
    from pyiceberg.exceptions import CommitFailedException

    rows = []
    for file, path in quarantine_files(folder):
        rows += file_rows(file, path, feed=feed, plan_id=plan_id, run_id=run_id, dead_lettered_at=dead_lettered_at)
    if len(rows) != expected:
        raise PublishError(
            f"plan {plan_id} of feed '{feed}' is committed with {expected} quarantined records, but its quarantine "
            f"folder {folder} holds {len(rows)}: restore the folder (its dead letters are appended to {name} from "
            "it). The records are in Kafka at the plan's ranges while retention keeps them"
        )
    if not rows:
        return 0
    data = pa.Table.from_pylist(rows, schema=schema())
    for attempt in range(ATTEMPTS):
        try:
            table = open_table(catalog, name, location, table_properties)
            if holds_plan(table, plan_id):
                return 0
            table.append(data, snapshot_properties=dict(snapshot_properties))
        except CommitFailedException:  # another writer committed first: look at the rows again
            time.sleep(random.uniform(0, 0.2 * 2**attempt))  # spread the retries of writers racing
            continue
        return int(data.num_rows)
    raise PublishError(
        f"Iceberg dead-letter table {name}: the append of plan {plan_id}'s dead letters was refused {ATTEMPTS} "
        "times because the table kept changing; the plan's data is committed and its dead letters stay in its "
        "quarantine folder: the feed's next run appends them before planning (or rerun the job outside a run)"
    )


def scan_rows(table: Table, feed: str, since: datetime | None = None) -> list[dict[str, Any]]:
    """The table's rows of ``feed`` (``since``: stamped at or after it; the day partitions before its day are
    pruned)."""
    from pyiceberg import expressions

    equal: Any = expressions.EqualTo  # typed by pydantic as its fields, as in holds_plan
    at_or_after: Any = expressions.GreaterThanOrEqual
    where: Any = equal("feed", feed)
    if since is not None:
        when = since.astimezone(UTC)
        where = expressions.And(
            where, at_or_after(DAY, when.date().isoformat()), at_or_after("timestamp", when.isoformat())
        )
    return list(table.scan(row_filter=where).to_arrow().to_pylist())


def plans_in(table: Table, feed: str) -> set[str]:
    """The plan ids of ``feed`` the table holds rows of."""
    from pyiceberg import expressions

    equal: Any = expressions.EqualTo  # typed by pydantic as its fields, as in holds_plan
    scan = table.scan(row_filter=equal("feed", feed), selected_fields=("plan_id",))
    return {str(p) for p in scan.to_arrow().column("plan_id").to_pylist()}


def aware(value: Any) -> datetime | None:
    """A timestamp as UTC (a Parquet timestamp without a zone is UTC: the job writes them so)."""
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _bytes(value: Any) -> bytes | None:
    """A key, value or header as bytes: raw bytes as they are, text as UTF-8, and a decoded record (a masked feed's
    registry-format key or value, whose raw bytes the job nulled) as its JSON text."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, sort_keys=True, default=str).encode()


def _headers(value: Sequence[Any] | Iterable[Any] | None) -> list[tuple[str, bytes | None]]:
    pairs = []
    for h in value or ():
        k, v = (h.get("key"), h.get("value")) if isinstance(h, dict) else h
        pairs.append((str(k), _bytes(v)))
    return pairs
