"""Decoding record keys and values per feed, with every failure kept aside and counted.

A feed's ``deserialization`` says how values are read: raw ``bytes``, UTF-8 ``string``,
``json`` with declared top-level fields (``integer`` → long, ``number`` → double,
``string``, ``boolean``) or a schema in Spark's DDL (``schema_ddl``: structs, arrays, maps,
decimals, dates, timestamps; a top-level ``NOT NULL`` field is required), or ``avro``,
``json_schema`` or ``protobuf`` in the Schema Registry wire format (the reader schema's
fields as typed, possibly nested columns); keys are UTF-8 strings unless ``key_format`` is
``bytes`` or a registry format (the key's reader schema as one typed ``key`` column: a
struct, or a scalar for a primitive Avro schema). A registry format decodes with the run's
schemas, which its module (:mod:`tidemark.spark.avro`, :mod:`tidemark.spark.json_schema`,
:mod:`tidemark.spark.protobuf`) builds on the driver first, and through its
:class:`~tidemark.spark.formats.RegistryFormat`, looked up by name: this module imports no
format. Decoding is done with Spark's own column functions (JVM speed, no Python per
record; Protobuf and JSON Schema are parsed in the Python workers, over Arrow batches).
:func:`annotate`, the job's, decodes every record in one projection and gives each its
:data:`ERROR_COLUMN`, the first reason it failed (null where it decoded); :func:`decode`
splits the records in two: ``good`` carries the decoded columns; ``bad`` carries the raw
record plus ``decode_error``. No record is dropped: every input row is in exactly one of the two.

Decoded JSON and registry fields become top-level columns of ``good`` (so expectations
can name them) and replace the raw ``value``. What counts as a failure
(:func:`decode_reasons`, in the order they are checked): a key or value that is not valid
UTF-8 (when decoded as text); a JSON value that does not parse, is not an object, or has a
field of the wrong type (strings accept any scalar, as Spark's JSON reader does); a
required field that is missing or null; a null value (tombstone) when the declared schema
has required fields; a registry-format key or value that does not decode against its
schema (:func:`registry_reasons`; JSON Schema's name the field and the rule), and a null
registry-format value. A feed whose tombstones are changes (a keyed table's, ``annotate(...,
tombstones=True)``) decodes a null value as a record whose value columns are null. The
record columns (:data:`ERROR_COLUMN`, :data:`RAW_VALUE_COLUMN`, ...) are named in
:mod:`tidemark.staged`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemark.config.models import REGISTRY_FORMATS, Deserialization, RecordPart
from tidemark.errors import ConfigError
from tidemark.spark.formats import Failure, Reasons, registry_format
from tidemark.staged import (
    ERROR_COLUMN,
    METADATA_COLUMNS,
    OUTCOME_COLUMN,
    RAW_HEAD_COLUMNS,
    RAW_KEY_COLUMN,
    RAW_VALUE_COLUMN,
    RESERVED_COLUMNS,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from tidemark.spark.wire import RegistrySchemas

    # A run's schemas of one registry-format part, of whichever format built them (their ``format`` says).
    RunSchemas: TypeAlias = RegistrySchemas

# The record columns are named in tidemark.staged; the job, validation and tests import them from here too.
__all__ = [
    "AVRO_BODY_REASON", "AVRO_LEFT_OVER_REASON", "ERROR_COLUMN", "JSON_SCHEMA_BODY_REASON", "JSON_SCHEMA_RULE_REASON",
    "METADATA_COLUMNS", "OUTCOME_COLUMN", "PROTOBUF_BODY_REASON", "RAW_HEAD_COLUMNS", "RAW_KEY_COLUMN",
    "RAW_VALUE_COLUMN", "RESERVED_COLUMNS", "Decoded", "annotate", "check_fields", "declared_json", "decode",
    "decode_reasons", "raw_key_kept", "raw_value_kept", "registry_reasons",
]  # fmt: skip
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
    """Why a non-null key or value of a Schema Registry format does not decode, in the order they are checked
    (:meth:`tidemark.spark.formats.RegistryFormat.reasons`); with the run's ``schemas`` of that format, a Protobuf
    reader's ``Timestamp`` fields and an Avro writer's ``timestamp-millis`` fields each have their own, and JSON
    Schema's reasons name the reader's fields. Schemas of another format count as none."""
    return registry_format(fmt).reasons(part, schemas if schemas is not None and schemas.format == fmt else None)


AVRO_BODY_REASON, AVRO_LEFT_OVER_REASON = registry_reasons("avro", "value")
_, JSON_SCHEMA_BODY_REASON, JSON_SCHEMA_RULE_REASON = registry_reasons("json_schema", "value")
PROTOBUF_BODY_REASON = registry_reasons("protobuf", "value")[0]


def _run_schemas(fmt: str, schemas: RunSchemas | None, column: str) -> RunSchemas:
    """``schemas``, which a ``column`` of format ``fmt`` decodes with: the run's, built by that format."""
    option = "format" if column == "value" else "key_format"
    if schemas is None:
        raise ConfigError(f"{option}: {fmt} decodes with the run's schemas (tidemark.spark.wire)")
    if schemas.format != fmt:
        raise ConfigError(f"{option}: {fmt} decodes with the run's {fmt} schemas, not {schemas.format} schemas")
    return schemas


def _decoding(
    df: DataFrame,
    deser: Deserialization,
    schemas: RunSchemas | None = None,
    key_schemas: RunSchemas | None = None,
    tombstones: bool = False,
) -> _Decoding:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    check_fields(deser)
    # A keyed table's tombstone is a change: it decodes as a record whose value columns are null. Its reason stays in
    # decode_reasons (never met), so a reason's index, the staged code, is the same for every feed of a format.
    tombstone = F.col("value").isNull() & F.lit(not tombstones)
    failed: list[Failure] = []  # one condition per decode_reasons(deser) entry, in its order
    work = df
    key_col: Column = F.col("key")
    if deser.key_format == "string":
        key_col = F.col("key").cast("string")
        failed.append(F.col("key").isNotNull() & ~F.is_valid_utf8(key_col))
    elif deser.key_format in REGISTRY_FORMATS:
        run_keys = _run_schemas(deser.key_format, key_schemas, "key")
        key = registry_format(deser.key_format).decoding(work, run_keys, "key", _PARSED_KEY)
        work, key_col = key.work, key.published
        failed += key.failures

    value_cols: list[Column]
    if deser.format == "bytes":
        value_cols = [F.col("value")]
    elif deser.format == "string":
        text = F.col("value").cast("string")
        failed.append(F.col("value").isNotNull() & ~F.is_valid_utf8(text))
        value_cols = [text.alias("value")]
    elif deser.format in REGISTRY_FORMATS:
        run_values = _run_schemas(deser.format, schemas, "value")
        value = registry_format(deser.format).decoding(work, run_values, "value", _PARSED)
        work = value.work
        failed.append(tombstone)
        failed += value.failures
        value_cols = [value.parsed.getField(name).alias(name) for name in run_values.field_names]
    else:
        text = F.col("value").cast("string")
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
        declared, required = declared_json(deser)
        # A new struct: add() would change declared itself, and its names are the value columns below.
        with_corrupt = StructType([*declared.fields, StructField(_CORRUPT, StringType())])
        work = work.withColumn(_PARSED, F.from_json(text, with_corrupt, options))
        parsed = F.col(_PARSED)
        if required:
            failed.append(tombstone)
        failed.append(~F.is_valid_utf8(text))
        failed.append(parsed.getField(_CORRUPT).isNotNull())
        failed += [F.col("value").isNotNull() & parsed.getField(name).isNull() for name in required]
        value_cols = [parsed.getField(name).alias(name) for name in declared.names]
    whys = decode_reasons(deser, schemas, key_schemas)
    reasons: list[Column] = []
    for c in failed:
        if isinstance(c, Reasons):  # its own reasons, in decode_reasons' order
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
    df: DataFrame,
    deser: Deserialization,
    schemas: RunSchemas | None = None,
    key_schemas: RunSchemas | None = None,
    *,
    tombstones: bool = False,
) -> DataFrame:
    """Every record of ``df`` decoded, in one projection: no row is dropped or split off.

    Columns: the metadata columns, ``key`` (decoded), the value column(s) (``value``, or
    the declared JSON fields), ``headers``, ``plan_id`` and :data:`ERROR_COLUMN`, null
    where the record decoded and the first reason where it did not. A row that failed
    keeps its raw bytes: a string ``key`` or ``value`` is Spark's byte-preserving cast of
    the binary, JSON and registry-format values (whose fields cannot hold them) get the raw
    value as :data:`RAW_VALUE_COLUMN` (see :func:`raw_value_kept`), and registry-format keys
    the raw key as :data:`RAW_KEY_COLUMN`. ``schemas`` and ``key_schemas``: the run's
    registry schemas of the value and the key, when their format needs them. ``tombstones``: a null value is a
    change (a keyed table's tombstone, :attr:`tidemark.config.models.Feed.tombstones_are_changes`), decoded as a
    record whose value columns are null, not a failure.
    """
    d = _decoding(df, deser, schemas, key_schemas, tombstones)
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
