"""The dead-letter table found in the catalog: one an older Tidemark made gains the columns it lacks; a table that is
no dead-letter table (another named by ``iceberg.dead_letters``) is refused, naming it. On a local SQLite catalog."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from tidemark.errors import ConfigError
from tidemark.output.dead_letter_table import open_table, schema
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
