"""Decoding record keys and values per feed, with every failure kept aside and counted.

A feed's ``deserialization`` says how values are read: raw ``bytes``, UTF-8 ``string``,
``json`` with declared top-level fields (``integer`` → long, ``number`` → double,
``string``, ``boolean``), or ``avro`` in the Schema Registry wire format (the reader
schema's fields as typed, possibly nested columns; :mod:`tidemark.spark.avro` finds and
resolves the schemas first); keys are UTF-8 strings unless ``key_format: bytes``. Decoding
is done with Spark's own column functions (JVM speed, no Python per record) and splits
the records in two: ``good`` carries the decoded columns; ``bad`` carries the raw
record plus ``decode_error``, the first reason it failed. No record is dropped: every
input row is in exactly one of the two.

Decoded JSON and Avro fields become top-level columns of ``good`` (so expectations can name
them) and replace the raw ``value``. What counts as a failure: a key or value that is
not valid UTF-8 (when decoded as text); a JSON value that does not parse, is not an
object, or has a field of the wrong type (strings accept any scalar, as Spark's JSON
reader does); a required field that is missing or null; a null value (tombstone) when
the declared schema has required fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemark.config.models import Deserialization, JsonField
from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from tidemark.spark.avro import AvroSchemas

ERROR_COLUMN = "decode_error"
METADATA_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "headers", "plan_id")
RAW_VALUE_COLUMN = "_raw_value"
OUTCOME_COLUMN = "_outcome"  # the job's staging partition: "ok" or why a record is bad
# Names a declared field may not take: record columns, and the job's own (``date`` partitions the output).
RESERVED_COLUMNS = frozenset({*METADATA_COLUMNS, "value", ERROR_COLUMN, RAW_VALUE_COLUMN, OUTCOME_COLUMN, "date"})
_SPARK_TYPES = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean"}
_CORRUPT = "_tidemark_corrupt"
_PARSED = "_tidemark_parsed"


@dataclass(frozen=True)
class Decoded:
    """``good``: decoded records; ``bad``: raw records that failed, with ``decode_error``."""

    good: DataFrame
    bad: DataFrame


def json_schema_ddl(fields: tuple[JsonField, ...]) -> str:
    """The Spark DDL of the declared fields (plus the corrupt-record column)."""
    cols = [f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in fields]
    return ", ".join([*cols, f"`{_CORRUPT}` string"])


def check_fields(deser: Deserialization) -> None:
    """Declared JSON fields must not clash with the record's metadata columns."""
    names = [f.name for f in deser.fields]
    clash = sorted(set(names) & RESERVED_COLUMNS)
    if clash:
        raise ConfigError(f"deserialization.fields: {clash} clash with Tidemark's record columns; rename them")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"deserialization.fields: {dupes} declared twice")


@dataclass(frozen=True)
class _Decoding:
    work: DataFrame  # the input plus any parse columns
    key: Column
    values: list[Column]
    error: Column  # null where the record decoded, else the first reason it did not

    def record(self, *beside_values: Column) -> list[Column | str]:
        """The decoded record's columns in order, with ``beside_values`` after the value columns."""
        return ["topic", "partition", "offset", "timestamp", "timestamp_type", self.key.alias("key"), *self.values,
                *beside_values, "headers", "plan_id"]  # fmt: skip


def decode_reasons(deser: Deserialization) -> list[str]:
    """Every reason a record of ``deser`` can fail to decode, in the order they are checked.

    The first that applies is the record's :data:`ERROR_COLUMN`; the job stages a failed
    record under its index here (a short code), not under the text.
    """
    reasons: list[str] = []
    if deser.key_format == "string":
        reasons.append("key is not valid UTF-8")
    if deser.format == "string":
        reasons.append("value is not valid UTF-8")
    elif deser.format == "json":
        required = [f for f in deser.fields if f.required]
        if required:
            reasons.append("value is null (tombstone)")
        reasons.append("value is not valid UTF-8")
        reasons.append("value is not a JSON object matching the declared field types")
        reasons += [f"required field '{f.name}' is missing or null" for f in required]
    elif deser.format == "avro":
        reasons.append("value is null (tombstone)")
        reasons.append(AVRO_BODY_REASON)
    return reasons


AVRO_BODY_REASON = "value does not decode against its Avro writer schema"


def _decoding(df: DataFrame, deser: Deserialization, avro: AvroSchemas | None = None) -> _Decoding:
    from pyspark.sql import functions as F

    check_fields(deser)
    failed: list[Column] = []  # one condition per decode_reasons(deser) entry, in its order
    work = df
    key_col: Column = F.col("key")
    if deser.key_format == "string":
        key_col = F.col("key").cast("string")
        failed.append(F.col("key").isNotNull() & ~F.is_valid_utf8(key_col))

    value_cols: list[Column]
    if deser.format == "bytes":
        value_cols = [F.col("value")]
    elif deser.format == "string":
        text = F.col("value").cast("string")
        failed.append(F.col("value").isNotNull() & ~F.is_valid_utf8(text))
        value_cols = [text.alias("value")]
    elif deser.format == "avro":
        if avro is None:
            raise ConfigError("format: avro decodes with the run's schemas (tidemark.spark.avro.resolve_schemas)")
        from tidemark.spark.avro import decode_failed, decoded_value

        work = work.withColumn(_PARSED, decoded_value(avro))
        parsed = F.col(_PARSED)
        failed.append(F.col("value").isNull())
        failed.append(F.col("value").isNotNull() & decode_failed(parsed))
        value_cols = [parsed.getField(name).alias(name) for name in avro.field_names]
    else:
        text = F.col("value").cast("string")
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
        work = work.withColumn(_PARSED, F.from_json(text, json_schema_ddl(deser.fields), options))
        parsed = F.col(_PARSED)
        required = [f for f in deser.fields if f.required]
        if required:
            failed.append(F.col("value").isNull())
        failed.append(~F.is_valid_utf8(text))
        failed.append(parsed.getField(_CORRUPT).isNotNull())
        failed += [F.col("value").isNotNull() & parsed.getField(f.name).isNull() for f in required]
        value_cols = [parsed.getField(f.name).alias(f.name) for f in deser.fields]
    reasons = [F.when(c, F.lit(why)) for c, why in zip(failed, decode_reasons(deser), strict=True)]
    error = F.coalesce(*reasons) if reasons else F.lit(None).cast("string")
    return _Decoding(work, key_col, value_cols, error)


def raw_value_kept(deser: Deserialization) -> bool:
    """Whether the decoded columns lose the raw value (JSON, Avro), so :func:`annotate` keeps it aside."""
    return deser.format in ("json", "avro")


def annotate(df: DataFrame, deser: Deserialization, avro: AvroSchemas | None = None) -> DataFrame:
    """Every record of ``df`` decoded, in one projection: no row is dropped or split off.

    Columns: the metadata columns, ``key`` (decoded), the value column(s) (``value``, or
    the declared JSON fields), ``headers``, ``plan_id`` and :data:`ERROR_COLUMN`, null
    where the record decoded and the first reason where it did not. A row that failed
    keeps its raw bytes: a string ``key`` or ``value`` is Spark's byte-preserving cast of
    the binary, and JSON feeds (whose fields cannot hold them) get the raw value as
    :data:`RAW_VALUE_COLUMN` (see :func:`raw_value_kept`).
    """
    d = _decoding(df, deser, avro)
    raw = [d.work["value"].alias(RAW_VALUE_COLUMN)] if raw_value_kept(deser) else []
    return d.work.select(*d.record(*raw), d.error.alias(ERROR_COLUMN))


def decode(df: DataFrame, deser: Deserialization, avro: AvroSchemas | None = None) -> Decoded:
    """Split ``df`` (the source's schema) into decoded ``good`` rows and raw ``bad`` rows."""
    from pyspark.sql import functions as F

    d = _decoding(df, deser, avro)
    work = d.work.withColumn(ERROR_COLUMN, d.error)
    good = work.where(F.col(ERROR_COLUMN).isNull()).select(*d.record())
    bad = work.where(F.col(ERROR_COLUMN).isNotNull()).select(*df.columns, ERROR_COLUMN)
    return Decoded(good=good, bad=bad)
