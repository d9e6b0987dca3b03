"""Raw bytes, text and JSON values (declared fields) staged by the read tasks themselves, as flat Avro's are.

Spark's write of such a feed turns the data source's Arrow batches into rows, decodes the
value with its column functions (a cast, ``is_valid_utf8``, ``from_json``) and stages the
records with its Parquet writer (:mod:`tidemark.job.steps`). The read tasks do the same
on Arrow columns instead (:func:`tidemark.spark.arrow_avro.stage_task`, which writes the
files): the same folders, columns and types, every record staged as ``ok``. What
``ok`` means is the decoder's (:func:`tidemark.spark.decode.decode_reasons`), so a task
stages a record only where Spark's decoder would give the same values and no reason:

- ``bytes``: the value as Kafka holds it; nothing to decode.
- ``string``: the value checked to be UTF-8 by Arrow's cast (strict, as ``is_valid_utf8``).
- ``json`` with declared ``fields`` (not ``schema_ddl``): each value decoded as UTF-8, then
  parsed by :func:`json.loads` into an object. A declared field takes a value of its own
  JSON type only: a string, an integer (a whole number token within a long), a number (an
  integer or decimal token, as a double, correctly rounded by both parsers), a boolean, or
  null. The raw value is staged beside each record (:data:`tidemark.staged.RAW_VALUE_COLUMN`),
  as Avro's is, for the range statistics.

A record Spark's decoder reads otherwise, or might (a required field missing or null, a
null value where fields are required, a string field holding a number, an integer with a
fraction, a duplicate key, ``NaN`` or ``Infinity``, a number of more than
:data:`MAX_NUMBER_CHARS` characters, a key that is not UTF-8, the parser's corrupt-record
field named in the document), stops the task, which says why, and the job stages the
plan with Spark (a second read of Kafka), which decodes, quarantines and names every bad
record. Anything that is not one of these formats (JSON with ``schema_ddl``, the registry
formats other than flat Avro) is staged by Spark.

:class:`PlainPlan` is built on the driver from the columns Spark's write would stage, and
refuses any staged column it does not produce. The publishers never import this module;
pyarrow is imported inside the functions that use it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tidemark.spark.arrow_avro import CannotStage, _where, by_topic_day
from tidemark.spark.decode import _CORRUPT

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from tidemark.config.models import Deserialization

PlainFormat = Literal["bytes", "string", "json"]
MAX_NUMBER_CHARS = 300  # Jackson refuses numbers over 1,000 characters (StreamReadConstraints): far below that
MAX_VALUE_BYTES = 5 * 1024 * 1024  # Jackson refuses strings over 20M characters: far below that
# The columns a record of these formats is staged with, besides its value column(s): Kafka's, in the decoder's order.
KAFKA_COLUMNS = ("partition", "offset", "timestamp", "timestamp_type", "key")
SPARK_TYPES = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean"}


class _Refused(Exception):
    """A JSON document :func:`_document` does not vouch for."""


@dataclass(frozen=True)
class PlainPlan:
    """Everything a read task needs to stage records of a ``bytes``, ``string`` or ``json`` value: picklable."""

    file_schema: str  # the staged files' Spark schema (JSON): every staged column but the partition columns
    partition_columns: tuple[str, str, str]  # (outcome, topic, date) folder names, in that order
    ok: str
    key_text: bool  # the key is staged as UTF-8 text (else as bytes)
    value_format: PlainFormat
    fields: tuple[tuple[str, str], ...] = ()  # json: the declared (name, type)s, in the staged order
    required: frozenset[str] = frozenset()  # json: the declared fields a record must hold
    raw_value: str | None = None  # json: the column holding each record's raw value
    plain: tuple[str, ...] = ()  # columns written without dictionary and statistics (payloads)
    tombstones: bool = False  # a null value is a change (a keyed table's)

    @classmethod
    def of(
        cls,
        deser: Deserialization,
        staged: StructType,
        *,
        partition_columns: tuple[str, str, str],
        ok: str,
        raw_value: str,
        tombstones: bool = False,
    ) -> PlainPlan | str:
        """The plan for staging ``staged``'s columns (the Spark write's) of a ``deser`` feed; else why not."""
        from pyspark.sql.types import StructType

        if deser.format not in ("bytes", "string", "json") or deser.key_format not in ("string", "bytes"):
            return f"the read tasks do not decode {deser.format} values with {deser.key_format} keys"
        if deser.format == "json" and deser.schema_ddl is not None:
            return "the JSON value's schema is Spark DDL (schema_ddl), which only Spark's from_json reads"
        folders = set(partition_columns)
        file_schema = StructType([f for f in staged.fields if f.name not in folders])
        fields = tuple((f.name, f.type) for f in deser.fields)
        values = [(n, SPARK_TYPES[t]) for n, t in fields] if deser.format == "json" \
            else [("value", "binary" if deser.format == "bytes" else "string")]  # fmt: skip
        expected = [*KAFKA_COLUMNS, *(n for n, _ in values), *([raw_value] if deser.format == "json" else []),
                    "headers"]  # fmt: skip
        if file_schema.fieldNames() != expected:
            return f"the staged columns {file_schema.fieldNames()} are not the ones the read tasks write ({expected})"
        by_name = {f.name: f.dataType.typeName() for f in file_schema.fields}
        wrong = [n for n, t in values if by_name[n] != t]
        if wrong or by_name["key"] != ("string" if deser.key_format == "string" else "binary"):
            return f"the staged columns {wrong or ['key']} have types the read tasks do not write"
        return cls(
            file_schema.json(), partition_columns, ok, deser.key_format == "string", deser.format,  # type: ignore[arg-type]
            fields if deser.format == "json" else (), frozenset(f.name for f in deser.fields if f.required),
            raw_value if deser.format == "json" else None, (raw_value,) if deser.format == "json" else ("value",),
            tombstones,
        )  # fmt: skip

    def tables(self, batch: pa.RecordBatch, schema: pa.Schema) -> Iterator[tuple[tuple[str, int], pa.Table]]:
        yield from by_topic_day(laid_out(batch, self, schema), batch.column("topic"))


def laid_out(batch: pa.RecordBatch, plan: PlainPlan, schema: pa.Schema) -> pa.Table:
    """``batch``'s records as staged columns (``schema``), decoded as Spark's decoder would give them, all ``ok``.

    Raises :class:`CannotStage` for the first record it does not vouch for.
    """
    import pyarrow as pa

    where = _where(batch)
    if batch.column("timestamp").null_count:
        raise CannotStage(f"{where}: a record without a timestamp")
    columns: dict[str, Any] = {c: batch.column(c) for c in (*KAFKA_COLUMNS, "headers")}
    if plan.key_text:
        columns["key"] = _text(columns["key"], f"{where}: a key that is not UTF-8 text")
    value = batch.column("value")
    if plan.value_format == "bytes":
        columns["value"] = value
    elif plan.value_format == "string":
        columns["value"] = _text(value, f"{where}: a value that is not UTF-8 text")
    else:
        columns.update(json_columns(value, plan, where))
        columns[str(plan.raw_value)] = value
    arrays = []
    for target in schema:
        column = columns[target.name]
        arrays.append(column if column.type == target.type else column.cast(target.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _text(column: pa.Array, why: str) -> pa.Array:
    """``column`` (binary) as UTF-8 text; Arrow's cast refuses what is not UTF-8, as ``is_valid_utf8`` does."""
    import pyarrow as pa

    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise CannotStage(why) from exc


def json_columns(values: pa.Array, plan: PlainPlan, where: str) -> dict[str, pa.Array]:
    """The declared fields of ``values`` (JSON objects), one column each, as ``from_json`` reads them."""
    import pyarrow as pa

    tombstone_ok = not plan.required or plan.tombstones  # else a null value is a bad record (decode_reasons)
    out: dict[str, list[Any]] = {name: [] for name, _ in plan.fields}
    # Each field's usual type is taken as is, without a call; anything else goes through _field, which decides.
    usual: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}
    specs = [(name, kind, out[name], name in plan.required, usual[kind]) for name, kind in plan.fields]
    for i, value in enumerate(values.to_pylist()):
        if value is None:
            if not tombstone_ok:
                raise CannotStage(f"{where}: a record without a value (a tombstone), and the feed requires fields")
            for column in out.values():
                column.append(None)
            continue
        doc = _document(value, where, i)
        for name, kind, column, required, type_ in specs:
            v: Any = doc.get(name)
            usual_type = type(v) is type_  # a bool, so that mypy does not narrow v to object
            if usual_type and (type_ is not int or -(2**63) <= v < 2**63):
                column.append(v)
            else:
                column.append(_field(v, kind, required, f"{where} ({i + 1}. record): field '{name}'"))
    arrow = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
    result = {}
    for name, kind in plan.fields:
        try:
            result[name] = pa.array(out[name], arrow[kind])
        except (pa.ArrowInvalid, OverflowError, UnicodeEncodeError) as exc:  # a lone surrogate: Spark's would differ
            raise CannotStage(f"{where}: field '{name}' holds a value Arrow does not take as {kind}: {exc}") from exc
    return result


def _field(value: Any, kind: str, required: bool, where: str) -> Any:
    """A declared field's ``value`` as parsed, when ``from_json`` gives it as is for ``kind``; else refused."""
    if value is None:
        if required:
            raise CannotStage(f"{where} is required and missing or null")
        return None
    if kind == "string":
        ok = type(value) is str  # from_json writes any other scalar as its JSON text: left to Spark
    elif kind == "integer":
        ok = type(value) is int and -(2**63) <= value < 2**63
    elif kind == "number":
        ok = type(value) in (int, float)
        if ok and type(value) is int:
            try:
                value = float(value)  # correctly rounded, as Jackson's getDoubleValue
            except OverflowError:
                ok = False
    else:
        ok = type(value) is bool
    if not ok:
        raise CannotStage(f"{where} holds {json.dumps(value)[:80]}, not a JSON {kind} Spark's from_json reads as is")
    return value


def _document(value: bytes, where: str, i: int) -> dict[str, Any]:
    """``value`` parsed as one JSON object, when every JSON parser reads it alike; else refused."""
    try:
        if len(value) > MAX_VALUE_BYTES:
            raise _Refused(f"over {MAX_VALUE_BYTES} bytes")
        doc = _DECODER.decode(value.decode("utf-8"))
    except (_Refused, ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CannotStage(f"{where} ({i + 1}. record): a value that is not plain JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise CannotStage(f"{where} ({i + 1}. record): a JSON value that is not an object")
    if doc.get(_CORRUPT) is not None:  # from_json reads this name into its corrupt-record column: a bad record
        raise CannotStage(f"{where} ({i + 1}. record): a JSON object naming the field {_CORRUPT}")
    return doc


def _object(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):  # which of two values a parser keeps is its own choice
        raise _Refused("a key given twice")
    return doc


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(f"a number of {len(text)} characters")
    number = float(text)
    if not math.isfinite(number):  # beyond a double: Jackson's reading of it is its own
        raise _Refused(f"the number {text[:40]} overflows a double")
    return number


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(f"a number of {len(text)} characters")
    return int(text)


def _constant(text: str) -> Any:
    raise _Refused(f"{text}, which JSON does not have")


# Built once: json.loads with hooks builds a decoder per call (measured: a third of the time of a 170-byte record).
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_float=_float, parse_int=_int, parse_constant=_constant)
