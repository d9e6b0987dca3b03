"""``partition_by`` by a field of the value: the forms that load, and refusals naming the file, the field and what
is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.feed_files import assert_refused_naming
from tidemark.config.models import FieldPartitioning, load_feed_file

JSON_FIELDS = (
    "deserialization:\n  format: json\n  fields:\n    - {name: country, type: string}\n"
    "    - {name: order_ms, type: integer}\n    - {name: paid, type: boolean}\n    - {name: total, type: number}\n"
)
DDL = (
    "deserialization:\n  format: json\n"
    "  schema_ddl: 'id long NOT NULL, order_ts timestamp, placed date, country string, "
    "customer struct<id: long, tags: array<string>>, amount decimal(10, 2)'\n"
)
ICEBERG = "topics: [orders]\ngroup: orders-batch\noutput_format: iceberg\n"
PARQUET = "topics: [orders]\ngroup: orders-batch\n"
By = FieldPartitioning


def feed_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orders.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("head", "schema", "section", "choice", "want"),
    [
        (ICEBERG, DDL, "iceberg", "{field: order_ts, granularity: day}", By(field="order_ts", granularity="day")),
        (ICEBERG, DDL, "iceberg", "{field: placed, granularity: month}", By(field="placed", granularity="month")),
        (ICEBERG, DDL, "iceberg", "{field: country}", By(field="country")),
        (ICEBERG, DDL, "iceberg", "{field: country, truncate: 2}", By(field="country", truncate=2)),
        (ICEBERG, JSON_FIELDS, "iceberg", "{field: order_ms, granularity: hour}",
         By(field="order_ms", granularity="hour")),
        (PARQUET, JSON_FIELDS, "parquet", "{field: order_ms, granularity: month}",
         By(field="order_ms", granularity="month")),
        (PARQUET, DDL, "parquet", "{field: order_ts, granularity: year}", By(field="order_ts", granularity="year")),
        (PARQUET, JSON_FIELDS, "parquet", "{field: paid}", By(field="paid")),
        (PARQUET, JSON_FIELDS, "parquet", "hour", "hour"),
        (PARQUET, JSON_FIELDS, "parquet", "none", "none"),
        # A registry format's fields are known when a run reads its schema: checked then.
        (ICEBERG, "deserialization: {format: avro}\n", "iceberg", "{field: anything, granularity: day}",
         By(field="anything", granularity="day")),
    ],
)  # fmt: skip
def test_field_choices_load(tmp_path: Path, head: str, schema: str, section: str, choice: str, want: object) -> None:
    feed = load_feed_file(feed_file(tmp_path, f"{head}{schema}{section}: {{partition_by: {choice}}}\n"))
    assert feed.partitioning == want


def test_the_default_is_the_date_layout(tmp_path: Path) -> None:
    assert load_feed_file(feed_file(tmp_path, PARQUET)).partitioning == "date"
    assert load_feed_file(feed_file(tmp_path, ICEBERG)).partitioning == "date"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (ICEBERG + DDL + "iceberg: {partition_by: {field: missing, granularity: day}}\n",
         ["iceberg.partition_by", "'missing'", "not a declared field", "order_ts"]),
        (ICEBERG + DDL + "iceberg: {partition_by: {field: country, granularity: day}}\n",
         ["iceberg.partition_by", "'country'", "string", "timestamp, date or an integer of epoch milliseconds"]),
        (ICEBERG + DDL + "iceberg: {partition_by: {field: customer}}\n",
         ["iceberg.partition_by", "'customer'", "struct", "a scalar field"]),
        (ICEBERG + DDL + "iceberg: {partition_by: {field: placed, granularity: hour}}\n",
         ["iceberg.partition_by", "'placed'", "date", "day, month or year"]),
        (ICEBERG + JSON_FIELDS + "iceberg: {partition_by: {field: order_ms, granularity: month}}\n",
         ["iceberg.partition_by", "'order_ms'", "epoch milliseconds", "hour or day"]),
        (ICEBERG + DDL + "iceberg: {partition_by: {field: order_ts, truncate: 4}}\n",
         ["iceberg.partition_by", "'order_ts'", "truncate", "string, integer or decimal"]),
        (ICEBERG + DDL + "iceberg: {partition_by: {field: country, granularity: day, truncate: 2}}\n",
         ["iceberg.partition_by", "granularity or truncate"]),
        (ICEBERG + DDL + "iceberg: {partition_by: {field: country, granularity: week}}\n",
         ["iceberg.partition_by.granularity", "hour"]),
        (ICEBERG + DDL + "iceberg: {partition_by: {column: country}}\n", ["iceberg.partition_by"]),
        (ICEBERG + DDL + "iceberg: {partition_by: week}\n", ["iceberg.partition_by", "date, hour, day, month"]),
        (PARQUET + "parquet: {partition_by: {field: country}}\n",
         ["parquet.partition_by", "'country'", "format: bytes", "no fields"]),
        (PARQUET + DDL + "parquet: {partition_by: {field: topic}}\n", ["parquet.partition_by", "'topic'"]),
        (ICEBERG + DDL + "parquet: {partition_by: day}\n", ["'parquet' settings need output_format: parquet"]),
    ],
)  # fmt: skip
def test_refusals_name_the_file_the_field_and_what_is_allowed(tmp_path: Path, text: str, names: list[str]) -> None:
    assert_refused_naming(feed_file(tmp_path, text), names)
