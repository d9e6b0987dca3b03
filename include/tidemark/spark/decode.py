"""Decoding record keys and values per feed, with every failure kept aside and counted.

A feed's ``deserialization`` says how values are read: raw ``bytes``, UTF-8 ``string``,
``json`` with declared top-level fields (``integer`` → long, ``number`` → double,
``string``, ``boolean``) or a schema in Spark's DDL (``schema_ddl``: structs, arrays, maps,
decimals, dates, timestamps; a top-level ``NOT NULL`` field is required), or ``avro``,
``json_schema`` or ``protobuf`` in the Schema Registry wire format (the reader schema's
fields as typed, possibly nested columns; :mod:`tidemark.spark.avro`,
:mod:`tidemark.spark.json_schema` and :mod:`tidemark.spark.protobuf` find the schemas
first); keys are UTF-8 strings unless ``key_format`` is ``bytes`` or a registry format
(the key's reader schema as one typed ``key`` column: a struct, or a scalar for a primitive
Avro schema). Decoding is done with Spark's own column functions (JVM speed, no Python per
record; Protobuf and JSON Schema are parsed in the Python workers, over Arrow batches) and splits the
records in two: ``good`` carries the decoded columns; ``bad`` carries the raw record plus
``decode_error``, the first reason it failed. No record is dropped: every input row is in
exactly one of the two.

Decoded JSON and registry fields become top-level columns of ``good`` (so expectations
can name them) and replace the raw ``value``. What counts as a failure: a key or value that is
not valid UTF-8 (when decoded as text); a JSON value that does not parse, is not an
object, or has a field of the wrong type (strings accept any scalar, as Spark's JSON
reader does); a required field that is missing or null; a null value (tombstone) when
the declared schema has required fields; a registry-format key or value that does not
decode against its schema (:func:`registry_reasons`; JSON Schema's name the field and the rule), and a null
registry-format value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemark.config.models import REGISTRY_FORMATS, Deserialization, RecordPart
from tidemark.errors import ConfigError
from tidemark.staged import (
    DATE_COLUMN,
    DIGEST_COLUMNS,
    ERROR_COLUMN,
    OUTCOME_COLUMN,
    RAW_HEAD_COLUMNS,
    RAW_KEY_COLUMN,
    RAW_VALUE_COLUMN,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from tidemark.spark.avro import AvroSchemas
    from tidemark.spark.json_schema import JsonSchemas
    from tidemark.spark.protobuf import ProtobufSchemas

    RunSchemas: TypeAlias = AvroSchemas | JsonSchemas | ProtobufSchemas

METADATA_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "headers", "plan_id")
# Names a declared field may not take: record columns, and the job's own (tidemark.staged; ``date`` partitions
# the output).
RESERVED_COLUMNS = frozenset({
    *METADATA_COLUMNS, "value", ERROR_COLUMN, RAW_VALUE_COLUMN, RAW_KEY_COLUMN, *RAW_HEAD_COLUMNS.values(),
    *DIGEST_COLUMNS, OUTCOME_COLUMN, DATE_COLUMN,
})  # fmt: skip
_CORRUPT = "_tidemark_corrupt"
_PARSED = "_tidemark_parsed"
_PARSED_KEY = "_tidemark_parsed_key"


@dataclass(frozen=True)
class Decoded:
    """``good``: decoded records; ``bad``: raw records that failed, with ``decode_error``."""

    good: DataFrame
    bad: DataFrame


def declared_json(deser: Deserialization) -> tuple[StructType, tuple[str, ...]]:
    """The JSON value's declared type (every field nullable, as ``from_json`` reads) and its required fields.

    ``schema_ddl`` is parsed by Spark (an active session is needed); ``fields`` map to scalars.
    """
    from pyspark.sql import types as T

    if deser.schema_ddl is None:
        scalars = {
            "string": T.StringType(),
            "integer": T.LongType(),
            "number": T.DoubleType(),
            "boolean": T.BooleanType(),
        }
        declared = T.StructType([T.StructField(f.name, scalars[f.type], not f.required) for f in deser.fields])
    else:
        try:
            declared = T.DataType.fromDDL(deser.schema_ddl)
        except Exception as exc:  # Spark's parser raises ParseException (and others for unknown types)
            raise ConfigError(
                f"deserialization.schema_ddl {deser.schema_ddl!r} is not a Spark DDL schema "
                f"('name type, ...', e.g. 'id long NOT NULL, customer struct<id: long>'): {str(exc).strip()[:300]}"
            ) from exc
        if not isinstance(declared, T.StructType):
            raise ConfigError(
                f"deserialization.schema_ddl {deser.schema_ddl!r} must list named fields ('name type, ...')"
            )
    required = tuple(f.name for f in declared.fields if not f.nullable)
    return T.StructType([T.StructField(f.name, f.dataType, True) for f in declared.fields]), required


def check_fields(deser: Deserialization) -> None:
    """Declared JSON fields must not clash with the record's metadata columns."""
    names = declared_json(deser)[0].names
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


def decode_reasons(
    deser: Deserialization, schemas: RunSchemas | None = None, key_schemas: RunSchemas | None = None
) -> list[str]:
    """Every reason a record of ``deser`` can fail to decode, in the order they are checked; ``schemas`` and
    ``key_schemas``, the run's, add the reasons that name a field of the reader (Protobuf's, JSON Schema's).

    The first that applies is the record's :data:`ERROR_COLUMN`; the job stages a failed
    record under its index here (a short code), not under the text. JSON Schema's reasons
    name fields of the run's ``schemas`` / ``key_schemas``, so they need them.
    """
    reasons: list[str] = []
    if deser.key_format == "string":
        reasons.append("key is not valid UTF-8")
    elif deser.key_format in REGISTRY_FORMATS:
        reasons += registry_reasons(deser.key_format, "key", key_schemas)
    if deser.format == "string":
        reasons.append("value is not valid UTF-8")
    elif deser.format == "json":
        required = declared_json(deser)[1]
        if required:
            reasons.append("value is null (tombstone)")
        reasons.append("value is not valid UTF-8")
        reasons.append("value is not a JSON object matching the declared field types")
        reasons += [f"required field '{name}' is missing or null" for name in required]
    elif deser.format in REGISTRY_FORMATS:
        reasons.append("value is null (tombstone)")
        reasons += registry_reasons(deser.format, "value", schemas)
    return reasons


def registry_reasons(fmt: str, part: RecordPart, schemas: RunSchemas | None = None) -> list[str]:
    """Why a non-null key or value of a Schema Registry format does not decode, in the order they are checked;
    with the run's ``schemas``, a Protobuf reader's ``Timestamp`` fields each have their own, and JSON Schema's
    reasons name the reader's fields."""
    if fmt == "avro":
        return [
            f"{part} does not decode against its Avro writer schema",
            f"{part} has bytes left over after the fields of its Avro writer schema",
        ] + [
            f"{part} field '{name}' is a timestamp-millis whose microseconds overflow a long (epoch nanoseconds or "
            "microseconds in a millis field?)"
            for name in _millis_fields(schemas)
        ]
    if fmt == "json_schema":
        from tidemark.spark.json_schema import JsonSchemas, base_reasons

        return schemas.reasons() if isinstance(schemas, JsonSchemas) else list(base_reasons(part))
    return [f"{part} does not decode as the Protobuf message of its writer schema"] + [
        f"{part} field '{path}' is a google.protobuf.Timestamp outside years 1 to 9999, which Spark's timestamps "
        "cannot hold"
        for path in _timestamp_paths(schemas)
    ]


def _millis_fields(schemas: RunSchemas | None) -> list[str]:
    if schemas is None:  # no run's schemas (this module's constants): nothing to import
        return []
    from tidemark.spark.avro import AvroSchemas, millis_fields

    return millis_fields(schemas) if isinstance(schemas, AvroSchemas) else []


def _timestamp_paths(schemas: RunSchemas | None) -> list[str]:
    if schemas is None:
        return []
    from tidemark.spark.protobuf import ProtobufSchemas, timestamp_paths

    return timestamp_paths(schemas.descriptor()) if isinstance(schemas, ProtobufSchemas) else []


AVRO_BODY_REASON, AVRO_LEFT_OVER_REASON = registry_reasons("avro", "value")
_, JSON_SCHEMA_BODY_REASON, JSON_SCHEMA_RULE_REASON = registry_reasons("json_schema", "value")
PROTOBUF_BODY_REASON = registry_reasons("protobuf", "value")[0]


@dataclass(frozen=True)
class _Reasons:
    """A column giving the failure reason itself (null where none), standing for ``count`` reasons in a row."""

    column: Column
    count: int


def _registry_decoding(
    work: DataFrame, fmt: str, schemas: RunSchemas | None, column: str, parsed_name: str
) -> tuple[DataFrame, Column, list[Column | _Reasons]]:
    """``work`` with ``column`` (``key`` or ``value``) decoded as ``parsed_name``, that column, and one failure
    condition per :func:`registry_reasons` entry (a null ``column`` never fails here)."""
    from pyspark.sql import functions as F

    if schemas is None:
        option = "format" if column == "value" else "key_format"
        raise ConfigError(f"{option}: {fmt} decodes with the run's schemas (tidemark.spark.wire)")
    present = F.col(column).isNotNull()
    if fmt == "avro":
        from tidemark.spark import avro

        assert isinstance(schemas, avro.AvroSchemas)
        work = work.withColumn(parsed_name, avro.decoded_value(schemas, column))
        whole = F.col(parsed_name)
        failed = present & avro.decode_failed(whole, schemas)
        names = _millis_fields(schemas)
        overflow_name = f"{parsed_name}_millis_overflow"
        if names:  # which field a record failed on, asked only of records that failed
            work = work.withColumn(overflow_name, F.when(failed, avro.millis_overflow(schemas, column)))
        overflow = F.col(overflow_name)
        overflowed = [failed & (overflow == F.lit(name)) for name in names]
        undecoded = failed & overflow.isNull() if names else failed
        left_over = present & ~failed & avro.bytes_left_over(whole)
        return work, whole.getField(avro.VALUE_FIELD), [undecoded, left_over, *overflowed]
    if fmt == "json_schema":  # decoded in the Python workers, which give each bad record's reason
        from tidemark.spark.json_schema import REASON, JsonSchemas
        from tidemark.spark.json_schema import decoded_frame as json_decoded

        assert isinstance(schemas, JsonSchemas)
        work = json_decoded(work, schemas, parsed_name, column)
        parsed = F.col(parsed_name)
        return work, parsed, [_Reasons(F.when(present, parsed.getField(REASON)), len(schemas.reasons()))]
    from tidemark.spark.protobuf import ProtobufSchemas, decoded_frame, out_of_range_column

    assert isinstance(schemas, ProtobufSchemas)
    work = decoded_frame(work, schemas, parsed_name, column)
    parsed, why = F.col(parsed_name), F.col(out_of_range_column(parsed_name))
    out_of_range = [present & (why == F.lit(path)) for path in _timestamp_paths(schemas)]
    return work, parsed, [present & parsed.isNull() & why.isNull(), *out_of_range]


def _published_key(fmt: str, schemas: RunSchemas, parsed: Column) -> Column:
    """The decoded key as published: the reader's struct (or scalar) without decoding's own marks."""
    if fmt == "json_schema":
        from tidemark.spark.json_schema import REASON

        return parsed.dropFields(REASON)
    return parsed


def _decoding(
    df: DataFrame, deser: Deserialization, schemas: RunSchemas | None = None, key_schemas: RunSchemas | None = None
) -> _Decoding:
    from pyspark.sql import functions as F

    check_fields(deser)
    failed: list[Column | _Reasons] = []  # one condition per decode_reasons(deser) entry, in its order
    work = df
    key_col: Column = F.col("key")
    if deser.key_format == "string":
        key_col = F.col("key").cast("string")
        failed.append(F.col("key").isNotNull() & ~F.is_valid_utf8(key_col))
    elif deser.key_format in REGISTRY_FORMATS:
        work, parsed_key, key_failed = _registry_decoding(work, deser.key_format, key_schemas, "key", _PARSED_KEY)
        assert key_schemas is not None
        key_col = _published_key(deser.key_format, key_schemas, parsed_key)
        failed += key_failed

    value_cols: list[Column]
    if deser.format == "bytes":
        value_cols = [F.col("value")]
    elif deser.format == "string":
        text = F.col("value").cast("string")
        failed.append(F.col("value").isNotNull() & ~F.is_valid_utf8(text))
        value_cols = [text.alias("value")]
    elif deser.format in REGISTRY_FORMATS:
        work, parsed, value_failed = _registry_decoding(work, deser.format, schemas, "value", _PARSED)
        assert schemas is not None
        failed.append(F.col("value").isNull())
        failed += value_failed
        value_cols = [parsed.getField(name).alias(name) for name in schemas.field_names]
    else:
        text = F.col("value").cast("string")
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
        declared, required = declared_json(deser)
        from pyspark.sql.types import StringType, StructField, StructType

        # A new struct: add() would change declared itself, and its names are the value columns below.
        with_corrupt = StructType([*declared.fields, StructField(_CORRUPT, StringType())])
        work = work.withColumn(_PARSED, F.from_json(text, with_corrupt, options))
        parsed = F.col(_PARSED)
        if required:
            failed.append(F.col("value").isNull())
        failed.append(~F.is_valid_utf8(text))
        failed.append(parsed.getField(_CORRUPT).isNotNull())
        failed += [F.col("value").isNotNull() & parsed.getField(name).isNull() for name in required]
        value_cols = [parsed.getField(name).alias(name) for name in declared.names]
    whys = decode_reasons(deser, schemas, key_schemas)
    reasons: list[Column] = []
    for c in failed:
        if isinstance(c, _Reasons):  # its own reasons, in decode_reasons' order
            reasons.append(c.column)
            whys = whys[c.count :]
        else:
            reasons.append(F.when(c, F.lit(whys[0])))
            whys = whys[1:]
    assert not whys, "one failure condition per decode reason"
    error = F.coalesce(*reasons) if reasons else F.lit(None).cast("string")
    return _Decoding(work, key_col, value_cols, error)


def raw_value_kept(deser: Deserialization) -> bool:
    """Whether the decoded columns lose the raw value (JSON, registry formats), so :func:`annotate` keeps it aside."""
    return deser.format in ("json", *REGISTRY_FORMATS)


def raw_key_kept(deser: Deserialization) -> bool:
    """Whether the decoded key loses the raw key (registry formats), so :func:`annotate` keeps it aside."""
    return deser.key_format in REGISTRY_FORMATS


def annotate(
    df: DataFrame, deser: Deserialization, schemas: RunSchemas | None = None, key_schemas: RunSchemas | None = None
) -> DataFrame:
    """Every record of ``df`` decoded, in one projection: no row is dropped or split off.

    Columns: the metadata columns, ``key`` (decoded), the value column(s) (``value``, or
    the declared JSON fields), ``headers``, ``plan_id`` and :data:`ERROR_COLUMN`, null
    where the record decoded and the first reason where it did not. A row that failed
    keeps its raw bytes: a string ``key`` or ``value`` is Spark's byte-preserving cast of
    the binary, JSON and registry-format values (whose fields cannot hold them) get the raw
    value as :data:`RAW_VALUE_COLUMN` (see :func:`raw_value_kept`), and registry-format keys
    the raw key as :data:`RAW_KEY_COLUMN`. ``schemas`` and ``key_schemas``: the run's
    registry schemas of the value and the key, when their format needs them.
    """
    d = _decoding(df, deser, schemas, key_schemas)
    raw = [d.work["value"].alias(RAW_VALUE_COLUMN)] if raw_value_kept(deser) else []
    if raw_key_kept(deser):
        raw.append(d.work["key"].alias(RAW_KEY_COLUMN))
    return d.work.select(*d.record(*raw), d.error.alias(ERROR_COLUMN))


def decode(
    df: DataFrame, deser: Deserialization, schemas: RunSchemas | None = None, key_schemas: RunSchemas | None = None
) -> Decoded:
    """Split ``df`` (the source's schema) into decoded ``good`` rows and raw ``bad`` rows."""
    from pyspark.sql import functions as F

    d = _decoding(df, deser, schemas, key_schemas)
    work = d.work.withColumn(ERROR_COLUMN, d.error)
    good = work.where(F.col(ERROR_COLUMN).isNull()).select(*d.record())
    bad = work.where(F.col(ERROR_COLUMN).isNotNull()).select(*df.columns, ERROR_COLUMN)
    return Decoded(good=good, bad=bad)
