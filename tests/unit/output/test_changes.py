"""A keyed table's merge rules: the order of changes, the fold, staleness, and the feed file's refusals.

The merge runs on a real pyiceberg table (SQLite catalog and files in a temporary folder),
so the position columns, the ledger and the one transaction are the ones a run commits.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tidemark.config.models import parse_feed
from tidemark.errors import ConfigError
from tidemark.output.changes import (
    ChangeSpec,
    Counts,
    MergeRefusedError,
    apply_changes,
    changes_of,
    fold,
    newer,
    place,
)
from tidemark.output.iceberg import FEED_KEY, GROUP_KEY, PLAN_KEY, RANGES_KEY, RECORDS_KEY
from tidemark.staged import ERROR_COLUMN

SPEC = ChangeSpec("states", ("key",), "state", ())
RECORDS = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.string()), ("name", pa.string()), ("qty", pa.int64()),
])  # fmt: skip
ROW = pa.schema([
    ("key", pa.string()), ("name", pa.string()), ("qty", pa.int64()), ("_kafka_topic", pa.string()),
    ("_kafka_partition", pa.int32()), ("_kafka_offset", pa.int64()), ("_kafka_timestamp", pa.timestamp("us", tz="UTC")),
    ("_kafka_topic_id", pa.string()), ("_change_order", pa.string()),
])  # fmt: skip


def records(*rows: tuple[int, int, int, str, str | None, int | None]) -> pa.Table:
    """(partition, offset, timestamp s, key, name, qty) as staged records; name and qty None: a tombstone."""
    return pa.Table.from_pylist([
        {"topic": "t", "partition": p, "offset": o, "timestamp": datetime.fromtimestamp(ts, UTC), "key": k,
         "name": name, "qty": qty}
        for p, o, ts, k, name, qty in rows
    ], schema=RECORDS)  # fmt: skip


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (((3, 100), "t", 0, 5), ((3, 100), "t", 0, 4), True),  # one partition, one clock: the offset decides
        (((3, 100), "t", 0, 4), ((3, 100), "t", 0, 5), False),
        (((3, 100), "t", 0, 5), ((3, 100), "t", 0, 5), False),  # the same change is not newer than itself
        (((3, 200), "t", 1, 1), ((3, 100), "t", 0, 9), True),  # across partitions: the order decides
        (((3, 100), "t", 0, 9), ((3, 200), "t", 1, 1), False),
        (((3, 100), "t", 1, 1), ((3, 100), "t", 0, 9), True),  # a tie: then the partition, the same answer either way
        (((0, 7, 1), "t", 0, 1), ((0, 7, 0), "t", 1, 9), True),  # one LSN: the order inside the transaction
        (((0, 7, 0), "t", 0, 9), ((0, 8, 0), "t", 0, 1), False),  # a source position decides before the offset
    ],
)
def test_which_change_is_newer(a: Any, b: Any, expected: bool) -> None:
    assert newer((*a, None), (*b, None)) is expected


@pytest.mark.parametrize(
    ("source", "transaction", "expected"),
    [
        ({"lsn": 120, "ts_ms": 5}, None, (0, 120, 0)),  # PostgreSQL: the LSN first, never ts_ms
        ({"lsn": 120, "ts_ms": 5}, {"total_order": 3}, (0, 120, 3)),
        ({"file": "mysql-bin.000010", "pos": 4, "row": 2, "ts_ms": 5}, None, (1, 10, 4, 2)),  # file 10 after 9
        ({"file": "mysql-bin.000009", "pos": 900}, None, (1, 9, 900, 0)),
        ({"ts_ms": 5}, None, (2, 5)),  # the fallback
        ({"lsn": None, "ts_ms": None}, None, None),
        (None, None, None),
    ],
)  # fmt: skip
def test_a_debezium_change_is_ordered_by_its_source_position(source: Any, transaction: Any, expected: Any) -> None:
    from tidemark.output.changes import source_position

    assert source_position({"source": source, "transaction": transaction}) == expected


def test_the_order_is_the_partitions_clock_so_it_never_goes_back_within_a_partition() -> None:
    """A state record's timestamp may go backwards along its partition: it takes the partition's clock (the running
    maximum), so the order follows the offsets there, and a later plan continues from the stored clock."""
    from tidemark.output.changes import Change

    def c(partition: int, offset: int, ts: int, source: tuple[int, ...] | None = None) -> Change:
        return Change(("k",), "upsert", "t", partition, offset, ts, {"v": 1}, None, source)

    placed, clocks = place([c(0, 1, 50), c(0, 0, 100), c(1, 0, 70), c(0, 2, 120)], {}, state=True)
    assert [(x.partition, x.offset, x.order) for x in placed] == [
        (0, 0, (3, 100)), (0, 1, (3, 100)), (0, 2, (3, 120)), (1, 0, (3, 70))]  # fmt: skip
    assert clocks == {("t", 0): (3, 120), ("t", 1): (3, 70)}
    again, _ = place([c(0, 3, 10)], clocks, state=True)
    assert again[0].order == (3, 120)
    tombstone = replace(c(0, 4, 0), kind="delete", row=None)
    debezium, _ = place([c(0, 3, 0, (0, 500, 0)), tombstone], {("t", 0): (0, 400, 0)}, state=False)
    assert [x.order for x in debezium] == [(0, 500, 0), (0, 500, 0)]  # the tombstone after its delete


def test_the_fold_keeps_the_last_change_per_key_and_a_tombstone_deletes() -> None:
    counts = Counts()
    changes = changes_of(SPEC, records(
        (0, 0, 10, "a", "a1", 1), (0, 1, 11, "a", "a2", 2), (1, 0, 8, "b", "b1", 1), (0, 2, 9, "a", None, None),
        # another partition whose clock (8) is behind a's delete (placed at partition 0's clock, 11): folded away
        (1, 1, 5, "a", "a-moved", 3),
    ), counts)  # fmt: skip
    last = fold(place(changes, {}, state=True)[0], counts)
    assert {k: (c.kind, c.offset) for k, c in last.items()} == {("a",): ("delete", 2), ("b",): ("upsert", 0)}
    assert (counts.changes, counts.superseded) == (5, 3)


@pytest.fixture
def table(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path / 'w'}")
    catalog.create_namespace("ns")
    return catalog.create_table("ns.states", schema=ROW, properties={"commit.retry.num-retries": "0"})


def plan(table: Any, plan_id: str, ranges: list[tuple[int, int, int]], staged: pa.Table) -> Counts:
    spans = [{"topic": "t", "partition": p, "start": s, "end": e} for p, s, e in ranges]
    props = {PLAN_KEY: plan_id, FEED_KEY: "states", GROUP_KEY: "g", RECORDS_KEY: str(staged.num_rows),
             RANGES_KEY: json.dumps(spans)}  # fmt: skip
    return apply_changes(table, SPEC, staged, props, "ns.states", None)


def rows(table: Any) -> dict[str, tuple[Any, ...]]:
    got = table.refresh().scan().to_arrow().to_pylist()
    return {r["key"]: (r["name"], r["qty"], r["_kafka_partition"], r["_kafka_offset"]) for r in got}


def test_stale_changes_are_skipped_by_the_ledger_and_by_the_rows_position(table: Any) -> None:
    first = plan(table, "p1", [(0, 0, 2), (1, 0, 1)], records(
        (0, 0, 10, "a", "a1", 1), (0, 1, 20, "b", "b1", 1), (1, 0, 30, "c", "c1", 1)))  # fmt: skip
    assert (first.upserts, first.stale) == (3, 0)
    held = rows(table)
    # The same offsets again under another plan id: below the ledger's ends, every change is stale.
    again = plan(table, "p1-replayed", [(0, 0, 2), (1, 0, 1)], records(
        (0, 0, 10, "a", "a1", 1), (0, 1, 20, "b", "b1", 1), (1, 0, 30, "c", "c1", 1)))  # fmt: skip
    assert (again.stale, again.upserts, rows(table)) == (3, 0, held)
    # 'c' moved to partition 0 with an older timestamp than its row (partition 1): stale by the row's position;
    # 'a' moved to partition 1 with a newer one: applied; 'b' deleted.
    moved = plan(table, "p2", [(0, 2, 4), (1, 1, 2)], records(
        (0, 2, 25, "c", "c-old", 9), (1, 1, 40, "a", "a-moved", 2), (0, 3, 41, "b", None, None)))  # fmt: skip
    assert (moved.stale, moved.upserts, moved.deletes) == (1, 1, 1)
    assert rows(table) == {"a": ("a-moved", 2, 1, 1), "c": ("c1", 1, 1, 0)}
    # The first window once more, after 'b' was deleted: the ledger covers it, so 'b' is not created again.
    late = plan(table, "p1-late", [(0, 0, 2), (1, 0, 1)], records(
        (0, 0, 10, "a", "a1", 1), (0, 1, 20, "b", "b1", 1), (1, 0, 30, "c", "c1", 1)))  # fmt: skip
    assert (late.stale, late.upserts, rows(table)) == (3, 0, {"a": ("a-moved", 2, 1, 1), "c": ("c1", 1, 1, 0)})
    ledger = json.loads(table.properties["tidemark.ledger.states"])
    assert [p[0] for p in ledger["recent"]] == ["p1", "p1-replayed", "p2", "p1-late"]
    assert ledger["ends"]["t"][""] == {"0": 4, "1": 2}


DDL = "before struct<id: long>, after struct<id: long>, op string"
BASE = {
    "topics": ["t"],
    "group": "g",
    "output_format": "iceberg",
    "deserialization": {"format": "json", "schema_ddl": DDL},
}


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"output_format": "parquet", "iceberg": {"mode": "upsert", "key": "id", "change_format": "debezium"}},
         "iceberg.mode: upsert needs output_format: iceberg"),
        ({"iceberg": {"mode": "upsert", "change_format": "debezium"}}, "field 'iceberg'"),
        ({"iceberg": {"mode": "upsert", "key": "id"}}, "needs 'change_format'"),
        ({"iceberg": {"key": "id"}}, "'key' is for a keyed table: it needs mode: upsert"),
        ({"iceberg": {"mode": "upsert", "key": "after.id", "change_format": "debezium"}}, "not a nested path"),
        ({"iceberg": {"mode": "upsert", "key": "id", "change_format": "debezium"},
          "deserialization": {"format": "string"}}, "needs decoded values"),
        ({"iceberg": {"mode": "upsert", "key": "id", "change_format": "debezium"},
          "deserialization": {"format": "json", "fields": [{"name": "id", "type": "integer"}]}}, "schema_ddl"),
        ({"iceberg": {"mode": "upsert", "key": "idx", "change_format": "state"},
          "deserialization": {"format": "json", "fields": [{"name": "id", "type": "integer", "required": False}]}},
         "iceberg.key: 'idx' is not a declared field"),
        ({"iceberg": {"mode": "upsert", "key": "id", "change_format": "state"},
          "deserialization": {"format": "json", "fields": [{"name": "id", "type": "integer"}]}},
         "a tombstone (a null value, which deletes its key) would be quarantined"),
        ({"iceberg": {"mode": "upsert", "key": "id", "change_format": "debezium"}, "maintenance": {}},
         "'maintenance' is not built for iceberg.mode: upsert"),
    ],
)  # fmt: skip
def test_a_feed_file_with_an_unsuitable_change_stream_is_refused_naming_file_and_field(
    doc: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_feed("cdc", {**BASE, **doc}, "feeds/cdc.yaml")
    assert "feeds/cdc.yaml" in str(refused.value) and fragment in str(refused.value), str(refused.value)


def test_a_debezium_feed_gets_the_rule_that_quarantines_an_unknown_op_once() -> None:
    doc = {**BASE, "iceberg": {"mode": "upsert", "key": "id", "change_format": "debezium"}}
    feed = parse_feed("cdc", doc, "feeds/cdc.yaml")
    assert [(e.type, e.kwargs) for e in feed.validation.expectations] == [
        ("expect_column_values_to_be_in_set", {"column": "op", "value_set": ["c", "u", "r", "d"]})
    ]
    again = parse_feed("cdc", {**doc, "validation": feed.validation.model_dump()}, "feeds/cdc.yaml")
    assert again.validation.expectations == feed.validation.expectations


def test_a_two_column_key_deletes_and_replaces_exactly_its_own_rows(tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    spec = ChangeSpec("orders", ("region", "id"), "debezium", ())
    image = pa.struct([("region", pa.string()), ("id", pa.int64()), ("name", pa.string())])
    staged = pa.schema([*list(RECORDS)[:5], ("before", image), ("after", image), ("op", pa.string())])
    row = pa.schema([*image, *[f for f in ROW if f.name.startswith("_kafka_")]])
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path / 'w'}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.orders", schema=row, properties={"commit.retry.num-retries": "0"})

    def apply(plan_id: str, end: int, *rows: tuple[int, str, str, int, str | None]) -> Counts:
        recs = pa.Table.from_pylist([
            {"topic": "t", "partition": 0, "offset": o, "timestamp": datetime.fromtimestamp(o, UTC), "key": None,
             "op": op, "before": {"region": region, "id": i, "name": None},
             "after": None if op == "d" else {"region": region, "id": i, "name": name}}
            for o, op, region, i, name in rows
        ], schema=staged)  # fmt: skip
        spans = [{"topic": "t", "partition": 0, "start": rows[0][0], "end": end}]
        props = {PLAN_KEY: plan_id, FEED_KEY: "orders", GROUP_KEY: "g", RANGES_KEY: json.dumps(spans)}
        return apply_changes(table, spec, recs, props, "ns.orders", None)

    apply("p1", 4, (0, "c", "eu", 1, "a"), (1, "c", "us", 1, "b"), (2, "c", "eu", 2, "c"), (3, "c", "us", 2, "d"))
    # ('eu', 1) replaced and ('us', 2) deleted: ('us', 1) and ('eu', 2), which share a column value each, stay.
    counts = apply("p2", 6, (4, "u", "eu", 1, "a2"), (5, "d", "us", 2, None))
    assert (counts.upserts, counts.deletes) == (1, 1)
    got = sorted((r["region"], r["id"], r["name"]) for r in table.refresh().scan().to_arrow().to_pylist())
    assert got == [("eu", 1, "a2"), ("eu", 2, "c"), ("us", 1, "b")]


def test_a_debezium_tombstone_deletes_only_by_the_kafka_key_and_an_image_without_its_key_is_refused() -> None:
    envelope = pa.struct([("id", pa.int64()), ("name", pa.string())])
    staged = pa.schema([*list(RECORDS)[:5], ("before", envelope), ("after", envelope), ("op", pa.string())])
    t = datetime.fromtimestamp(1, UTC)
    good = [
        {"topic": "t", "partition": 0, "offset": 0, "timestamp": t, "key": "7", "before": None,
         "after": {"id": 7, "name": "x"}, "op": "c"},
        {"topic": "t", "partition": 0, "offset": 1, "timestamp": t, "key": "7", "before": None, "after": None,
         "op": None},
    ]  # fmt: skip
    unkeyed = {"topic": "t", "partition": 0, "offset": 2, "timestamp": t, "key": "8", "before": None,
               "after": {"id": None, "name": "no id"}, "op": "c"}  # fmt: skip
    by_column, by_kafka_key = Counts(), Counts()
    spec = ChangeSpec("f", ("id",), "debezium", ())
    kinds = [c.kind for c in changes_of(spec, pa.Table.from_pylist(good, schema=staged), by_column)]
    assert (kinds, by_column.ignored_tombstones) == (["upsert"], 1)
    with pytest.raises(MergeRefusedError, match=r"t\[0\] offset 2: change_without_key\(id\)"):
        changes_of(spec, pa.Table.from_pylist([*good, unkeyed], schema=staged), Counts())
    recs = pa.Table.from_pylist([*good, unkeyed], schema=staged)
    kinds = [c.kind for c in changes_of(ChangeSpec("f", ("key",), "debezium", ("op",)), recs, by_kafka_key)]
    assert (kinds, by_kafka_key.ignored_tombstones) == (["upsert", "delete", "upsert"], 0)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("ddl", "flagged"),
    [
        # c/u/r without 'after' or without a key column's value in it; d without 'before' or its value: flagged.
        ("before struct<region: string, id: long>, after struct<region: string, id: long>, op string",
         [False, True, True, True, False, True, True, False, False, False]),
        # 'before' not in the envelope: no delete has its key (as the merge reads it: counted, never applied).
        ("after struct<region: string, id: long>, op string",
         [False, True, True, True, True, True, True, False, False, False]),
    ],
)  # fmt: skip
def test_a_debezium_change_without_its_keys_value_breaks_the_feeds_change_rule_naming_the_key(
    spark: Any, ddl: str, flagged: list[bool]
) -> None:
    from pyspark.sql import functions as F

    from tidemark.validation.rules import OutcomeCodes, column_paths

    doc = {**BASE, "deserialization": {"format": "json", "schema_ddl": ddl},
           "iceberg": {"mode": "upsert", "key": ["region", "id"], "change_format": "debezium"}}  # fmt: skip
    feed = parse_feed("cdc", doc, "feeds/cdc.yaml")
    full, half = {"region": "eu", "id": 1}, {"region": "eu", "id": None}
    rows = [
        ("c", None, full), ("c", None, half), ("u", None, {"region": None, "id": 1}), ("r", None, None),
        ("d", full, None), ("d", half, None), ("d", None, None),
        (None, None, None),  # a tombstone: no change to apply, nothing to quarantine
        ("t", None, None),  # an unknown op: the feed's op rule quarantines it, not this one
        ("u", full, full),
    ]  # fmt: skip
    data = [{"op": op, "before": before, "after": after} for op, before, after in rows]
    if "before" not in ddl:
        data = [{k: v for k, v in d.items() if k != "before"} for d in data]
    df = spark.createDataFrame(data, schema=ddl)
    codes = OutcomeCodes.of(column_paths(df.schema), feed)
    decoded = df.withColumn(ERROR_COLUMN, F.lit(None).cast("string"))  # every record decoded
    got = [r["code"] for r in decoded.select(codes.column().alias("code")).collect()]
    labels = [codes.labels(code) if code != "ok" else () for code in got]
    assert [("change_without_key(region, id)" in found) for found in labels] == flagged, labels
    assert labels[8] == ("expect_column_values_to_be_in_set(op)",)  # the unknown op: the op rule's alone


@pytest.mark.spark
@pytest.mark.parametrize("key", [["region", "id"], ["key"]])
def test_the_jobs_rules_and_the_merges_own_check_refuse_the_same_changes(spark: Any, key: list[str]) -> None:
    """Whatever the merge after the commit would refuse (:func:`change_problem`), the feed's rules quarantine in the
    job before it, with the same reason: an op-less record with an image, an unknown op, a change without its key's
    value, a c/u/r without 'after' keyed by the Kafka key alone, a tombstone without a Kafka key to delete."""
    from pyspark.sql import functions as F

    from tidemark.output.changes import change_problem
    from tidemark.validation.rules import OutcomeCodes, column_paths

    ddl = "key string, before struct<region: string, id: long>, after struct<region: string, id: long>, op string"
    doc = {**BASE, "deserialization": {"format": "json", "schema_ddl": ddl},
           "iceberg": {"mode": "upsert", "key": key, "change_format": "debezium"}}  # fmt: skip
    feed = parse_feed("cdc", doc, "feeds/cdc.yaml")
    full, half = {"region": "eu", "id": 1}, {"region": "eu", "id": None}
    rows = [
        ("k", "c", None, full), ("k", "c", None, half), ("k", "r", None, None), ("k", "d", full, None),
        ("k", "d", None, None), ("k", None, None, None), (None, None, None, None), ("k", None, None, full),
        ("k", None, full, None), (None, "u", full, full), ("k", "t", None, full), ("k", "u", half, full),
    ]  # fmt: skip
    data = [{"key": k, "op": op, "before": before, "after": after} for k, op, before, after in rows]
    df = spark.createDataFrame(data, schema=ddl)
    codes = OutcomeCodes.of(column_paths(df.schema), feed)
    decoded = df.withColumn(ERROR_COLUMN, F.lit(None).cast("string"))
    got = [r["code"] for r in decoded.select(codes.column().alias("code")).collect()]
    by_rules = [set(codes.labels(code)) if code != "ok" else set() for code in got]
    spec = ChangeSpec.of(feed)
    by_merge = [{p} if (p := change_problem(spec, d)) is not None else set() for d in data]
    assert by_rules == by_merge
    assert {"change_without_op"} in by_rules and set() in by_rules


def test_the_job_refuses_staged_changes_the_merge_could_not_apply_before_anything_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's last check before it commits a keyed table's plan (or writes its pending record): a staged change
    the merge would refuse fails the run there, naming the offset, the reason, and that nothing was committed."""
    import pyarrow.parquet as pq

    from tidemark.output.changes import ChangesPublisher

    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path / "state"))
    ddl = "before struct<id: long>, after struct<id: long>, op string"
    doc = {**BASE, "deserialization": {"format": "json", "schema_ddl": ddl},
           "iceberg": {"table": "ns.cdc", "mode": "upsert", "key": "id", "change_format": "debezium"}}  # fmt: skip
    publisher = ChangesPublisher(parse_feed("cdc", doc, "feeds/cdc.yaml"))
    envelope = pa.struct([("id", pa.int64())])
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("before", envelope), ("after", envelope), ("op", pa.string())])  # fmt: skip
    good = {"topic": "t", "partition": 0, "offset": 0, "before": None, "after": {"id": 1}, "op": "c"}
    pq.write_table(pa.Table.from_pylist([good], schema=schema), tmp_path / "good.parquet")
    publisher.check_staged("p1", [tmp_path / "good.parquet"])
    opless = {**good, "offset": 1, "op": None}
    pq.write_table(pa.Table.from_pylist([good, opless], schema=schema), tmp_path / "bad.parquet")
    with pytest.raises(MergeRefusedError, match=r"plan p1: 1 staged changes .*t\[0\] offset 1: change_without_op.*"
                                                r"nothing was committed"):  # fmt: skip
        publisher.check_staged("p1", [tmp_path / "good.parquet", tmp_path / "bad.parquet"])


STATE_DDL = {"format": "json", "fields": [{"name": "email", "type": "string", "required": False},
                                          {"name": "qty", "type": "integer", "required": False}]}  # fmt: skip
CDC = {"iceberg": {"mode": "upsert", "key": "id", "change_format": "debezium"},
       "deserialization": {"format": "json", "schema_ddl": "before struct<id: long, name: string>, "
                           "after struct<id: long, name: string>, op string"}}  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({**CDC, "masking": {"fields": {"after.id": "redact"}}}, "masking.fields.after.id: redact"),
        ({**CDC, "masking": {"fields": {"before.id": "redact"}}}, "masking.fields.before.id: redact"),
        ({**CDC, "masking": {"fields": {"after": "redact"}}}, "masking.fields.after: redact"),
        ({**CDC, "masking": {"fields": {"after.id": {"truncate": 3}}}}, "masking.fields.after.id: truncate"),
        ({"iceberg": {"mode": "upsert", "key": "email", "change_format": "state"}, "deserialization": STATE_DDL,
          "masking": {"fields": {"email": {"truncate": 3}}}}, "masking.fields.email: truncate"),
        ({"iceberg": {"mode": "upsert", "key": "key", "change_format": "state"}, "deserialization": STATE_DDL,
          "masking": {"key": "redact"}}, "masking.key: redact"),
        ({"iceberg": {"mode": "upsert", "key": "key", "change_format": "state"}, "deserialization": STATE_DDL,
          "masking": {"key": {"truncate": 1}}}, "masking.key: truncate"),
    ],
)  # fmt: skip
def test_masking_that_is_not_one_to_one_is_refused_on_a_key_column_naming_file_and_field(
    doc: dict[str, Any], field: str
) -> None:
    """``redact`` gives every key one value and ``truncate`` collapses keys that share a prefix: the keyed table would
    fold distinct keys into one row. Refused at load, naming the file and the masked field."""
    with pytest.raises(ConfigError) as refused:
        parse_feed("cdc", {**BASE, **doc}, "feeds/cdc.yaml")
    text = str(refused.value)
    assert "feeds/cdc.yaml" in text and field in text and "iceberg.key" in text and "hash" in text, text


@pytest.mark.parametrize(
    "doc",
    [
        {**CDC, "masking": {"fields": {"after.id": "hash", "before.id": "hash"}}},
        {**CDC, "masking": {"fields": {"after.name": "redact", "before.name": {"truncate": 1}}}},  # not the key
        {"iceberg": {"mode": "upsert", "key": "key", "change_format": "state"}, "deserialization": STATE_DDL,
         "masking": {"key": "hash", "fields": {"email": "redact"}}},
        {"iceberg": {"mode": "upsert", "key": "email", "change_format": "state"}, "deserialization": STATE_DDL,
         "masking": {"fields": {"email": "hash"}, "key": "redact"}},  # the Kafka key is not the table's key here
    ],
)  # fmt: skip
def test_a_hashed_key_column_and_masking_beside_the_key_load(doc: dict[str, Any]) -> None:
    assert parse_feed("cdc", {**BASE, **doc}, "feeds/cdc.yaml").masking is not None
