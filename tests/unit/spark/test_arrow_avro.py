"""The read tasks' Avro decoding (tidemark.spark.arrow_avro), on values encoded by fastavro: no Kafka, no Spark.

What matters most: a record counts as decoded only when its decoded fields encode to
exactly its body's length, so a value with a byte too many or too few (which would shift
every later record of its block) makes the task give way instead of staging wrong rows.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest

from tidemark.spark.arrow_avro import CannotStage, Kind, StagePlan, WriterPlan, _container, _decode, _laid_out

WRITER = {
    "type": "record", "name": "Row", "namespace": "t",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "flag", "type": "boolean"},
        {"name": "ratio", "type": "float"},
        {"name": "price", "type": "double"},
        {"name": "name", "type": "string", "default": "none"},
        {"name": "blob", "type": "bytes"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "qty", "type": ["int", "null"]},
    ],
}  # fmt: skip
# The reader: id promoted to long, ratio to double, a symbol added, qty promoted, two fields added with defaults.
READER = {**WRITER, "fields": [
    {"name": "id", "type": "long"}, *WRITER["fields"][1:3], {"name": "ratio", "type": "double"},
    *WRITER["fields"][4:7],
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    *WRITER["fields"][8:12], {"name": "qty", "type": ["long", "null"]},
    {"name": "channel", "type": "string", "default": "web"},
    {"name": "level", "type": ["null", "int"], "default": None},
]}  # fmt: skip


def row(i: int) -> dict[str, Any]:
    return {
        "id": (-1) ** i * i * 977, "big": (-1) ** i * 2 ** (i % 63), "flag": i % 2 == 0, "ratio": i / 7,
        "price": i * 1.25, "name": "ü" * (i % 70), "blob": bytes(range(i % 200)), "status": ["NEW", "PAID"][i % 2],
        "day": dt.date(1969, 12, 1) + dt.timedelta(days=i), "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        + dt.timedelta(milliseconds=i * 1_000_003), "at_us": dt.datetime(1960, 1, 1, tzinfo=dt.UTC)
        + dt.timedelta(microseconds=i * 7_919), "note": None if i % 3 else f"n{i}", "qty": None if i % 5 == 0 else i,
    }  # fmt: skip


def encoded(schema: dict[str, Any], docs: list[dict[str, Any]]) -> list[bytes]:
    import fastavro

    parsed = fastavro.parse_schema(schema)
    out = []
    for doc in docs:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, doc)
        out.append(b"\x00\x00\x00\x00\x07" + buf.getvalue())
    return out


def writer_plan(schema: dict[str, Any] = WRITER) -> WriterPlan:
    fields = tuple((f["name"], Kind.of(f["type"])) for f in schema["fields"])
    assert all(k is not None for _, k in fields)
    return WriterPlan(7, b"\x00\x00\x00\x00\x07", _container(schema), fields)  # type: ignore[arg-type]


def test_decoded_records_equal_fastavros_and_their_encodings_are_their_lengths() -> None:
    import fastavro
    import pyarrow as pa

    docs = [row(i) for i in range(300)]
    decoded = _decode(pa.array(encoded(WRITER, docs), pa.binary()), writer_plan(), "t[0] offsets 0..299")
    parsed = fastavro.parse_schema(WRITER)
    for got, value in zip(decoded.to_pylist(), encoded(WRITER, docs), strict=True):
        want = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed)
        assert {k: got[k] for k in ("id", "big", "flag", "name", "blob", "status", "day", "note", "qty")} == {
            k: want[k] for k in ("id", "big", "flag", "name", "blob", "status", "day", "note", "qty")
        }
        assert got["ratio"] == pytest.approx(want["ratio"], rel=1e-6) and got["price"] == want["price"]
        assert got["at"] == want["at"] and got["at_us"] == want["at_us"]


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (lambda v, w: (v + b"\x00", w), "a trailing byte"),
        (lambda v, w: (v[:-1], w), "a missing byte"),
    ],
)
def test_a_value_a_byte_too_long_or_short_makes_the_task_give_way(change: Any, what: str) -> None:
    import pyarrow as pa

    values = encoded(WRITER, [row(i) for i in range(40)])
    values[17], values[18] = change(values[17], values[18])  # the next records would be read shifted by a byte
    with pytest.raises(CannotStage, match=r"t\[0\] offsets 0\.\.39"):
        _decode(pa.array(values, pa.binary()), writer_plan(), "t[0] offsets 0..39")


def test_a_byte_moved_between_two_values_is_caught_though_the_block_decodes() -> None:
    """The block as long as before, and every record decodes: only the lengths tell the second one is wrong."""
    import pyarrow as pa

    pair = {"type": "record", "name": "P", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "long"}]}
    first, second = encoded(pair, [{"a": 1, "b": 2}, {"a": 3, "b": 4}])
    moved = [first + b"\x0a", second[:5] + second[6:]]  # the second value's first byte (3) now reads as 5
    plan = writer_plan(pair)
    assert _decode(pa.array([first, second], pa.binary()), plan, "t").to_pylist()[1] == {"a": 3, "b": 4}
    with pytest.raises(CannotStage, match=r"\(1\. of 2\) is 3 bytes long, its decoded fields encode to 2"):
        _decode(pa.array(moved, pa.binary()), plan, "t[0] offsets 0..1")


def test_a_body_that_does_not_decode_makes_the_task_give_way() -> None:
    import pyarrow as pa

    values = [*encoded(WRITER, [row(1)]), b"\x00\x00\x00\x00\x07\xff\xff\xff\xff"]
    with pytest.raises(CannotStage, match="schema id 7"):
        _decode(pa.array(values, pa.binary()), writer_plan(), "t[0] offsets 0..1")


def test_kinds_and_what_they_resolve_from() -> None:
    assert Kind.of(["null", "string"]) == Kind("string", nullable=True)
    assert Kind.of({"type": "long", "logicalType": "timestamp-micros"}) == Kind("timestamp-micros")
    spark_only = [
        {"type": "map", "values": "int"}, {"type": "array", "items": "int"}, ["null", "int", "string"],
        {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}, "t.Status",
        {"type": "record", "name": "R", "fields": []}, {"type": "fixed", "name": "F", "size": 2},
    ]  # fmt: skip
    for other in spark_only:
        assert Kind.of(other) is None, other
    long_, int_ = Kind("long"), Kind("int")
    assert long_.reads(int_) and not int_.reads(long_)  # promoted, never narrowed
    assert Kind("long", nullable=True).reads(int_) and not long_.reads(Kind("long", nullable=True))
    assert Kind("enum", symbols=("A", "B")).reads(Kind("enum", symbols=("A",)))
    assert not Kind("enum", symbols=("A",)).reads(Kind("enum", symbols=("A", "B")))  # Avro would need a default


def _staged_struct(reader: dict[str, Any]) -> Any:
    from pyspark.sql import types as T

    spark_type = {"long": T.LongType(), "boolean": T.BooleanType(), "double": T.DoubleType(), "string": T.StringType(),
                  "float": T.FloatType(),
                  "bytes": T.BinaryType(), "enum": T.StringType(), "date": T.DateType(), "int": T.IntegerType(),
                  "timestamp-millis": T.TimestampType(), "timestamp-micros": T.TimestampType()}  # fmt: skip
    kinds = [Kind.of(f["type"]) for f in reader["fields"]]
    fields = [T.StructField(f["name"], spark_type[k.name] if k else T.StringType())  # a type Spark alone decodes
              for f, k in zip(reader["fields"], kinds, strict=True)]  # fmt: skip
    return T.StructType([
        T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()), T.StructField("timestamp_type", T.IntegerType()),
        T.StructField("key", T.StringType()), *fields, T.StructField("headers", T.ArrayType(
            T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))),
        T.StructField("_raw_value", T.BinaryType()), T.StructField("topic", T.StringType()),
        T.StructField("date", T.DateType()), T.StructField("_outcome", T.StringType()),
    ])  # fmt: skip


def _schemas(reader: dict[str, Any], writers: dict[int, dict[str, Any]]) -> Any:
    from tidemark.spark.avro import AvroSchemas

    return AvroSchemas(
        "avro", "t-value", 1, 7, tuple(writers), reader=json.dumps(reader),
        writers={k: json.dumps(v) for k, v in writers.items()},
    )  # fmt: skip


def _plan(reader: dict[str, Any], writers: dict[int, dict[str, Any]]) -> StagePlan | str:
    return StagePlan.of(
        _schemas(reader, writers), _staged_struct(reader), partition_columns=("_outcome", "topic", "date"), ok="ok",
        raw_value="_raw_value", head=None, plain=("_raw_value",),
    )  # fmt: skip


def test_records_are_resolved_to_the_reader_with_promotions_and_defaults() -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    plan = _plan(READER, {7: WRITER})
    assert isinstance(plan, StagePlan), plan
    docs = [row(i) for i in range(50)]
    values = pa.array(encoded(WRITER, docs), pa.binary())
    batch = pa.record_batch({
        "topic": pa.array(["t"] * 50), "partition": pa.array([0] * 50, pa.int32()),
        "offset": pa.array(range(50), pa.int64()), "timestamp": pa.array([0] * 50, pa.timestamp("us", "UTC")),
        "timestamp_type": pa.array([0] * 50, pa.int32()), "key": pa.array([b"k"] * 50, pa.binary()),
        "value": values, "headers": pa.nulls(50, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    })  # fmt: skip
    schema = to_arrow_schema(StructType.fromJson(json.loads(plan.file_schema)), timezone="UTC")
    heads = pc.binary_slice(values, 0, 5)
    table = _laid_out(batch, heads, _decode(values, plan.writers[0], "t"), dict(plan.readers)[7], plan, schema)
    got = table.to_pylist()
    assert [r["id"] for r in got] == [d["id"] for d in docs] and table.schema.field("id").type == pa.int64()
    assert table.schema.field("ratio").type == pa.float64()
    assert {r["channel"] for r in got} == {"web"} and {r["level"] for r in got} == {None}
    assert [r["qty"] for r in got] == [d["qty"] for d in docs]
    assert [r["status"] for r in got] == [d["status"] for d in docs]
    assert [r["_raw_value"] for r in got] == values.to_pylist() and [r["key"] for r in got] == ["k"] * 50


@pytest.mark.parametrize(
    ("reader", "writer", "reason"),
    [
        ({**WRITER, "fields": [{"name": "id", "type": "int"}]}, {**WRITER, "fields": [{"name": "id", "type": "long"}]},
         "resolves in a way"),  # narrowed: Avro itself refuses it, and this path leaves it to Spark
        ({**WRITER, "fields": [{"name": "tags", "type": {"type": "map", "values": "int"}}]}, WRITER,
         "reader field 'tags'"),
        ({**WRITER, "fields": [{"name": "id", "type": "int"}, {"name": "x", "type": "int"}]}, WRITER,
         "lacks reader field 'x'"),
    ],
)  # fmt: skip
def test_what_it_does_not_decode_is_left_to_spark_with_a_reason(
    reader: dict[str, Any], writer: dict[str, Any], reason: str
) -> None:
    got = _plan(reader, {7: writer})
    assert isinstance(got, str) and reason in got


def _batch(values: list[bytes], first_offset: int, days: list[int]) -> Any:
    import pyarrow as pa

    n = len(values)
    micros = [d * 86_400_000_000 + 1_000 for d in days]
    return pa.record_batch({
        "topic": pa.array(["t"] * n), "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        "timestamp": pa.array(micros, pa.timestamp("us", "UTC")), "timestamp_type": pa.array([0] * n, pa.int32()),
        "key": pa.array([b"k"] * n, pa.binary()), "value": pa.array(values, pa.binary()),
        "headers": pa.nulls(n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    })  # fmt: skip


@pytest.mark.parametrize(("buffered", "row_groups"), [(1, 2), (10**9, 1)])
def test_a_task_stages_a_file_per_day_in_row_groups_its_memory_bounds(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, buffered: int, row_groups: int
) -> None:
    """stage_task over batches spanning three days (the reader replaced by the batches: pure logic)."""
    import pyarrow.parquet as pq

    from tidemark.spark import arrow_avro, source
    from tidemark.spark.source import Range, ReadTask

    plan = _plan(READER, {7: WRITER})
    assert isinstance(plan, StagePlan)
    values = encoded(WRITER, [row(i) for i in range(600)])
    batches = [_batch(values[n : n + 100], n, [20_000 + (n // 100) % 3] * 100) for n in range(0, 600, 100)]
    monkeypatch.setattr(source, "read_task", lambda task, config: iter(batches))
    monkeypatch.setattr(arrow_avro, "ROW_GROUP_BYTES", buffered)  # what a task may buffer, all its files together
    task = ReadTask(3, 1, "p", "g", "read_committed", (Range("t", 0, 0, 600),))

    files, read = arrow_avro.stage_task(3, task, {}, plan, str(tmp_path))

    assert read == {("t", 0): 600}  # what the reader produced, for the driver's comparison with what was staged
    assert [name for name, _ in files] == [
        f"_outcome=ok/topic=t/date={day}/part-00003-00{n}.parquet"
        for n, day in enumerate(("2024-10-04", "2024-10-05", "2024-10-06"))
    ]
    assert [rows for _, rows in files] == [200, 200, 200]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [n for n, _ in files]
    meta = pq.read_metadata(tmp_path / files[0][0])
    assert meta.num_row_groups == row_groups  # each batch flushed at once, or both in one group at the end
    assert meta.metadata[b"org.apache.spark.sql.parquet.row.metadata"] == plan.file_schema.encode()
    assert b"ARROW:schema" not in meta.metadata
    table = pq.read_table(tmp_path / files[0][0])
    assert table.column("offset").to_pylist() == [*range(0, 100), *range(300, 400)]


def test_an_executor_without_polars_gives_way_to_spark(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from tidemark.spark import arrow_avro, source
    from tidemark.spark.source import Range, ReadTask

    plan = _plan(READER, {7: WRITER})
    assert isinstance(plan, StagePlan)
    batch = _batch(encoded(WRITER, [row(i) for i in range(10)]), 0, [20_000] * 10)
    monkeypatch.setattr(source, "read_task", lambda task, config: iter([batch]))
    monkeypatch.setitem(sys.modules, "polars", None)  # what `import polars` meets where it is not installed
    task = ReadTask(0, 1, "p", "g", "read_committed", (Range("t", 0, 0, 10),))

    got = list(arrow_avro._run([(0, task)], {}, plan, str(tmp_path)))

    assert got == [("gave_way", "an executor cannot import polars")]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_large_binary_values_decode_alike() -> None:
    import pyarrow as pa

    values = encoded(WRITER, [row(i) for i in range(30)])
    small = _decode(pa.array(values, pa.binary()), writer_plan(), "t")
    large = _decode(pa.array(values, pa.large_binary()).slice(3), writer_plan(), "t")  # offsets 64-bit, not at 0
    assert large.to_pylist() == small.to_pylist()[3:]


def test_bytes_read_as_a_string_keep_bytes_that_are_not_utf8_as_spark_does(tmp_path: Any) -> None:
    """A writer's bytes resolved to a reader's string: Spark's decoder keeps the bytes as they are, UTF-8 or not."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    writer = {"type": "record", "name": "B", "fields": [{"name": "id", "type": "int"}, {"name": "b", "type": "bytes"}]}
    reader = {**writer, "fields": [{"name": "id", "type": "int"}, {"name": "b", "type": "string"}]}
    plan = _plan(reader, {7: writer})
    assert isinstance(plan, StagePlan), plan
    schema = to_arrow_schema(StructType.fromJson(json.loads(plan.file_schema)), timezone="UTC")
    payloads = [b"ok", b"\xff\xfe"]
    values = pa.array(encoded(writer, [{"id": n, "b": p} for n, p in enumerate(payloads)]), pa.binary())
    batch = _batch(values.to_pylist(), 0, [20_000] * 2)
    decoded = _decode(values, plan.writers[0], "t")
    table = _laid_out(batch, pc.binary_slice(values, 0, 5), decoded, dict(plan.readers)[7], plan, schema)
    pq.write_table(table, tmp_path / "b.parquet")
    column = pq.read_table(tmp_path / "b.parquet", columns=["b"]).column("b")
    assert column.type == pa.string() and column.cast(pa.binary()).to_pylist() == payloads
