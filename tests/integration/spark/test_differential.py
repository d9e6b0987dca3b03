"""Differential, property-based: Tidemark's Avro decoding on both staging paths against fastavro, the reference.

Hypothesis generates a writer schema (flat fields of every kind the read tasks decode, and
decimals, nested records, arrays and maps only Spark's path decodes), often a reader that
evolves it (promotions, an added field with a default), and records with edge values (NaN,
±inf, the extremes of every integer and temporal type, empty and long strings). fastavro
encodes them in the Schema Registry wire format and decodes them again with the reader
schema, reading each body to its last byte; the values Spark's path
(:func:`tidemark.spark.avro.decoded_value`) and the read tasks
(:func:`tidemark.spark.arrow_avro._staged_tables`, when the schemas are theirs) give for the
same bytes must equal fastavro's. Every example also corrupts bodies (a byte left over, a
byte missing), which both paths must refuse as fastavro does, and writes a record's booleans
(at any depth) as a byte other than 0 or 1, which fastavro reads as true but the spec
allows no more than the others: both paths must refuse it, Spark's naming the field. No Kafka: the functions both
staging paths call. An example draws up to :data:`CASES` such schemas, decoded on Spark's
path in one Spark job (each compared alone with fastavro): a job per schema was nearly all
of the time.

``make test`` runs a bounded number of examples (:data:`EXAMPLES`, 25; 75 to 125 schemas);
``TIDEMARK_DIFFERENTIAL_EXAMPLES`` sets more (``make test-differential``). The counts of
schemas, records and corrupted bodies checked are printed at the end of the module.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.differential import (
    avro_with_boolean_bytes,
    avro_within_spec,
    comparable,
    report_counts,
)
from tests.unit.spark.test_arrow_avro import _batch, _plan
from tidemark.spark.arrow_avro import CannotStage, StagePlan, _staged_tables, staged_arrow_schema
from tidemark.spark.avro import (
    VALUE_FIELD,
    AvroSchemas,
    bad_boolean,
    boolean_fields,
    bytes_left_over,
    decode_failed,
    decoded_value,
)
from tidemark.spark.wire import header

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("TIDEMARK_DIFFERENTIAL_EXAMPLES", "25"))
CASES = 8  # the most schemas an example draws, all decoded in one Spark job
COUNTS: Counter[str] = Counter()
WRITER_ID, READER_ID = 7, 8

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
FIRST, LAST = dt.datetime(1, 1, 1, tzinfo=dt.UTC), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
MILLIS = ((FIRST - EPOCH) // dt.timedelta(milliseconds=1), (LAST - EPOCH) // dt.timedelta(milliseconds=1))
MICROS = ((FIRST - EPOCH) // dt.timedelta(microseconds=1), (LAST - EPOCH) // dt.timedelta(microseconds=1))
DAYS = ((dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days, (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days)

# The kinds the read tasks decode (flat) and those only Spark's path does; each a schema and its values.
FLAT = ["boolean", "int", "long", "float", "double", "string", "bytes", "enum", "date", "ts-millis", "ts-micros"]
SPARK_ONLY = ["decimal", "record", "array", "map", "flags"]


def _edges(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([low, high, 0, -1, 1]), st.integers(low, high))


def _kind(kind: str, n: int) -> tuple[Any, st.SearchStrategy[Any]]:
    """The Avro type of a field of ``kind`` (named types numbered ``n``) and a strategy of its values."""
    text = st.one_of(st.text(max_size=30), st.just(""), st.just("é€😀" * 3000))
    simple: dict[str, tuple[Any, st.SearchStrategy[Any]]] = {
        "boolean": ("boolean", st.booleans()),
        "int": ("int", _edges(-(2**31), 2**31 - 1)),
        "long": ("long", _edges(-(2**63), 2**63 - 1)),
        "float": ("float", st.floats(width=32)),
        "double": ("double", st.floats()),
        "string": ("string", text),
        "bytes": ("bytes", st.binary(max_size=40)),
        "enum": ({"type": "enum", "name": f"E{n}", "symbols": ["A", "B", "C"]}, st.sampled_from(["A", "B", "C"])),
        "date": ({"type": "int", "logicalType": "date"}, _edges(*DAYS).map(lambda d: dt.date(1970, 1, 1)
                                                                            + dt.timedelta(days=d))),
        "ts-millis": ({"type": "long", "logicalType": "timestamp-millis"}, _edges(*MILLIS)),
        "ts-micros": ({"type": "long", "logicalType": "timestamp-micros"}, _edges(*MICROS)),
        "decimal": ({"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
                    _edges(-(10**12) + 1, 10**12 - 1).map(lambda i: Decimal(i).scaleb(-3))),
    }  # fmt: skip
    if kind in simple:
        return simple[kind]
    inner, values = _kind("long", n)
    name, text_values = _kind("string", n)
    if kind == "record":  # booleans at depth too: an array of them, a nullable one
        schema = {
            "type": "record",
            "name": f"R{n}",
            "fields": [{"name": "a", "type": inner}, {"name": "b", "type": ["null", name]},
                       {"name": "c", "type": {"type": "array", "items": "boolean"}},
                       {"name": "d", "type": ["null", "boolean"]}],
        }  # fmt: skip
        return schema, st.fixed_dictionaries({"a": values, "b": st.none() | text_values,
                                              "c": st.lists(st.booleans(), max_size=3),
                                              "d": st.none() | st.booleans()})  # fmt: skip
    if kind == "array":
        return {"type": "array", "items": "double"}, st.lists(st.floats(), max_size=5)
    if kind == "flags":
        flags = st.dictionaries(st.text(max_size=5), st.none() | st.booleans(), max_size=4)
        return {"type": "map", "values": ["null", "boolean"]}, flags
    return {"type": "map", "values": inner}, st.dictionaries(st.text(max_size=5), values, max_size=4)  # fmt: skip


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """A writer schema, a reader schema (the writer's, or an evolution of it) and records of the writer."""
    kinds = draw(st.lists(st.sampled_from(FLAT + (SPARK_ONLY if draw(st.booleans()) else [])), min_size=1,
                          max_size=6))  # fmt: skip
    fields, reader_fields, values = [], [], {}
    for n, kind in enumerate(kinds):
        avro, strategy = _kind(kind, n)
        nullable = draw(st.booleans())
        field = {"name": f"f{n}", "type": ["null", avro] if nullable else avro}
        fields.append(field)
        values[field["name"]] = (st.none() | strategy) if nullable else strategy
        promoted = {"int": "long", "float": "double", "long": "double"}.get(avro) if isinstance(avro, str) else None
        if promoted and draw(st.booleans()):  # Avro's promotions
            reader_fields.append({**field, "type": ["null", promoted] if nullable else promoted})
        else:
            reader_fields.append(field)
    if draw(st.booleans()):  # a field the writer lacks, with its default
        reader_fields.append({"name": "added", "type": "long", "default": 7})
    writer = {"type": "record", "name": "Row", "namespace": "diff", "fields": fields}
    reader = {**writer, "fields": reader_fields}
    records = draw(st.lists(st.fixed_dictionaries(values), min_size=1, max_size=20))
    return writer, reader, records


def _encoded(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return header(WRITER_ID) + out.getvalue()


def _reference(writer: dict[str, Any], reader: dict[str, Any], value: bytes) -> Any:
    """fastavro's record for ``value``'s body resolved to ``reader``, or None when its fields do not read the body
    to its last byte or it holds a boolean byte other than 0 or 1 (the spec's rule; fastavro reads any byte but 0 as
    true)."""
    import fastavro

    body = io.BytesIO(value[5:])
    try:
        doc = fastavro.schemaless_reader(body, fastavro.parse_schema(writer), fastavro.parse_schema(reader))
    except Exception:  # noqa: BLE001 - any failure of the reference decoder is a body that does not decode
        return None
    if body.tell() != len(value) - 5 or not avro_within_spec(writer, value[5:]):
        return None
    return doc


def _comparable(reader: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for f in reader["fields"]:
        v = doc[f["name"]]
        out[f["name"]] = sorted(v.items()) if isinstance(v, dict) and "map" in json.dumps(f["type"]) else v
    return comparable(out)


def _schemas(writer: dict[str, Any], reader: dict[str, Any]) -> AvroSchemas:
    return AvroSchemas(
        "avro", "diff-value", 1, READER_ID, (WRITER_ID,), reader=json.dumps(reader),
        writers={WRITER_ID: json.dumps(writer)},
    )  # fmt: skip


def _spark_path(
    spark: Any, batch: list[tuple[AvroSchemas, list[bytes]]]
) -> list[list[tuple[bool, bool, str | None, Any]]]:
    """Per case of ``batch`` and per value: whether Spark's path fails it, whether it has bytes left over, the field
    whose boolean byte is other than 0 or 1 (or None), and the decoded record.

    The cases are decoded in one Spark job, a column per case holding only its own rows' results (a CASE WHEN on the
    row's case: the other cases' decoders never see them): a job per schema cost ~0.4 s, nearly all of an example's
    time, where the decoding itself takes milliseconds."""
    from pyspark.sql import functions as F

    rows = [(c, i, v) for c, (_, values) in enumerate(batch) for i, v in enumerate(values)]
    df = spark.createDataFrame(rows, "c int, i int, value binary")
    columns = []
    for c, (schemas, _) in enumerate(batch):
        decoded, mine = decoded_value(schemas), F.col("c") == c
        columns += [
            F.when(mine, decode_failed(decoded, schemas)).alias(f"failed{c}"),
            F.when(mine, bytes_left_over(decoded)).alias(f"left{c}"),
            F.when(mine, bad_boolean(schemas, decoded=decoded.getField(VALUE_FIELD))).alias(f"bool{c}"),
            F.when(mine, decoded.getField(VALUE_FIELD)).alias(f"v{c}"),
        ]
    table = df.select("c", "i", *columns).toArrow()  # sorted here: orderBy would add a shuffle
    out: list[list[tuple[bool, bool, str | None, Any]]] = [[] for _ in batch]
    for r in sorted(table.to_pylist(), key=lambda r: (r["c"], r["i"])):
        c = r["c"]
        out[c].append((r[f"failed{c}"], r[f"left{c}"], r[f"bool{c}"], r[f"v{c}"]))
    return out


def _read_task_path(reader: dict[str, Any], writer: dict[str, Any], values: list[bytes]) -> list[dict[str, Any]] | str:
    """The read tasks' staged rows for ``values``, or why they do not stage them (their plan's reason, or the give
    way's)."""
    plan = _plan(reader, {WRITER_ID: writer})
    if not isinstance(plan, StagePlan):
        return f"not theirs: {plan}"
    schema = staged_arrow_schema(plan)
    try:
        tables = list(_staged_tables(_batch(values, 0, [20_000] * len(values)), plan, schema))
    except CannotStage as exc:
        return f"gave way: {exc}"
    return [row for _, table in tables for row in table.to_pylist()]


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report_counts(request, "Avro", EXAMPLES, COUNTS)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                 HealthCheck.function_scoped_fixture])  # fmt: skip
@given(batch=st.lists(cases(), min_size=1, max_size=CASES), data=st.data())
def test_both_paths_decode_every_value_as_fastavro_does_or_refuse_it(spark: Any, batch: Any, data: Any) -> None:
    prepared = []
    for writer, reader, records in batch:
        values = [_encoded(writer, r) for r in records]
        expected = [_reference(writer, reader, v) for v in values]
        assert None not in expected  # fastavro reads back what it wrote
        # Corrupted bodies: a byte left over, a byte missing; fastavro reads neither to its last byte.
        corrupted = [values[0] + b"\x00", values[0][:-1]] if len(values[0]) > 5 else [values[0] + b"\x00"]
        # And the first record with a boolean present (at any depth) written with every boolean as another byte.
        byte = data.draw(st.integers(2, 255), label="boolean byte")
        with_booleans = [r for r in records if avro_with_boolean_bytes(writer, r, 0) != avro_with_boolean_bytes(
            writer, r, 1)][:1]  # fmt: skip
        corrupted += [header(WRITER_ID) + avro_with_boolean_bytes(writer, r, byte) for r in with_booleans]
        assert [_reference(writer, reader, v) for v in corrupted] == [None] * len(corrupted)
        prepared.append((writer, reader, values, expected, corrupted, len(with_booleans)))
    decoded = _spark_path(spark, [(_schemas(w, r), v + bad) for w, r, v, _, bad, _ in prepared])

    for (writer, reader, values, expected, corrupted, booleans), spark_rows in zip(prepared, decoded, strict=True):
        COUNTS["schemas"] += 1
        COUNTS["evolved schemas"] += writer != reader
        assert len(spark_rows) == len(values) + len(corrupted)
        for (failed, left, flagged, got), want in zip(spark_rows, expected, strict=False):
            assert not failed and not left and flagged is None
            assert _comparable(reader, got) == _comparable(reader, want)
        assert all(failed or left or flagged for failed, left, flagged, _ in spark_rows[len(values) :])
        if booleans:  # read to its last byte, every boolean as one byte: refused for the boolean, naming its field
            failed, left, flagged, _ = spark_rows[-1]
            assert not failed and not left and flagged in boolean_fields(_schemas(writer, reader)), spark_rows[-1]
            COUNTS["boolean bytes other than 0 or 1 refused naming the field (Spark's path)"] += 1
        COUNTS["records (Spark's path)"] += len(values)
        COUNTS["corrupted bodies refused (Spark's path)"] += len(corrupted)

        staged = _read_task_path(reader, writer, values)
        if isinstance(staged, str):
            COUNTS["schemas not the read tasks' (" + staged.split(":")[0] + ")"] += 1
            continue
        assert [_comparable(reader, r) for r in staged] == [_comparable(reader, w) for w in expected]
        COUNTS["records (read tasks)"] += len(values)
        for n, bad in enumerate(corrupted):
            why = _read_task_path(reader, writer, [*values, bad])
            assert isinstance(why, str)
            COUNTS["corrupted bodies refused (read tasks)"] += 1
            if booleans and n == len(corrupted) - 1:
                assert "a boolean byte other than 0 or 1" in why, why
                COUNTS["boolean bytes other than 0 or 1 refused (read tasks)"] += 1


# A boolean byte other than 0 or 1 at every depth: (the writer's field, its value, the field the reason names). Both
# paths read such a byte as false (Java's reader and polars'), fastavro as true; the spec allows only 0 and 1, so the
# body is refused.
BOOLEANS = {
    "a boolean": ("boolean", True, "b"),
    "a nullable boolean": (["null", "boolean"], False, "b"),
    "in a nested record": ({"type": "record", "name": "In", "fields": [{"name": "flag", "type": "boolean"}]},
                           {"flag": True}, "b.flag"),
    "in an array": ({"type": "array", "items": "boolean"}, [True, False], "b[]"),
    "in a map, nullable": ({"type": "map", "values": ["null", "boolean"]}, {"k": None, "j": True}, "b{}"),
    "a union of several": (["null", "string", "boolean"], True, "b"),
    "in an array of records": ({"type": "array", "items": {"type": "record", "name": "Item", "fields": [
        {"name": "n", "type": "long"}, {"name": "ok", "type": ["null", "boolean"]}]}},
        [{"n": 1, "ok": None}, {"n": 2, "ok": True}], "b[].ok"),
}  # fmt: skip


@pytest.mark.parametrize("shape", list(BOOLEANS))
def test_a_boolean_byte_other_than_0_or_1_is_refused_on_both_paths_naming_the_field(spark: Any, shape: str) -> None:
    avro, value, named = BOOLEANS[shape]
    writer = {"type": "record", "name": "Row", "namespace": "diff",
              "fields": [{"name": "b", "type": avro}, {"name": "n", "type": "long"}]}  # fmt: skip
    good = _encoded(writer, {"b": value, "n": 5})
    bad = header(WRITER_ID) + avro_with_boolean_bytes(writer, {"b": value, "n": 5}, 2)  # every boolean: byte 2
    assert _reference(writer, writer, bad) is None  # the spec's verdict
    schemas = _schemas(writer, writer)

    assert boolean_fields(schemas) == [named]
    good_row, bad_row = _spark_path(spark, [(schemas, [good, bad])])[0]
    assert good_row[:3] == (False, False, None)
    published = good_row[3] if shape != "a union of several" else {**good_row[3], "b": good_row[3]["b"]["member1"]}
    assert _comparable(writer, published) == _comparable(writer, {"b": value, "n": 5})  # Spark: a struct of members
    assert bad_row[:3] == (False, False, named)
    staged = _read_task_path(writer, writer, [good, bad])
    assert isinstance(staged, str), staged
    assert staged.startswith("not theirs") or f"field '{named}'" in staged, staged
    if not staged.startswith("not theirs"):
        assert _comparable(writer, _read_task_path(writer, writer, [good])[0]) == {"b": value, "n": 5}  # type: ignore[index]


def test_a_boolean_byte_other_than_0_or_1_in_a_field_the_reader_drops_is_refused_too(spark: Any) -> None:
    """The byte is the writer's: a body the spec refuses is refused whether or not the reader keeps the field."""
    writer = {"type": "record", "name": "Row", "namespace": "diff",
              "fields": [{"name": "gone", "type": "boolean"}, {"name": "n", "type": "long"}]}  # fmt: skip
    reader = {**writer, "fields": writer["fields"][1:]}
    bad = header(WRITER_ID) + avro_with_boolean_bytes(writer, {"gone": True, "n": 5}, 255)
    assert _reference(writer, reader, bad) is None

    ((failed, left, flagged, _),) = _spark_path(spark, [(_schemas(writer, reader), [bad])])[0]
    assert (failed, left, flagged) == (False, False, "gone")
    staged = _read_task_path(reader, writer, [bad])
    assert isinstance(staged, str) and "field 'gone'" in staged, staged


def test_a_boolean_of_a_named_type_is_checked_wherever_the_type_is_used(spark: Any) -> None:
    """A record type holding a boolean, defined in one field and used by name in another (its namespace inherited):
    each use is its own path, and the fields holding no boolean (an enum, a string) are skipped over by the check."""
    inner = {
        "type": "record",
        "name": "In",
        "fields": [{"name": "n", "type": "long"}, {"name": "flag", "type": "boolean"}],
    }
    writer = {"type": "record", "name": "Row", "namespace": "diff", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}, {"name": "x", "type": inner},
        {"name": "s", "type": "string"}, {"name": "y", "type": ["null", "In"]}, {"name": "z", "type": ["null", "E"]},
    ]}  # fmt: skip
    record = {"e": "B", "x": {"n": 1, "flag": False}, "s": "t", "y": {"n": 2, "flag": True}, "z": "A"}
    good = _encoded(writer, record)
    assert good.endswith(b"\x02\x04\x01\x02\x00")  # y: its branch (2), n 2 (4), flag 1; z: its branch (2), A (0)
    bad = good[:-3] + b"\x07" + good[-2:]

    assert boolean_fields(_schemas(writer, writer)) == ["x.flag", "y.flag"]
    good_row, bad_row = _spark_path(spark, [(_schemas(writer, writer), [good, bad])])[0]
    assert good_row[:3] == (False, False, None) and _comparable(writer, good_row[3]) == _comparable(writer, record)
    assert bad_row[:3] == (False, False, "y.flag")
