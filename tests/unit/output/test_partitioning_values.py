"""Partitioning at its edges: every Kafka-timestamp choice, every field kind, Iceberg's names, and the folder value
each record gets, at the boundaries where it changes (the last millisecond of an hour, of a day, of a month; a value
one below a truncate step; a text as long as the width; a null)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import types as T

from tidemark.config.models import FieldPartitioning
from tidemark.errors import ConfigError
from tidemark.output.partitioning import (
    PartitionField,
    _kind,
    field_name,
    folder_value,
    kafka_fields,
    partition_fields,
    spec_pairs,
)


@pytest.mark.parametrize(
    ("column", "transform", "name"),
    [("c", "identity", "c"), ("c", "day", "c_day"), ("c", "truncate[10]", "c_trunc"), ("c", "truncate", "c_truncate"),
     ("c", "bucket[4]", "c_bucket[4]"), ("c", "xtruncate[1]", "c_xtruncate[1]")],
)  # fmt: skip
def test_iceberg_field_names(column: str, transform: str, name: str) -> None:
    assert field_name(column, transform) == name


def test_every_kafka_choice() -> None:
    assert kafka_fields("none") == ()
    assert kafka_fields("date") == (
        PartitionField("date", "identity", "date"),
        PartitionField("topic", "identity", "topic"),
    )
    for choice in ("hour", "day", "month"):
        assert kafka_fields(choice) == (
            PartitionField("timestamp", choice, f"timestamp_{choice}", granularity=choice),
            PartitionField("topic", "identity", "topic"),
        )
    assert kafka_fields("date")[0].identity and not kafka_fields("day")[0].identity
    assert spec_pairs(kafka_fields("day")) == {("timestamp", "day"), ("topic", "identity")}


@pytest.mark.parametrize(
    ("data_type", "kind"),
    [(T.TimestampType(), "timestamp"), (T.TimestampNTZType(), "timestamp"), (T.DateType(), "date"),
     (T.LongType(), "integer"), (T.IntegerType(), "integer"), (T.ShortType(), "integer"), (T.ByteType(), "integer"),
     (T.StringType(), "string"), (T.DecimalType(10, 2), "decimal"), (T.StructType([]), "nested"),
     (T.ArrayType(T.StringType()), "nested"), (T.MapType(T.StringType(), T.StringType()), "nested"),
     (T.DoubleType(), "scalar"), (T.BooleanType(), "scalar"), (T.BinaryType(), "scalar")],
)  # fmt: skip
def test_each_spark_type_has_its_kind(data_type: Any, kind: str) -> None:
    assert _kind(data_type) == kind


SCHEMA = T.StructType([
    T.StructField("ts", T.TimestampType()), T.StructField("ms", T.LongType()), T.StructField("country", T.StringType()),
    T.StructField("n", T.LongType()), T.StructField("amount", T.DecimalType(10, 2)),
    T.StructField("ms_day", T.StringType()), T.StructField("flag", T.BooleanType()),
])  # fmt: skip


def test_a_derived_name_that_is_already_a_field_is_refused_and_one_equal_to_the_field_is_not() -> None:
    with pytest.raises(ConfigError, match=r"feed 'orders': iceberg.partition_by: the partition of field 'ms' would be "
                       r"named 'ms_day', which is already a field of the value; .* Nothing was published"):  # fmt: skip
        partition_fields(FieldPartitioning(field="ms", granularity="day"), SCHEMA, "iceberg", "orders")
    # identity: the partition is named as the field itself, which is no clash
    assert partition_fields(FieldPartitioning(field="country"), SCHEMA, "iceberg", "orders") == (
        PartitionField("country", "identity", "country"),
    )
    # a Parquet folder of a field's value is <field>_value, beside the column: a field of that name is a clash
    clash = T.StructType([*SCHEMA.fields, T.StructField("country_value", T.StringType())])
    with pytest.raises(ConfigError, match=r"parquet.partition_by: the partition of field 'country' would be named "
                       r"'country_value', which is already a field"):  # fmt: skip
        partition_fields(FieldPartitioning(field="country"), clash, "parquet", "orders")
    assert partition_fields(FieldPartitioning(field="country"), clash, "iceberg", "orders")[0].name == "country"


def test_epoch_milliseconds_by_output_and_a_missing_field_named_with_the_fields_there() -> None:
    hour = FieldPartitioning(field="ms", granularity="hour")
    assert partition_fields(hour, SCHEMA, "iceberg", "o")[0].transform == "truncate[3600000]"
    assert partition_fields(hour, SCHEMA, "parquet", "o")[0].transform == "hour"
    assert partition_fields(FieldPartitioning(field="ts", granularity="hour"), SCHEMA, "iceberg", "o")[0] == (
        PartitionField("ts", "hour", "ts_hour", granularity="hour", epoch_ms=False)
    )
    with pytest.raises(ConfigError) as err:
        partition_fields(FieldPartitioning(field="nope"), SCHEMA, "parquet", "orders")
    assert str(err.value) == (
        "feed 'orders': parquet.partition_by: 'nope' is not a field of the decoded value (its fields: ts, ms, country, "
        "n, amount, ms_day, flag); name a top-level field of the value's schema. Nothing was published"
    )
    with pytest.raises(ConfigError, match=r"^feed 'orders': .*'flag' is boolean.*\. Nothing was published$"):
        partition_fields(FieldPartitioning(field="flag", granularity="day"), SCHEMA, "iceberg", "orders")


UTC = dt.UTC


def _ms(*args: int) -> int:
    return int(dt.datetime(*args, tzinfo=UTC).timestamp() * 1000)


def test_folder_values_at_their_boundaries(spark: Any) -> None:
    """One Spark job: each record's folder under each kind of partition field, around where the folder changes."""
    rows = [
        (dt.datetime(2026, 11, 27, 10, 59, 59, 999000), _ms(2026, 11, 27, 10, 59, 59) + 999, "DE", 99, Decimal("0.49")),
        (dt.datetime(2026, 11, 27, 11, 0, 0), _ms(2026, 11, 27, 11), "DEU", 100, Decimal("0.50")),
        (dt.datetime(2026, 11, 30, 23, 59, 59), _ms(2026, 12, 1) - 1, "D", -1, Decimal("-0.01")),
        (None, None, None, None, None),
    ]
    schema = T.StructType(SCHEMA.fields[:5])
    frame = spark.createDataFrame(rows, schema)
    fields = {
        "ts_hour": PartitionField("ts", "hour", "ts_hour", granularity="hour"),
        "ts_day": PartitionField("ts", "day", "ts_day", granularity="day"),
        "ms_hour": PartitionField("ms", "truncate[3600000]", "ms_hour", granularity="hour", epoch_ms=True),
        "ms_month": PartitionField("ms", "month", "ms_month", granularity="month", epoch_ms=True),
        "ms_year": PartitionField("ms", "year", "ms_year", granularity="year", epoch_ms=True),
        "country_trunc": PartitionField("country", "truncate[2]", "country_trunc"),
        "n_trunc": PartitionField("n", "truncate[100]", "n_trunc"),
        "amount_trunc": PartitionField("amount", "truncate[50]", "amount_trunc"),
        "country": PartitionField("country", "identity", "country"),
        "n": PartitionField("n", "identity", "n"),
    }
    out = frame.select(*[folder_value(f, schema).alias(name) for name, f in fields.items()]).collect()
    assert [r.asDict() for r in out] == [
        {"ts_hour": "2026-11-27-10", "ts_day": "2026-11-27", "ms_hour": "2026-11-27-10", "ms_month": "2026-11",
         "ms_year": "2026", "country_trunc": "DE", "n_trunc": "0", "amount_trunc": "0.00", "country": "DE", "n": "99"},
        {"ts_hour": "2026-11-27-11", "ts_day": "2026-11-27", "ms_hour": "2026-11-27-11", "ms_month": "2026-11",
         "ms_year": "2026", "country_trunc": "DE", "n_trunc": "100", "amount_trunc": "0.50", "country": "DEU",
         "n": "100"},
        {"ts_hour": "2026-11-30-23", "ts_day": "2026-11-30", "ms_hour": "2026-11-30-23", "ms_month": "2026-11",
         "ms_year": "2026", "country_trunc": "D", "n_trunc": "-100", "amount_trunc": "-0.50", "country": "D",
         "n": "-1"},
        dict.fromkeys(fields),
    ]  # fmt: skip
