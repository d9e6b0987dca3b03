"""The fields a partitioning gives for a run's decoded schema: Iceberg transforms, folder names, and refusals of a
registry format's field (known only from the run's reader schema) naming the feed, the option and the fields."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from tidemark.config.models import FieldPartitioning
from tidemark.errors import ConfigError
from tidemark.output.partitioning import PartitionField, partition_fields

SCHEMA = T.StructType([
    T.StructField("id", T.LongType()), T.StructField("order_ts", T.TimestampType()),
    T.StructField("placed", T.DateType()), T.StructField("country", T.StringType()),
    T.StructField("customer", T.StructType([T.StructField("id", T.LongType())])),
    T.StructField("amount", T.DecimalType(10, 2)), T.StructField("id_trunc", T.StringType()),
])  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "output", "want"),
    [
        (FieldPartitioning(field="order_ts", granularity="day"), "iceberg",
         PartitionField("order_ts", "day", "order_ts_day", granularity="day")),
        (FieldPartitioning(field="id", granularity="hour"), "iceberg",
         PartitionField("id", "truncate[3600000]", "id_hour", granularity="hour", epoch_ms=True)),
        (FieldPartitioning(field="id", granularity="month"), "parquet",
         PartitionField("id", "month", "id_month", granularity="month", epoch_ms=True)),
        (FieldPartitioning(field="country"), "parquet", PartitionField("country", "identity", "country_value")),
        (FieldPartitioning(field="country"), "iceberg", PartitionField("country", "identity", "country")),
        (FieldPartitioning(field="amount", truncate=50), "iceberg",
         PartitionField("amount", "truncate[50]", "amount_trunc")),
    ],
)  # fmt: skip
def test_a_fields_partition(choice: FieldPartitioning, output: str, want: PartitionField) -> None:
    assert partition_fields(choice, SCHEMA, output, "orders") == (want,)


def test_kafka_choices_keep_their_specs() -> None:
    assert [f.as_list() for f in partition_fields("date", SCHEMA, "iceberg", "orders")] == [
        ["date", "identity", "date"], ["topic", "identity", "topic"]]  # fmt: skip
    assert [f.name for f in partition_fields("hour", SCHEMA, "parquet", "orders")] == ["timestamp_hour", "topic"]
    assert partition_fields("none", SCHEMA, "parquet", "orders") == ()


@pytest.mark.parametrize(
    ("choice", "output", "names"),
    [
        (FieldPartitioning(field="order_time", granularity="day"), "parquet",
         ["feed 'orders'", "parquet.partition_by", "'order_time' is not a field", "id, order_ts, placed"]),
        (FieldPartitioning(field="customer"), "iceberg", ["iceberg.partition_by", "'customer'", "struct<id:bigint>"]),
        (FieldPartitioning(field="country", granularity="day"), "iceberg",
         ["'country' is string", "timestamp, date or an integer of epoch milliseconds"]),
        (FieldPartitioning(field="id", granularity="month"), "iceberg", ["epoch milliseconds", "hour or day"]),
        (FieldPartitioning(field="id", truncate=10), "iceberg", ["'id_trunc'", "already a field"]),
    ],
)  # fmt: skip
def test_refusals_at_run_time_name_the_feed_the_option_and_the_field(
    choice: FieldPartitioning, output: str, names: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        partition_fields(choice, SCHEMA, output, "orders")
    for name in names:
        assert name in str(err.value), (name, str(err.value))
