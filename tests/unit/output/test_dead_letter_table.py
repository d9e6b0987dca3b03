"""The dead-letter table found in the catalog: one an older Tidemark made gains the columns it lacks; a table that is
no dead-letter table (another named by ``iceberg.dead_letters``) is refused, naming it. On a local SQLite catalog."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from tidemark.errors import ConfigError, PublishError
from tidemark.output.dead_letter_table import (
    append_plan,
    aware,
    holds_plan,
    open_table,
    other_feeds,
    plans_in,
    scan_rows,
    schema,
    table_rows,
)
from tidemark.output.owner import OWNER_KEY
from tidemark.storage import Location

PROPERTIES = {"commit.retry.num-retries": "0"}


def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'catalog.sqlite'}", warehouse=f"file://{tmp_path}")
    cat.create_namespace("lake")
    return cat


def test_a_dead_letter_table_without_a_later_column_gains_it(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    older = pa.schema([f for f in schema() if f.name != "feed"])
    cat.create_table("lake.orders_dead_letters", schema=older, location=f"file://{tmp_path / 'dl'}")
    table = open_table(cat, "lake.orders_dead_letters", Location.of(str(tmp_path / "dl")), PROPERTIES)
    assert [f.name for f in table.schema().fields] == [f.name for f in older] + ["feed"]
    assert table.properties["commit.retry.num-retries"] == "0"


def test_a_table_that_is_no_dead_letter_table_is_refused_naming_it(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    cat.create_table("lake.orders", schema=pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.string())]),
                     location=f"file://{tmp_path / 'orders'}")  # fmt: skip
    with pytest.raises(ConfigError, match=r"lake\.orders, named as the feed's dead-letter table \(iceberg\.dead_letters"
                                          r"\), is not one: .*\(its columns: id, value\)"):  # fmt: skip
        open_table(cat, "lake.orders", Location.of(str(tmp_path / "orders")), PROPERTIES)


STAMP = datetime(2026, 11, 20, 23, 59, 59, 999999, tzinfo=UTC)


def quarantine(folder: Path, rows: int, *, start: int = 0, topic: str = "orders", stamp: datetime = STAMP) -> Location:
    """A plan's quarantine folder as the job writes it: ``rows`` bad records of ``topic`` partition 0 from offset
    ``start``, in a ``topic=`` folder (the file has no topic column), plus files the table must not read."""
    inner = folder / f"topic={topic}"
    inner.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(
        [{"partition": 0, "offset": start + i, "timestamp": stamp.replace(tzinfo=None), "key": None,
          "value": b"\xff" + bytes([i]), "_reason": "decode_error: not UTF-8"} for i in range(rows)],
        schema=pa.schema([pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
                          pa.field("timestamp", pa.timestamp("us")), pa.field("key", pa.binary()),
                          pa.field("value", pa.binary()), pa.field("_reason", pa.string())]),
    )  # fmt: skip
    if rows:
        pq.write_table(table, inner / "part-0.parquet")
    pq.write_table(pa.concat_tables([table, table]), inner / "_part-9.parquet")  # a writer's temporary file
    (inner / ".part-0.parquet.crc").write_bytes(b"crc")
    return Location.of(str(folder))


def append(cat: SqlCatalog, tmp_path: Path, folder: Location, *, feed: str = "orders", plan_id: str = "p1",
           expected: int, owner: str | None = "orders") -> int:  # fmt: skip
    props = {**PROPERTIES, **({OWNER_KEY: owner} if owner else {})}
    return append_plan(cat, "lake.orders_dead_letters", Location.of(str(tmp_path / "dl")), folder, feed=feed,
                       plan_id=plan_id, run_id="r1", dead_lettered_at=STAMP, snapshot_properties={"tidemark.plan-id":
                       plan_id}, table_properties=props, expected=expected)  # fmt: skip


def test_a_quarantine_folder_one_row_short_of_the_committed_count_is_refused_naming_both_counts(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    folder = quarantine(tmp_path / "q" / "plan_id=p1", 3)
    with pytest.raises(PublishError, match=r"plan p1 of feed 'orders' is committed with 4 quarantined records, but "
                                           r"its quarantine folder .* holds 3: restore the folder .* The records are "
                                           r"in Kafka at the plan's ranges while retention keeps them$"):  # fmt: skip
        append(cat, tmp_path, folder, expected=4)
    assert not cat.table_exists("lake.orders_dead_letters")
    with pytest.raises(PublishError, match=r"committed with 2 quarantined records, but .* holds 3"):
        append(cat, tmp_path, folder, expected=2)
    assert append(cat, tmp_path, folder, expected=3) == 3
    assert append(cat, tmp_path, folder, expected=3) == 0  # held already: appended once


def test_a_plan_that_quarantined_nothing_creates_no_table(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    assert append(cat, tmp_path, quarantine(tmp_path / "q" / "plan_id=p1", 0), expected=0) == 0
    assert append(cat, tmp_path, Location.of(str(tmp_path / "missing")), expected=0) == 0
    assert not cat.table_exists("lake.orders_dead_letters")


def test_appended_rows_are_the_quarantined_records_with_their_plan_and_the_days_partition(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    assert append(cat, tmp_path, quarantine(tmp_path / "q" / "plan_id=p1", 2), expected=2) == 2
    table = cat.load_table("lake.orders_dead_letters")
    assert table.properties[OWNER_KEY] == "orders" and table.properties["commit.retry.num-retries"] == "0"
    assert [f.name for f in table.spec().fields] == ["day"]
    assert table.current_snapshot().summary.additional_properties["tidemark.plan-id"] == "p1"  # type: ignore[union-attr]
    rows = sorted(scan_rows(table, "orders"), key=lambda row: row["offset"])
    assert [(r["topic"], r["partition"], r["offset"], r["value"], r["plan_id"], r["run_id"], r["reason_codes"],
             r["day"].isoformat(), r["dead_lettered_at"], r["timestamp"], r["timestamp_type"]) for r in rows] == [
        ("orders", 0, o, b"\xff" + bytes([o]), "p1", "r1", ["decode_error"], "2026-11-20", STAMP, STAMP, 0)
        for o in (0, 1)
    ]  # fmt: skip
    assert holds_plan(table, "p1") and not holds_plan(table, "p") and plans_in(table, "orders") == {"p1"}
    assert plans_in(table, "order") == set() and scan_rows(table, "order") == []  # a prefix of the feed's name


@pytest.mark.parametrize("stamp", [STAMP, STAMP.replace(hour=12)], ids=["day-end", "mid-day"])
def test_a_listing_since_a_time_keeps_the_records_stamped_at_it_and_drops_those_a_microsecond_before(
    tmp_path: Path, stamp: datetime
) -> None:
    cat = catalog(tmp_path)
    append(cat, tmp_path, quarantine(tmp_path / "q" / "plan_id=p1", 1, stamp=stamp), expected=1)
    table = cat.load_table("lake.orders_dead_letters")
    assert len(scan_rows(table, "orders", since=stamp)) == 1
    assert scan_rows(table, "orders", since=stamp + timedelta(microseconds=1)) == []
    assert len(scan_rows(table, "orders", since=stamp.astimezone(timezone(timedelta(hours=-5))))) == 1
    assert scan_rows(table, "payments", since=stamp) == []  # another feed's rows only


def test_a_second_feed_naming_a_dead_letter_table_another_feed_owns_or_wrote_is_refused(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    append(cat, tmp_path, quarantine(tmp_path / "q" / "plan_id=p1", 1), expected=1)
    folder = quarantine(tmp_path / "q2" / "plan_id=p2", 1, start=5)
    with pytest.raises(ConfigError, match=r"belongs to feed 'orders' .* not to feed 'payments'"):
        append(cat, tmp_path, folder, feed="payments", plan_id="p2", expected=1, owner="payments")
    table = cat.load_table("lake.orders_dead_letters")
    with table.transaction() as tx:
        tx.remove_properties(OWNER_KEY)  # an older Tidemark's table: no owner, but the rows name their feed
    assert other_feeds(cat.load_table("lake.orders_dead_letters"), "payments") == ["orders"]
    assert other_feeds(cat.load_table("lake.orders_dead_letters"), "orders") == []
    with pytest.raises(ConfigError, match=r"has no owner .* holds data of feed\(s\) 'orders'"):
        append(cat, tmp_path, folder, feed="payments", plan_id="p2", expected=1, owner="payments")
    assert append(cat, tmp_path, folder, plan_id="p2", expected=1) == 1  # its own feed adopts it
    assert cat.load_table("lake.orders_dead_letters").properties[OWNER_KEY] == "orders"


def test_a_property_someone_changed_is_set_back_when_the_table_is_opened(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    append(cat, tmp_path, quarantine(tmp_path / "q" / "plan_id=p1", 1), expected=1)
    table = cat.load_table("lake.orders_dead_letters")
    with table.transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "4"})
    reopened = open_table(cat, "lake.orders_dead_letters", Location.of(str(tmp_path / "dl")), PROPERTIES)
    assert reopened.properties["commit.retry.num-retries"] == "0"


def test_rows_of_a_file_prefer_the_raw_bytes_and_keep_the_reason_codes_and_headers(tmp_path: Path) -> None:
    rows = [{"topic": "t.x", "partition": 1, "offset": 9, "timestamp": None, "timestamp_type": 1, "key": "k",
             "value": "v", "_raw_key": b"K", "_raw_value": b"V", "_reason": "a; b", "_reason_codes": ["rule(x)"],
             "headers": [{"key": "h", "value": b"1"}, {"key": "n", "value": None}]}]  # fmt: skip
    [row] = table_rows(pa.Table.from_pylist(rows), "topic=other/part-0.parquet", feed="f", plan_id="p", run_id=None,
                       dead_lettered_at=None)  # fmt: skip
    assert row == {
        "topic": "t.x", "partition": 1, "offset": 9, "timestamp": None, "timestamp_type": 1, "key": b"K",
        "value": b"V", "headers": [{"key": "h", "value": b"1"}, {"key": "n", "value": None}], "feed": "f",
        "plan_id": "p", "run_id": None, "reason_codes": ["rule(x)"], "reason": "a; b", "dead_lettered_at": None,
        "day": None,
    }  # fmt: skip
    [plain] = table_rows(pa.Table.from_pylist([{"partition": 0, "offset": 1, "key": "é", "value": None,
                                                "_reason": None, "headers": [("h", "x")]}]),
                         "topic=a%2Eb/date=x/part-0.parquet", feed="f", plan_id="p", run_id="r",
                         dead_lettered_at=None)  # fmt: skip
    got = (plain["topic"], plain["key"], plain["value"], plain["reason"], plain["reason_codes"])
    assert got == ("a.b", "é".encode(), None, "", [])
    assert plain["headers"] == [{"key": "h", "value": b"x"}] and plain["timestamp_type"] == 0


def test_rows_of_a_string_key_and_value_that_are_not_utf8_keep_their_bytes() -> None:
    """The records that did not decode: their key and value columns are strings holding bytes that are not UTF-8."""
    bad = pa.array([b"\xff\xfe"]).view(pa.string())
    table = pa.table({"partition": [0], "offset": [3], "key": bad, "value": bad, "_reason": ["decode_error: x"]})
    [row] = table_rows(table, "topic=t/part-0.parquet", feed="f", plan_id="p", run_id="r", dead_lettered_at=None)
    assert (row["key"], row["value"], row["reason_codes"]) == (b"\xff\xfe", b"\xff\xfe", ["decode_error"])


def test_every_file_of_the_folder_is_appended_and_files_starting_with_a_dot_or_underscore_are_not(
    tmp_path: Path,
) -> None:
    cat = catalog(tmp_path)
    folder = quarantine(tmp_path / "q" / "plan_id=p1", 2)
    quarantine(tmp_path / "q" / "plan_id=p1", 3, start=10, topic="payments")
    assert append(cat, tmp_path, folder, expected=5) == 5
    rows = scan_rows(cat.load_table("lake.orders_dead_letters"), "orders")
    assert sorted((r["topic"], r["offset"]) for r in rows) == [("orders", 0), ("orders", 1), ("payments", 10),
                                                               ("payments", 11), ("payments", 12)]  # fmt: skip


def test_a_timestamp_without_a_zone_is_utc_and_one_with_a_zone_keeps_its_instant() -> None:
    naive = datetime(2026, 11, 21, 2, 0)
    assert aware(naive) == naive.replace(tzinfo=UTC) and aware(naive).tzinfo is UTC  # type: ignore[union-attr]
    east = datetime(2026, 11, 21, 2, 0, tzinfo=timezone(timedelta(hours=5)))
    assert aware(east) is east and aware("2026-11-21") is None


def test_the_day_is_the_utc_date_whatever_the_machines_zone_and_a_decoded_key_is_sorted_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The day partition of a record stamped 02:00 UTC on a machine five hours behind; a masked feed's decoded key
    (a record with a date in it) as its JSON text with sorted keys."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        stamp = datetime(2026, 11, 21, 2, 0, tzinfo=UTC)
        key = {"b": 1, "a": date(2026, 11, 20)}
        table = pa.table({"topic": ["t"], "partition": [0], "offset": [4], "timestamp": [stamp], "key": [key]})
        [row] = table_rows(table, "part-0.parquet", feed="f", plan_id="p", run_id="r", dead_lettered_at=None)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (row["topic"], row["day"]) == ("t", date(2026, 11, 21))
    assert row["key"] == b'{"a": "2026-11-20", "b": 1}'
