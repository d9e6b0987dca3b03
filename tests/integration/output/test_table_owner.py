"""Tables carry their feed as owner: another feed opening them is refused, naming both; adoption by rule.

Real pyiceberg tables in the SQLite catalog of a scratch state dir; no Kafka, no Spark
session (a Spark schema type only). Each feed is parsed alone, as a feed file outside the
folder's load-time check would be: the owner property is the table's own defence.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tidemark.errors import ConfigError

pytestmark = pytest.mark.integration


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    from tidemark.output import iceberg

    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path / "state"))
    for name in ("TIDEMARK_ICEBERG_CATALOG_URI", "TIDEMARK_ICEBERG_CATALOG_TYPE"):
        monkeypatch.delenv(name, raising=False)
    iceberg._catalog.cache_clear()
    yield tmp_path / "lake"
    iceberg._catalog.cache_clear()


def publisher(lake: Path, name: str, **iceberg: str) -> Any:
    from tidemark.config.models import parse_feed
    from tidemark.output.iceberg import IcebergPublisher

    doc = {"topics": ["t"], "group": f"g-{name}", "output": str(lake / name), "output_format": "iceberg",
           "iceberg": iceberg}  # fmt: skip
    return IcebergPublisher(parse_feed(name, doc, f"{name}.yaml"))


def spark_schema() -> Any:
    from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType

    return StructType([StructField("topic", StringType()), StructField("offset", LongType()),
                       StructField("date", DateType())])  # fmt: skip


def test_a_table_is_created_owned_and_refused_to_another_feed_naming_both(lake: Path) -> None:
    from tidemark.output.owner import OWNER_KEY

    orders = publisher(lake, "orders", table="lake.orders")
    table = orders.load_or_create(spark_schema())
    assert table.properties[OWNER_KEY] == "orders"
    assert orders.load() is not None  # its owner opens it

    thief = publisher(lake, "payments", table="lake.orders")
    for opens in (thief.load, lambda: thief.load_or_create(spark_schema()), lambda: thief.published("p")):
        with pytest.raises(ConfigError, match=r"lake\.orders belongs to feed 'orders'.*not to feed 'payments'"):
            opens()
    assert publisher(lake, "orders2", table="lake.orders2").load() is None  # a name sharing a prefix: another table


def test_maintenance_refuses_another_feeds_table(lake: Path) -> None:
    from tidemark.output.maintenance import maintain

    publisher(lake, "orders", table="lake.orders").load_or_create(spark_schema())
    with pytest.raises(ConfigError, match="belongs to feed 'orders'"):
        maintain(publisher(lake, "payments", table="lake.orders").feed)


def _bare_table(name: str, location: Path, properties: dict[str, str]) -> Any:
    """A table without an owner, as an older Tidemark or another tool left it."""
    from tidemark.output.iceberg import open_catalog

    catalog = open_catalog()
    catalog.create_namespace_if_not_exists(name.split(".")[0])
    schema = pa.schema([pa.field("topic", pa.string()), pa.field("offset", pa.int64())])
    return catalog.create_table(name, schema=schema, location=str(location), properties=properties)


@pytest.mark.parametrize(
    ("ledgers", "adopted"),
    [
        ((), True),  # nothing in it says whose: the first feed to open it adopts it
        (("orders",), True),  # its own ledger only
        (("payments",), False),  # another feed's ledger: refused
        (("orders", "orders2"), False),  # a feed whose name shares a prefix is another feed
    ],
)
def test_a_data_table_without_an_owner_is_adopted_unless_it_holds_another_feeds_ledger(
    lake: Path, ledgers: tuple[str, ...], adopted: bool
) -> None:
    from tidemark.output.iceberg import open_catalog
    from tidemark.output.owner import OWNER_KEY

    _bare_table("lake.orders", lake / "orders", {f"tidemark.ledger.{f}": "{}" for f in ledgers})
    orders = publisher(lake, "orders", table="lake.orders")
    if adopted:
        table = orders.load_or_create(spark_schema())
        assert table.properties[OWNER_KEY] == "orders"
        with pytest.raises(ConfigError, match="belongs to feed 'orders'"):
            publisher(lake, "payments", table="lake.orders").load()
    else:
        other = next(f for f in ledgers if f != "orders")
        with pytest.raises(ConfigError, match=rf"has no owner .* holds data of feed\(s\) '{other}'"):
            orders.load_or_create(spark_schema())
        assert OWNER_KEY not in open_catalog().load_table("lake.orders").properties  # nothing written


def _dead_letter_row(feed: str) -> dict[str, Any]:
    return {"topic": "t", "partition": 0, "offset": 1, "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
            "timestamp_type": 0, "key": None, "value": b"x", "headers": [], "feed": feed, "plan_id": "p",
            "run_id": None, "reason_codes": ["decode_error"], "reason": "r", "dead_lettered_at": datetime.now(UTC),
            "day": datetime(2026, 1, 1).date()}  # fmt: skip


@pytest.mark.parametrize(("rows_of", "adopted"), [((), True), (("orders",), True), (("orders", "payments"), False)])
def test_a_dead_letter_table_is_owned_and_one_without_an_owner_adopted_unless_another_feed_has_rows(
    lake: Path, rows_of: tuple[str, ...], adopted: bool
) -> None:
    from tidemark.output import dead_letter_table as dl
    from tidemark.output.iceberg import NO_RETRY, open_catalog
    from tidemark.output.owner import OWNER_KEY

    catalog = open_catalog()
    table = dl.open_table(catalog, "lake.bad", dl.Location.of(lake / "bad"), NO_RETRY)  # no owner: an old table
    if rows_of:
        table.append(pa.Table.from_pylist([_dead_letter_row(f) for f in rows_of], schema=dl.schema()))
    orders = publisher(lake, "orders", table="lake.orders", dead_letters="lake.bad")
    mine = {**NO_RETRY, OWNER_KEY: "orders"}
    if adopted:
        assert dl.open_table(catalog, "lake.bad", dl.Location.of(lake / "bad"), mine).properties[OWNER_KEY] == "orders"
        assert orders.dead_letter_table() is not None
        thief = publisher(lake, "payments", table="lake.payments", dead_letters="lake.bad")
        with pytest.raises(ConfigError, match=r"lake\.bad belongs to feed 'orders'.*not to feed 'payments'"):
            thief.dead_letter_table()
        with pytest.raises(ConfigError, match="belongs to feed 'orders'"):
            dl.open_table(catalog, "lake.bad", dl.Location.of(lake / "bad"), {**NO_RETRY, OWNER_KEY: "payments"})
    else:
        with pytest.raises(ConfigError, match="holds data of feed\\(s\\) 'payments'"):
            dl.open_table(catalog, "lake.bad", dl.Location.of(lake / "bad"), mine)
        with pytest.raises(ConfigError, match="holds data of feed\\(s\\) 'payments'"):
            orders.dead_letter_table()
        assert OWNER_KEY not in catalog.load_table("lake.bad").properties


def test_a_new_dead_letter_table_is_created_owned(lake: Path) -> None:
    from tidemark.output import dead_letter_table as dl
    from tidemark.output.iceberg import NO_RETRY, open_catalog
    from tidemark.output.owner import OWNER_KEY

    table = dl.open_table(open_catalog(), "lake.orders_dead_letters", dl.Location.of(lake / "d"),
                          {**NO_RETRY, OWNER_KEY: "orders"})  # fmt: skip
    assert table.properties[OWNER_KEY] == "orders"


def test_the_owner_rule_reads_the_ledgers_own_property_prefix() -> None:
    from tidemark.output import ledger, owner

    assert owner.LEDGER_PREFIX == ledger.LEDGER_PREFIX
