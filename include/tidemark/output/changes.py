"""Change streams into keyed Iceberg tables: a plan's changes folded per key, merged in the plan's one commit.

An Iceberg feed with ``iceberg.mode: upsert`` (:class:`~tidemark.config.models.IcebergOutput`)
holds the current row per ``key`` instead of every record. The job stages and validates the
plan's records exactly as for an append (the records that cannot be applied, an unknown
Debezium ``op`` or a state record without its key, are quarantined by rules the feed's
model adds to its expectations, a Debezium change without its key's value or with an image
but no ``op`` by :func:`tidemark.validation.rules.change_rules`), then checks every staged
change with :func:`change_problem` before the commit (:meth:`ChangesPublisher.check_staged`);
the staged change files are uploaded and kept pending, in no snapshot.
:meth:`ChangesPublisher.commit`, called where an append's ``add_files`` would be (the commit
step, after the group's commit), then

1. reads the plan's changes and turns each into an upsert or a delete of its key
   (:func:`changes_of`): Debezium ``c``/``u``/``r`` upsert the ``after`` image, ``d``
   deletes the key of ``before``, a tombstone deletes the Kafka key when that is the key
   (else it follows a ``d`` and is ignored); a ``state`` record upserts its value, a
   tombstone (every value column null) deletes;
2. drops the changes the table already reflects: below the table ledger's end of their
   partition (:mod:`tidemark.output.ledger`), counted ``stale``;
3. places the rest in one total order (:func:`place`: a Debezium change by its source position,
   :func:`source_position`; any other by its partition's clock, the running maximum along the
   offsets; a change ordered by ``source.sequence`` below its clock was sent again, :func:`re_sent`,
   and is dropped, ``stale``) and folds them to the last change per key (:func:`fold`); the survivor applies only
   if it is newer (:func:`newer`) than the key's row in the table or, for a key without a row,
   its delete marker (else ``stale``); a row of a topic since recreated is replaced whatever
   its position (:func:`recreated`);
4. in **one** transaction, a compare-and-set on the metadata the table was loaded with:
   evolves the schema (new ``after`` columns), deletes the changed keys' rows (pyiceberg's
   copy-on-write ``delete``: files holding them are rewritten without them), appends the
   new rows, and sets the feed's ledger with the plan, the partitions' clocks
   (``tidemark.clock.<feed>``) and the delete markers (``tidemark.deleted.<feed>``, pruned by
   :func:`prune_markers`). A plan already in the ledger is never
   applied again (:meth:`IcebergPublisher.promote` looks there first), and a retry of a plan
   whose commit was refused decides again from the new table.

Every row keeps where its change came from and its place in the order (:data:`POSITION_COLUMNS`),
which step 3 reads.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tidemark.config.models import (
    CHANGE_IMAGE_LABEL,
    CHANGE_KEY_LABEL,
    CHANGE_OP_LABEL,
    DEBEZIUM_OPS,
    KAFKA_KEY,
    ChangeColumn,
    ChangeFormat,
    Feed,
)
from tidemark.errors import ConfigError, PublishError, StateStoreError
from tidemark.output.iceberg import (
    FEED_KEY,
    GROUP_KEY,
    PLAN_KEY,
    RANGES_KEY,
    RUN_KEY,
    IcebergPublisher,
    PartitionSpecArg,
    TableChangedError,
    _ledger_plan,
    table_ledger,
    table_schema,
)
from tidemark.output.ledger import Ledger, ledger_key
from tidemark.staged import DATE_COLUMN, METADATA_COLUMNS
from tidemark.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table
    from pyspark.sql.types import StructType

# Where each row's change came from: the staleness check of every later plan compares with them.
TOPIC_COL, PARTITION_COL, OFFSET_COL, TIMESTAMP_COL, TOPIC_ID_COL = (
    "_kafka_topic",
    "_kafka_partition",
    "_kafka_offset",
    "_kafka_timestamp",
    "_kafka_topic_id",  # null in rows written before topic ids were kept: taken as the plan's own topic
)
ORDER_COL = "_change_order"  # the change's place in the order (:func:`encode_order`); null: written before it was kept
POSITION_COLUMNS = (TOPIC_COL, PARTITION_COL, OFFSET_COL, TIMESTAMP_COL, TOPIC_ID_COL, ORDER_COL)
Order = tuple[int, ...]
# the order (source position or clock), topic, partition, offset, topic id (None: unknown)
Position = tuple[Order, str, int, int, str | None]
CLOCK_PREFIX = "tidemark.clock."  # + feed: per topic and partition, the order's running maximum read so far
DELETED_PREFIX = "tidemark.deleted."  # + feed: the delete markers (key, the delete's position)
CHANGES_KEY = "tidemark.changes"  # snapshot summary: the plan's change counts (JSON)
Kind = Literal["upsert", "delete"]


class MergeRefusedError(PublishError):
    """A staged change the merge cannot apply (:func:`change_problem`); raised before the merge's transaction."""


@dataclass(frozen=True)
class ChangeSpec:
    """A keyed table's change settings (``iceberg.key``, ``change_format``, ``change_columns``)."""

    feed: str
    key: tuple[str, ...]
    format: ChangeFormat
    columns: tuple[ChangeColumn, ...]

    @classmethod
    def of(cls, feed: Feed) -> ChangeSpec:
        iceberg = feed.iceberg
        if iceberg is None or iceberg.mode != "upsert" or iceberg.change_format is None:
            raise ConfigError(f"feed '{feed.name}': not an Iceberg feed with iceberg.mode: upsert")
        return cls(feed.name, iceberg.key, iceberg.change_format, iceberg.change_columns)


@dataclass(frozen=True)
class Change:
    """One record as a change of its key: where it came from, and the row an upsert writes."""

    key: tuple[Any, ...]
    kind: Kind
    topic: str
    partition: int
    offset: int
    timestamp: int  # the Kafka record timestamp, µs since the epoch
    row: Mapping[str, Any] | None  # an upsert's row (value columns and change metadata), without positions
    topic_id: str | None = None  # the id of the plan's topic (the ranges' ``topic_id``)
    source: Order | None = None  # a Debezium change's source position (:func:`source_position`), if it has one
    order: Order = ()  # its place in the order (:func:`place`): the source position, else the partition's clock


@dataclass
class Counts:
    """What one plan did to the table (a snapshot summary's ``tidemark.changes``, the run's event)."""

    changes: int = 0  # records read as changes
    stale: int = 0  # already reflected by the table (below the ledger's end, or not newer than the key's row)
    superseded: int = 0  # folded away: a later change of the same key in the plan
    upserts: int = 0
    deletes: int = 0
    ignored_tombstones: int = 0  # a Debezium tombstone without a Kafka key to delete (it follows a 'd')
    recreated: int = 0  # rows of a topic since deleted and recreated, replaced or deleted by the new topic's changes
    remembered_deletes: int = 0  # delete markers the table keeps after this plan (see prune_markers)
    # topic -> the ids of the deleted topics whose rows were replaced (for the topic_recreated event)
    old_topic_ids: dict[str, set[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


# -- the table's row -------------------------------------------------------------------


def _value_fields(spec: ChangeSpec, staged: pa.Schema) -> list[pa.Field]:
    """The value columns a row keeps: the ``after`` struct's fields (Debezium) or the decoded value's columns."""
    import pyarrow as pa

    if spec.format == "debezium":
        missing = [n for n in ("op", "after") if n not in staged.names]
        if missing or not pa.types.is_struct(staged.field("after").type):
            raise ConfigError(
                f"feed '{spec.feed}': iceberg.change_format: debezium needs the envelope's 'op' and a struct 'after' "
                f"in the decoded value; the records have columns {staged.names}"
            )
        return list(staged.field("after").type)
    return [f for f in staged if f.name not in (*METADATA_COLUMNS, DATE_COLUMN)]


def row_schema(spec: ChangeSpec, schema: StructType) -> pa.Schema:
    """The keyed table's schema from the decoded records' Spark schema: the key, the value columns, the positions,
    the change metadata asked for. Refuses a key the records lack or cannot compare exactly."""
    import pyarrow as pa

    staged = table_schema(schema)
    values = _value_fields(spec, staged)
    names = [f.name for f in values]
    fields = ([staged.field(KAFKA_KEY)] if KAFKA_KEY in spec.key else []) + values
    for name in spec.key:
        found = next((f for f in fields if f.name == name), None)
        if found is None:
            where = "the Debezium 'after' struct" if spec.format == "debezium" else "the decoded value"
            raise ConfigError(
                f"feed '{spec.feed}': iceberg.key {name!r} is not a column of {where} (columns: {names}); say "
                f"'{KAFKA_KEY}' for the record's Kafka key"
            )
        t = found.type
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_date(t) or pa.types.is_decimal(t) or pa.types.is_binary(t)):  # fmt: skip
            raise ConfigError(
                f"feed '{spec.feed}': iceberg.key {name!r} is {t}: a key must compare exactly (an integer, a string, a "
                "date, a decimal or bytes), not a float, a timestamp or a nested value"
            )
    clash = [n for n in names if n.startswith("_kafka_") or n in {f"_{c}" for c in spec.columns}]
    if clash:
        raise ConfigError(f"feed '{spec.feed}': value column {clash[0]!r} clashes with the keyed table's own columns")
    meta = [pa.field(TOPIC_COL, pa.string()), pa.field(PARTITION_COL, pa.int32()), pa.field(OFFSET_COL, pa.int64()),
            pa.field(TIMESTAMP_COL, pa.timestamp("us", tz="UTC")), pa.field(TOPIC_ID_COL, pa.string()),
            pa.field(ORDER_COL, pa.string())]  # fmt: skip
    extra = {"op": pa.string(), "source_ts_ms": pa.int64(), "ts_ms": pa.int64()}
    meta += [pa.field(f"_{c}", extra[c]) for c in spec.columns]
    return pa.schema([f.with_nullable(True) for f in (*fields, *meta)])


# -- changes, staleness and the fold ---------------------------------------------------


def change_problem(spec: ChangeSpec, r: Mapping[str, Any]) -> str | None:
    """Why the staged record ``r`` cannot be applied as a change, as the label of the rule that quarantines it in the
    job (``None``: it can). The same reasons as :func:`tidemark.validation.rules.change_rules` and the feed's own
    expectations (``op`` in c, u, r, d; a not-null key), so that nothing reaches the merge that it cannot apply."""
    kafka_key_missing = KAFKA_KEY in spec.key and r.get(KAFKA_KEY) is None
    if spec.format != "debezium":
        missing = [k for k in spec.key if r.get(k) is None]
        return f"expect_column_values_to_not_be_null({missing[0]})" if missing else None
    op, keys = r.get("op"), [k for k in spec.key if k != KAFKA_KEY]
    if op is None:
        if r.get("after") is not None or r.get("before") is not None:
            return CHANGE_OP_LABEL
        return f"expect_column_values_to_not_be_null({KAFKA_KEY})" if kafka_key_missing else None  # a tombstone
    if op not in DEBEZIUM_OPS:
        return "expect_column_values_to_be_in_set(op)"
    image = r.get("before" if op == "d" else "after")
    if keys and (not isinstance(image, Mapping) or any(image.get(k) is None for k in keys)):
        return f"{CHANGE_KEY_LABEL}({', '.join(keys)})"
    if not keys and op != "d" and image is None:
        return CHANGE_IMAGE_LABEL
    return f"expect_column_values_to_not_be_null({KAFKA_KEY})" if kafka_key_missing else None


def change_problems(spec: ChangeSpec, records: pa.Table) -> list[str]:
    """Every record of ``records`` :func:`change_problem` refuses, as ``topic[partition] offset N: <reason>``."""
    wanted = ["topic", "partition", "offset", "op", "before", "after", *spec.key]
    rows = records.select([n for n in dict.fromkeys(wanted) if n in records.schema.names]).to_pylist()
    found = ((r, change_problem(spec, r)) for r in rows)
    return [f"{r['topic']}[{r['partition']}] offset {r['offset']}: {why}" for r, why in found if why is not None]


def changes_of(
    spec: ChangeSpec, records: pa.Table, counts: Counts, topic_ids: Mapping[str, str | None] | None = None
) -> list[Change]:
    """The plan's staged records as changes, in the order they were read (see the module docstring, step 1).

    Raises :class:`MergeRefusedError` when a record is one :func:`change_problem` refuses: the job quarantines those
    before the commit, so only changes staged without that check (a publication staged by an older Tidemark) get
    here, and then nothing of the plan is applied."""
    value_names = [f.name for f in _value_fields(spec, records.schema)]
    found: list[Change] = []
    for r in records.to_pylist():
        problem = change_problem(spec, r)
        if problem is not None:
            raise MergeRefusedError(f"{r['topic']}[{r['partition']}] offset {r['offset']}: {problem}")
        counts.changes += 1
        image: Mapping[str, Any] | None
        kind: Kind
        if spec.format == "debezium":
            op = r.get("op")
            if op in ("c", "u", "r"):
                kind, image, keyed = "upsert", r.get("after"), r.get("after")
            elif op == "d":
                kind, image, keyed = "delete", None, r.get("before")
            else:  # a tombstone (change_problem refused every other record without an op)
                if KAFKA_KEY not in spec.key:
                    counts.ignored_tombstones += 1
                    continue
                kind, image, keyed = "delete", None, {}
        else:
            image = {n: r.get(n) for n in value_names}
            tombstone = all(v is None for v in image.values())
            kind, image, keyed = ("delete", None, image) if tombstone else ("upsert", image, image)
        keyed = keyed or {}
        key = tuple(r.get(KAFKA_KEY) if k == KAFKA_KEY else keyed.get(k) for k in spec.key)
        row = None
        if image is not None:
            row = {**({KAFKA_KEY: r.get(KAFKA_KEY)} if KAFKA_KEY in spec.key else {}), **image}
            source = r.get("source") if isinstance(r.get("source"), Mapping) else {}
            meta = {"op": r.get("op"), "source_ts_ms": (source or {}).get("ts_ms"), "ts_ms": r.get("ts_ms")}
            row.update({f"_{c}": meta[c] for c in spec.columns})
        topic = str(r["topic"])
        where = source_position(r) if spec.format == "debezium" else None
        found.append(Change(key, kind, topic, int(r["partition"]), int(r["offset"]), _micros(r["timestamp"]), row,
                            (topic_ids or {}).get(topic), where))  # fmt: skip
    return found


def _micros(value: Any) -> int:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        delta = aware - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(value)


def source_position(r: Mapping[str, Any]) -> Order | None:
    """A Debezium change's position in its source database, or ``None`` (a tombstone; an envelope without one).

    - PostgreSQL with ``source.sequence`` (``[last committed LSN, LSN]``, JSON text; a snapshot's has no last
      committed LSN, its own LSN stands for it): both, then the order inside its transaction. The connector sends
      changes in this order (:data:`COMMIT_ORDERED`), so one below its partition's clock was sent again;
    - PostgreSQL (``source.lsn``): the LSN, then the order inside its transaction (``transaction.total_order``,
      0 without transaction metadata);
    - MySQL (``source.file``, ``source.pos``): the binlog file's number, the position, then ``source.row``;
    - any other connector: ``source.ts_ms``, the fallback (a clock, so two changes in one millisecond tie, and then
      the Kafka position decides).
    """
    source = r.get("source")
    if not isinstance(source, Mapping):
        return None
    if source.get("lsn") is not None:
        transaction = r.get("transaction")
        within = int((transaction.get("total_order") if isinstance(transaction, Mapping) else None) or 0)
        sequence = _sequence(source.get("sequence"))
        if sequence is not None:
            return (SEQUENCE_TAG, sequence[0] if sequence[0] is not None else sequence[1], sequence[1], within)
        return (0, int(source["lsn"]), within)
    if source.get("file") is not None and source.get("pos") is not None:
        number = re.search(r"(\d+)$", str(source["file"]))
        return (1, int(number.group(1)) if number else 0, int(source["pos"]), int(source.get("row") or 0))
    if source.get("ts_ms") is not None:
        return (2, int(source["ts_ms"]))
    return None


SEQUENCE_TAG = 4  # the first part of a PostgreSQL change's order by ``source.sequence``
COMMIT_ORDERED = frozenset({SEQUENCE_TAG})  # orders a connector sends in: never below the partition's clock, but again
STATE_TAG = 3  # a ``state`` record's order (:func:`place`): never below its partition's clock


def _sequence(value: Any) -> tuple[int | None, int] | None:
    """Debezium's PostgreSQL ``source.sequence`` as (last committed LSN or None, LSN), or None without one."""
    try:
        parts = json.loads(value) if isinstance(value, str) else value
        if not isinstance(parts, list) or len(parts) != 2 or parts[1] is None:
            return None
        return (None if parts[0] is None else int(parts[0]), int(parts[1]))
    except (TypeError, ValueError):
        return None


def re_sent(c: Change, clock: Order) -> bool:
    """Whether ``c`` was sent again: its source position is one its connector sends in order (:data:`COMMIT_ORDERED`)
    and below its partition's clock, so the partition already held it (the reads along a partition have no gap)."""
    return c.source is not None and c.source[0] in COMMIT_ORDERED and c.source < clock


def place(
    changes: Sequence[Change], clocks: Mapping[tuple[str, int], Order], state: bool, counts: Counts | None = None
) -> tuple[list[Change], dict[tuple[str, int], Order]]:
    """Each change's place in the order, and the partitions' clocks after them; a change sent again (:func:`re_sent`)
    is left out, counted ``stale``: what its key became after it is in the table, or was deleted.

    A partition's **clock** is the running maximum of the order along its offsets (kept per topic name and partition
    in the table property ``tidemark.clock.<feed>``, so it carries over a recreated topic). A Debezium change with
    a source position is ordered by it (and moves the clock); a change without one (a tombstone; a ``state``
    record, whose own position is its Kafka timestamp) takes the clock, after taking its timestamp into it for a
    ``state`` record: so within a partition the order never goes backwards with the offset, and across partitions it
    is a total order that the records alone decide, whatever order plans read them in.
    """
    clock = dict(clocks)
    placed = []
    for c in sorted(changes, key=lambda c: (c.topic, c.partition, c.offset)):
        here = clock.get((c.topic, c.partition), ())
        if re_sent(c, here):
            if counts is not None:
                counts.stale += 1
            continue
        if c.source is not None:
            order = c.source
            clock[(c.topic, c.partition)] = max(here, order)
        else:
            order = max(here, (3, c.timestamp)) if state else here
            clock[(c.topic, c.partition)] = order
        placed.append(replace(c, order=order))
    return placed, clock


def newer(a: Position, b: Position) -> bool:
    """Whether the change at position ``a`` comes after the one at ``b``: by the order (:func:`place`), then topic,
    partition and offset (within a partition the order never decreases, so there the offset decides)."""
    return a[:4] > b[:4]


def _position(c: Change) -> Position:
    return (c.order, c.topic, c.partition, c.offset, c.topic_id)


def recreated(c: Change, held: Position) -> bool:
    """Whether the row at ``held`` came from a topic of ``c``'s name that was deleted since: ``c``'s topic (the
    plan's, which the commit checked is the topic there now) has another id. Its offsets say nothing about the old
    topic's, so the change applies whatever they are."""
    return held[1] == c.topic and held[4] is not None and c.topic_id is not None and held[4] != c.topic_id


def encode_order(order: Order) -> str:
    """An order as text that sorts as the order does (each part 20 digits; every part is ≥ 0)."""
    return ".".join(f"{max(0, part):020d}" for part in order)


def decode_order(text: str | None) -> Order:
    return tuple(int(part) for part in text.split(".")) if text else ()


def fold(changes: Iterable[Change], counts: Counts) -> dict[tuple[Any, ...], Change]:
    """The last change per key (:func:`newer`); the others are counted ``superseded``."""
    last: dict[tuple[Any, ...], Change] = {}
    for c in changes:
        kept = last.get(c.key)
        if kept is None or newer(_position(c), _position(kept)):
            last[c.key] = c
        if kept is not None:
            counts.superseded += 1
    return last


def below_ledger(changes: Sequence[Change], ledger: Ledger | None, topic_ids: Mapping[str, str | None],
                 counts: Counts) -> list[Change]:  # fmt: skip
    """The changes the table's ledger does not already cover (a change below its partition's end is stale)."""
    if ledger is None:
        return list(changes)
    kept = []
    for c in changes:
        end = ledger.end(c.topic, c.partition, topic_ids.get(c.topic))
        if end is not None and c.offset < end:
            counts.stale += 1
        else:
            kept.append(c)
    return kept


def _key_filter(spec: ChangeSpec, keys: Iterable[tuple[Any, ...]]) -> BooleanExpression:
    """Rows whose key is one of ``keys``: pyiceberg's own match filter (``In`` on one column, else ``Or``s)."""
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysFalse
    from pyiceberg.table.upsert_util import create_match_filter

    keys = list(keys)
    if not keys:
        return AlwaysFalse()
    return create_match_filter(pa.table({n: [k[i] for k in keys] for i, n in enumerate(spec.key)}), list(spec.key))


def current_positions(
    table: Table, spec: ChangeSpec, keys: Iterable[tuple[Any, ...]]
) -> dict[tuple[Any, ...], Position]:
    """Where the table's row of each of ``keys`` came from (keys without a row are left out)."""
    keys = list(keys)
    if not keys or table.current_snapshot() is None:
        return {}
    have = set(table.schema().column_names)  # a table written before a position column was kept lacks it
    wanted = (*spec.key, *(c for c in POSITION_COLUMNS if c in have))
    rows = table.scan(row_filter=_key_filter(spec, keys), selected_fields=wanted).to_arrow()
    found = {}
    for r in rows.to_pylist():
        found[tuple(r[k] for k in spec.key)] = (decode_order(r.get(ORDER_COL)), r[TOPIC_COL], r[PARTITION_COL],
                                                r[OFFSET_COL], r.get(TOPIC_ID_COL))  # fmt: skip
    return found


# -- what the table property keeps: the partitions' clocks and the delete markers ---------


def key_text(key: tuple[Any, ...]) -> str:
    """A key as the delete markers name it (JSON; a date, decimal or bytes value by its text)."""
    return json.dumps([v if isinstance(v, (int, str)) else repr(v) for v in key], separators=(",", ":"))


def load_clocks(table: Table, feed: str) -> dict[tuple[str, int], Order]:
    doc = json.loads(table.properties.get(f"{CLOCK_PREFIX}{feed}") or "{}")
    return {(t, int(p)): decode_order(o) for t, parts in doc.items() for p, o in parts.items()}


def clocks_json(clocks: Mapping[tuple[str, int], Order]) -> str:
    doc: dict[str, dict[str, str]] = {}
    for (t, p), order in sorted(clocks.items()):
        doc.setdefault(t, {})[str(p)] = encode_order(order)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def load_markers(table: Table, feed: str) -> dict[str, Position]:
    doc = json.loads(table.properties.get(f"{DELETED_PREFIX}{feed}") or "{}")
    return {k: (decode_order(o), t, int(p), int(off), tid) for k, (o, t, p, off, tid) in doc.items()}


def markers_json(markers: Mapping[str, Position]) -> str:
    doc = {k: [encode_order(o), t, p, off, tid] for k, (o, t, p, off, tid) in sorted(markers.items())}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def prune_markers(
    markers: Mapping[str, Position], clocks: Mapping[tuple[str, int], Order], partitions: Iterable[tuple[str, int]]
) -> dict[str, Position]:
    """The delete markers an older change could still contradict (issue 58). A marker is dropped once **every**
    partition of the feed has a clock strictly past the delete's order, and only if its order is one where a change
    below its partition's clock never applies: a ``state`` record's (placed at or after the clock) or a PostgreSQL
    change's by ``source.sequence`` (dropped as sent again, :func:`re_sent`). Any other marker (a change ordered by
    its LSN alone, a binlog position or ``source.ts_ms``) is kept for good: a restarted Kafka Connect worker re-sends
    older changes at higher offsets, below the clocks, and only the marker keeps such an insert from bringing the key
    back. A partition never read, or read without a record, keeps every marker."""
    known = [clocks.get(tp) for tp in partitions]
    if not known or any(c is None for c in known):
        return dict(markers)
    floor = min(c for c in known if c is not None)
    prunable = {STATE_TAG, *COMMIT_ORDERED}
    kept = {k: m for k, m in markers.items() if not (m[0] and m[0][0] in prunable)}  # for good
    return kept | {k: m for k, m in markers.items() if not m[0] < floor}


# -- the commit --------------------------------------------------------------------------


def apply_changes(
    table: Table,
    spec: ChangeSpec,
    records: pa.Table,
    properties: Mapping[str, str],
    table_name: str,
    evolve_to: pa.Schema | None,
) -> Counts:
    """One transaction over ``table`` (a compare-and-set on the metadata it was loaded with): ``records``' changes
    that are not stale, placed in the order, folded per key, deleted and appended, with the feed's ledger, clocks
    and delete markers (see the module docstring)."""
    import pyarrow as pa
    from pyiceberg.exceptions import CommitFailedException

    counts = Counts()
    plan_id = properties.get(PLAN_KEY, "?")
    ranges = json.loads(properties.get(RANGES_KEY) or "[]")
    ledger = table_ledger(table, spec.feed)
    topic_ids = {str(r["topic"]): r.get("topic_id") for r in ranges}
    fresh = below_ledger(changes_of(spec, records, counts, topic_ids), ledger, topic_ids, counts)
    placed, clocks = place(fresh, load_clocks(table, spec.feed), spec.format == "state", counts)
    last = fold(placed, counts)
    current = current_positions(table, spec, last)
    markers = load_markers(table, spec.feed)
    applied = {}
    for key, c in last.items():
        held = current.get(key) or markers.get(key_text(key))  # the key's row, else the delete that removed it
        if held is not None and recreated(c, held):
            counts.recreated += 1  # the row's topic was deleted and recreated: the new topic's change applies
            counts.old_topic_ids.setdefault(c.topic, set()).add(str(held[4]))
            applied[key] = c
        elif held is not None and not newer(_position(c), held):
            counts.stale += 1  # the key's row (or its delete) is as new or newer: an older change, read late
        elif c.kind == "delete" and key not in current:
            counts.deletes += 1  # nothing to delete: a key created and deleted in this plan, or never seen
            markers[key_text(key)] = _position(c)
        else:
            applied[key] = c
    for key, c in applied.items():
        if c.kind == "delete":
            markers[key_text(key)] = _position(c)
        else:
            markers.pop(key_text(key), None)
    partitions = {*(ledger.positions() if ledger else ()), *((str(r["topic"]), int(r["partition"])) for r in ranges)}
    markers = prune_markers(markers, clocks, partitions)
    counts.remembered_deletes = len(markers)
    rows = [{**(c.row or {}), TOPIC_COL: c.topic, PARTITION_COL: c.partition, OFFSET_COL: c.offset,
             TIMESTAMP_COL: c.timestamp, TOPIC_ID_COL: c.topic_id, ORDER_COL: encode_order(c.order)}
            for c in applied.values() if c.kind == "upsert"]  # fmt: skip
    counts.upserts = len(rows)
    counts.deletes += sum(1 for c in applied.values() if c.kind == "delete")
    snapshot_props = {**properties, CHANGES_KEY: json.dumps(counts.to_dict(), sort_keys=True)}
    replaced = [k for k in applied if k in current]
    group = str(properties.get(GROUP_KEY))
    try:
        with table.transaction() as tx:
            if evolve_to is not None:
                with tx.update_schema() as update:
                    update.union_by_name(evolve_to)
            if replaced:
                tx.delete(_key_filter(spec, replaced), snapshot_properties={} if rows else snapshot_props)
            if rows:
                schema = tx.table_metadata.schema().as_arrow()
                wanted = pa.schema([schema.field(n) for n in schema.names if n in set().union(*rows)])
                tx.append(_arrow_rows(rows, wanted), snapshot_properties=snapshot_props)
            # A plan that wrote nothing (all stale) made no snapshot: its entry names none, not the one before it.
            snapshot = tx.table_metadata.current_snapshot() if replaced or rows else None
            when = snapshot.timestamp_ms if snapshot is not None else int(time.time() * 1000)
            entry = _ledger_plan(properties, None if snapshot is None else snapshot.snapshot_id, when)
            after = (ledger or Ledger(feed=spec.feed, group=group)).with_plan(ranges, entry, group)
            tx.set_properties({
                ledger_key(spec.feed): after.to_json(),
                f"{CLOCK_PREFIX}{spec.feed}": clocks_json(clocks),
                f"{DELETED_PREFIX}{spec.feed}": markers_json(markers),
            })  # fmt: skip
    except CommitFailedException as exc:
        raise TableChangedError(
            f"Iceberg table {table_name}: the changes of plan {plan_id} were refused because the table changed since "
            f"it was read ({exc}); not retried on top of the other commit. Nothing of this plan is in the table"
        ) from exc
    return counts


def _arrow_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    return pa.Table.from_pylist([{n: r.get(n) for n in schema.names} for r in rows], schema=schema)


def read_changes(table: Table, paths: Sequence[str]) -> pa.Table:
    """The plan's staged change files (uploaded under the table's location, in no snapshot), as one table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for path in paths:
        with table.io.new_input(path).open() as stream:
            parts.append(pq.read_table(stream))
    return pa.concat_tables(parts, promote_options="default") if parts else pa.table({})


def refused_after_commit(table_name: str, feed: str, properties: Mapping[str, str], problem: str) -> str:
    """What an error of the merge (the commit step, after the group's commit when a run shows the plan) says was
    committed: the table is unchanged; the group's offsets are committed when the plan is a run's."""
    plan, run = properties.get(PLAN_KEY, "?"), properties.get(RUN_KEY)
    if run:
        committed = (
            f"the group's offsets of the plan ARE committed (run {run} commits the group before it shows the plan): "
            f"the run stays committed and not shown, and the feed's next run stops at it until the change is fixed, "
            f"or `tidemark abandon {feed} {run}` gives the plan up, naming its ranges in a not_shown event"
        )
    else:
        committed = "no group commit goes with this plan (a job outside any run): nothing was committed anywhere"
    return (
        f"Iceberg table {table_name}: plan {plan} of feed '{feed}' cannot be applied: {problem}. The table is "
        f"unchanged (the merge's transaction was not begun); {committed}. Such a change is quarantined by the job "
        "before the commit: this plan was staged without that check"
    )


class ChangesPublisher(IcebergPublisher):
    """An Iceberg feed with ``iceberg.mode: upsert``: the table holds the current row per key (module docstring)."""

    def __init__(self, feed: Feed) -> None:
        super().__init__(feed)
        self.spec = ChangeSpec.of(feed)
        self.partitioning = "none"  # a merge deletes by key across the whole table: partitions would not prune it

    def table_arrow(self, schema: StructType) -> pa.Schema:
        return row_schema(self.spec, schema)

    def check_staged(self, plan_id: str, paths: Sequence[Path]) -> None:
        """Before the commit, in the job: every staged change is one the merge can apply (:func:`change_problem`;
        the feed's rules quarantined the others), else the run fails here, with nothing committed."""
        import pyarrow.parquet as pq

        problems = [p for path in paths for p in change_problems(self.spec, pq.read_table(path))]
        if problems:
            raise MergeRefusedError(
                f"feed '{self.feed.name}': plan {plan_id}: {len(problems)} staged changes cannot be applied to "
                f"Iceberg table {self.table_name} ({'; '.join(problems[:5])}); nothing was committed. The feed's rules "
                "should have quarantined them: report this with the feed file"
            )

    def commit(
        self,
        table: Table,
        paths: list[str],
        properties: Mapping[str, str],
        evolve_to: pa.Schema | None,
        partition_by: PartitionSpecArg | None,
    ) -> dict[str, Any]:
        del partition_by  # a keyed table stays unpartitioned
        feed = properties.get(FEED_KEY, self.feed.name)
        try:
            counts = apply_changes(table, self.spec, read_changes(table, paths), properties, self.table_name, evolve_to)
        except MergeRefusedError as exc:
            raise MergeRefusedError(refused_after_commit(self.table_name, feed, properties, str(exc))) from exc
        for path in paths:  # in no snapshot: the merge wrote the table's own files
            with contextlib.suppress(FileNotFoundError, StateStoreError, OSError):
                Location.of(path).remove_file()
        message = (
            f"Iceberg table {self.table_name}: plan {properties.get(PLAN_KEY)} of feed '{feed}' applied "
            f"{counts.changes} changes: {counts.upserts} rows written, {counts.deletes} keys deleted, "
            f"{counts.superseded} superseded by a later change of their key in the plan, {counts.stale} skipped as "
            f"stale (the table already held their key's state or a newer one)"
        )
        events = [{"kind": "changes_applied", "message": message, "details": {"table": self.table_name,
                                                                              **counts.to_dict()}}]  # fmt: skip
        for topic, old in sorted(counts.old_topic_ids.items()):
            new = json.loads(properties.get(RANGES_KEY) or "[]")
            new_id = next((r.get("topic_id") for r in new if r.get("topic") == topic), None)
            events.append({
                "kind": "topic_recreated",
                "topic": topic,
                "message": (
                    f"Iceberg table {self.table_name}: topic {topic} was deleted and recreated (id {new_id}, before "
                    f"{', '.join(sorted(old))}): {counts.recreated} rows of the old topic were replaced or deleted by "
                    "the new topic's changes, whose offsets do not compare with the old ones"
                ),
                "details": {"table": self.table_name, "topic": topic, "old_topic_ids": sorted(old),
                            "new_topic_id": new_id, "replaced": counts.recreated},
            })  # fmt: skip
        return {"changes": counts.to_dict(), "events": events}
