"""A feed's partitioning as both outputs apply it: the fields of an Iceberg spec and the folders of a Parquet plan.

A feed chooses its partitioning once (``iceberg.partition_by`` / ``parquet.partition_by``,
:data:`tidemark.config.models.PartitionChoice`): by the record's Kafka timestamp (``date``,
``hour``, ``day``, ``month``), ``none``, or by a top-level field of the decoded value, its
value or its event time (:class:`tidemark.config.models.FieldPartitioning`). This module
turns the choice and the run's decoded schema into :class:`PartitionField`\\ s (source
column, Iceberg transform, the field's name) and gives the one Spark expression per field
that groups a plan's records into folders, so that each written file holds one partition
value:

- an Iceberg table's spec uses the transforms on the column itself (epoch milliseconds,
  which Iceberg's time transforms do not take, as ``truncate[3600000]`` / ``truncate[86400000]``
  of the long: the same hour or day, in UTC); ``add_files`` derives each file's partition
  from its column statistics, which one folder per partition value makes single-valued;
- a Parquet plan folder gets Hive-style folders beside the columns, which the files keep: a
  field partitioned by its value gets ``<field>_value=`` (``country_value=DE/``; a folder
  named as the column would give readers the folder's value and inferred type instead of the
  file's: ``""`` as the escape, ``"02134"`` as 2134), a transform its field's name
  (``order_ts_day=2026-11-27/``); a Kafka field (``topic=<t>/``) is the folder only.

A record whose field is null goes to the null partition (Spark's ``__HIVE_DEFAULT_PARTITION__``
folder; no Iceberg partition value); an empty string to its own folder, :data:`EMPTY_FOLDER` (Spark
would put it in the null one), so no file holds both and an Iceberg file's partition value, which
``add_files`` takes from its column statistics, is that of every row in it. The folder values are
computed from the records alone, in UTC, so a rerun of a plan puts each record in the same
partition. A registry format's fields are known only from the run's reader schema:
:func:`partition_fields` checks them then, with the same rule the feed file's check uses
(:func:`tidemark.config.models.partition_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from tidemark.config.declared import FieldKind
from tidemark.config.models import (
    EPOCH_MS_TRUNCATE,
    FieldPartitioning,
    PartitionChoice,
    partition_refusal,
)
from tidemark.errors import ConfigError
from tidemark.staged import PARTITION_COLUMNS, TOPIC_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType, StructType

TIMESTAMP_COLUMN = "timestamp"  # the record's Kafka timestamp
# The folder of an empty string: Spark puts "" in the null folder (__HIVE_DEFAULT_PARTITION__), so a file would hold
# both and Iceberg would give it the partition value "" (its column statistics): a null filter would miss its nulls.
EMPTY_FOLDER = "__TIDEMARK_EMPTY_STRING__"
# A Parquet folder of a field's own value is named <field>_value, beside the column the files keep: a folder named as
# the column would have readers take the folder's value (pyarrow's Hive partitioning does: "" read back as the escape),
# infer its type (Spark and pyarrow read "02134" as 2134), or refuse the file's column beside it (pq.read_table).
VALUE_FOLDER_SUFFIX = "_value"
# How a time partition's folder is named (in UTC): one folder, one partition value.
TIME_FOLDERS = {"hour": "yyyy-MM-dd-HH", "day": "yyyy-MM-dd", "month": "yyyy-MM", "year": "yyyy"}


@dataclass(frozen=True)
class PartitionField:
    """One field of a partitioning: its source ``column``, Iceberg's ``transform`` of it and the field's ``name``
    (``order_ts_day``, ``country``: the Iceberg partition field and the Parquet folder). ``granularity`` is set for a
    time partition, ``epoch_ms`` when its column holds epoch milliseconds."""

    column: str
    transform: str
    name: str
    granularity: str | None = None
    epoch_ms: bool = False

    @property
    def identity(self) -> bool:
        return self.transform == "identity"

    def as_list(self) -> list[str]:
        """As a pending publication stores it: ``[column, transform, name]``."""
        return [self.column, self.transform, self.name]


def field_name(column: str, transform: str) -> str:
    """Iceberg's default partition field name: the column for identity, ``<column>_trunc`` for truncate, else
    ``<column>_<transform>``."""
    if transform == "identity":
        return column
    return f"{column}_trunc" if transform.startswith("truncate[") else f"{column}_{transform}"


def kafka_fields(choice: str) -> tuple[PartitionField, ...]:
    """The fields of a Kafka-timestamp choice (``date``, ``hour``, ``day``, ``month``, ``none``)."""
    if choice == "none":
        return ()
    if choice == "date":  # the date column (the record timestamp's UTC date), then topic
        return tuple(PartitionField(c, "identity", c) for c in reversed(PARTITION_COLUMNS))
    time = PartitionField(TIMESTAMP_COLUMN, choice, field_name(TIMESTAMP_COLUMN, choice), granularity=choice)
    return (time, PartitionField(TOPIC_COLUMN, "identity", TOPIC_COLUMN))


def _kind(data_type: DataType) -> FieldKind:
    from pyspark.sql import types as T

    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        return "timestamp"
    if isinstance(data_type, T.DateType):
        return "date"
    if isinstance(data_type, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
        return "integer"
    if isinstance(data_type, T.StringType):
        return "string"
    if isinstance(data_type, T.DecimalType):
        return "decimal"
    if isinstance(data_type, (T.StructType, T.ArrayType, T.MapType)):
        return "nested"
    return "scalar"


def partition_fields(
    choice: PartitionChoice, schema: StructType, output_format: str, feed: str
) -> tuple[PartitionField, ...]:
    """The fields ``choice`` partitions records of ``schema`` (the publication's columns) by, for ``output_format``.

    A value field is checked against ``schema`` here (a registry format's reader schema is
    known only now): a missing field or one of the wrong type is a :class:`ConfigError`
    naming the feed, the option, the field, its type and what is allowed.
    """
    if not isinstance(choice, FieldPartitioning):
        return kafka_fields(choice)
    option = f"{output_format}.partition_by"
    found = next((f for f in schema.fields if f.name == choice.field), None)
    if found is None:
        raise ConfigError(
            f"feed '{feed}': {option}: {choice.field!r} is not a field of the decoded value (its fields: "
            f"{', '.join(schema.names)}); name a top-level field of the value's schema. Nothing was published"
        )
    kind = _kind(found.dataType)
    refusal = partition_refusal(choice, kind, found.dataType.simpleString(), output_format, option)
    if refusal is not None:
        raise ConfigError(f"feed '{feed}': {refusal}. Nothing was published")
    derived = field_name(choice.field, choice.granularity or choice.transform)
    if output_format == "parquet" and derived == choice.field:
        derived = f"{choice.field}{VALUE_FOLDER_SUFFIX}"  # the folder beside the column, never the column itself
    if derived != choice.field and derived in schema.names:
        raise ConfigError(
            f"feed '{feed}': {option}: the partition of field {choice.field!r} would be named {derived!r}, which is "
            "already a field of the value; partition by another field or rename that one. Nothing was published"
        )
    if choice.granularity is not None:
        epoch_ms = kind == "integer"
        transform: str = choice.granularity
        if epoch_ms and output_format == "iceberg":
            transform = f"truncate[{EPOCH_MS_TRUNCATE[choice.granularity]}]"
        return (PartitionField(choice.field, transform, f"{choice.field}_{choice.granularity}",
                               granularity=choice.granularity, epoch_ms=epoch_ms),)  # fmt: skip
    return (PartitionField(choice.field, choice.transform, derived),)


def folder_value(part: PartitionField, schema: StructType) -> Column:
    """The Spark expression of ``part``'s folder value: one value per partition (run in a UTC session); an empty
    string's folder is :data:`EMPTY_FOLDER`, never null's."""
    from pyspark.sql import functions as F

    value = _partition_value(part, schema)
    return F.when(value == F.lit(""), F.lit(EMPTY_FOLDER)).otherwise(value)


def _partition_value(part: PartitionField, schema: StructType) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    column = F.col(part.column)
    if part.granularity is not None:
        when = F.timestamp_millis(column) if part.epoch_ms else column
        return F.date_format(when, TIME_FOLDERS[part.granularity])
    if part.transform.startswith("truncate["):
        width = int(part.transform[len("truncate[") : -1])
        data_type = schema[part.column].dataType
        if isinstance(data_type, T.StringType):
            return F.substring(column, 1, width)
        step = F.lit(Decimal(width).scaleb(-data_type.scale)) if isinstance(data_type, T.DecimalType) else F.lit(width)
        return (column - F.pmod(column, step)).cast("string")
    return column.cast("string")


def spec_pairs(fields: tuple[PartitionField, ...]) -> set[tuple[str, str]]:
    """The (source column, transform) pairs of ``fields``: what a table's spec is compared by."""
    return {(f.column, f.transform) for f in fields}
