"""The read tasks' decoding of raw, text and JSON values (tidemark.spark.arrow_plain) against Spark's decoder.

Differential, on the same bytes: every record the read tasks stage must be one Spark's
decoder (:func:`tidemark.spark.decode.annotate`: ``from_json``, ``is_valid_utf8``) decodes
with no reason and the very same values (floats to the bit); every record Spark's decoder
refuses, the read tasks must refuse too (they give way, and Spark stages the plan). The JSON
values are hand-picked edge cases and a few thousand generated documents (fixed seed): each
declared field present, null, absent or of another type, numbers in every textual form,
strings with escapes, surrogates and non-ASCII text, duplicate keys, ``NaN``, trailing text,
other top-level values, bytes that are not UTF-8. No Kafka.
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import pytest

from tidemark.config.models import Deserialization, JsonField
from tidemark.spark.arrow_avro import CannotStage, staged_arrow_schema
from tidemark.spark.arrow_plain import PlainPlan, laid_out
from tidemark.staged import ERROR_COLUMN, RAW_VALUE_COLUMN

pytestmark = pytest.mark.spark

FIELDS = (("s", "string", True), ("i", "integer", False), ("n", "number", False), ("b", "boolean", False))
EDGE_VALUES = [
    b'{"s": "plain", "i": 1, "n": 2.5, "b": true}',
    b'{"s": "", "i": -9223372036854775808, "n": -0.0, "b": false}',
    b'{"s": "x", "i": 9223372036854775807, "n": 1e308}',
    b'{"s": "x", "i": 9223372036854775808}',  # beyond a long: Spark refuses
    b'{"s": "x", "i": 1.0}',  # a fraction in an integer field
    b'{"s": "x", "i": 1e2}',
    b'{"s": "x", "n": 12345678901234567890123}',  # an integer token read as a double
    b'{"s": "x", "n": 1e400}',
    b'{"s": "x", "n": 4.9e-324, "i": -0}',
    b'{"s": "x", "n": NaN}',
    b'{"s": "x", "n": "NaN"}',
    b'{"s": 12}',
    b'{"s": true}',
    b'{"s": {"a": 1}}',
    b'{"s": null}',
    b'{"i": 1}',
    b'{"s": "x", "b": 1}',
    b'{"s": "x", "b": "true"}',
    b'{"s": "\\u00e9\\ud83d\\ude00\\n\\"\\/\\\\", "extra": [1, {"deep": [null]}]}',
    '{"s": "é😀 ünïcode"}'.encode(),
    b'{"s": "\\ud800"}',  # a lone surrogate
    b'{"s": "a", "s": "b"}',
    b'{"s": "x", "i": 1.5, "i": 2}',  # which of the two a parser keeps is its own
    b'{"s": "x"} trailing',
    b'  {"s": "x"}  \n',
    b"{'s': 'x'}",
    b'["s"]',
    b'"s"',
    b"",
    b"null",
    b'{"s": "\xff"}',
    b'{"s": "x", "_tidemark_corrupt": "y"}',
    b'{"s": "x", "S": 1, " s": 2}',
    b'{"s": "x", "n": 0.1, "i": 007}',
    b'{"s": "x", "n": 1.5E+3}',
    b'{"s": "x", "n": -1}',
    b'{"s": "\\x"}',
    b'{"s": "tab\there"}',
]


def _deser(fmt: str = "json", *, required: bool = True, key_format: str = "string") -> Deserialization:
    if fmt != "json":
        return Deserialization(format=fmt, key_format=key_format)  # type: ignore[arg-type]
    fields = tuple(JsonField(name=n, type=t, required=r and required) for n, t, r in FIELDS)  # type: ignore[arg-type]
    return Deserialization(format="json", fields=fields, key_format=key_format)  # type: ignore[arg-type]


def _batch(values: list[bytes | None], keys: list[bytes | None] | None = None) -> Any:
    import pyarrow as pa

    from tidemark.spark.source import arrow_schema

    n = len(values)
    return pa.record_batch({
        "topic": pa.array(["t"] * n), "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()), "timestamp": pa.array([1_000] * n, pa.timestamp("us", "UTC")),
        "timestamp_type": pa.array([0] * n, pa.int32()),
        "key": pa.array(keys if keys is not None else [b"k%d" % i for i in range(n)], pa.binary()),
        "value": pa.array(values, pa.binary()), "headers": pa.array([None] * n, arrow_schema().field("headers").type),
        "plan_id": pa.array(["p"] * n),
    }).select(arrow_schema().names)  # fmt: skip


def _spark_decoded(
    spark: Any, batch: Any, deser: Deserialization, *, tombstones: bool = False
) -> tuple[Any, list[dict[str, Any]]]:
    """Spark's decoder over ``batch``: the columns Spark's write stages (less the partition folders), the rows."""
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from tidemark.spark.decode import annotate
    from tidemark.spark.source import SCHEMA

    records = spark.createDataFrame(pa.Table.from_batches([batch]), schema=SCHEMA)
    decoded = annotate(records, deser, tombstones=tombstones)
    staged = StructType([f for f in decoded.schema.fields if f.name not in (ERROR_COLUMN, "plan_id")])
    return staged, [r.asDict() for r in decoded.orderBy("offset").collect()]


def _plan(deser: Deserialization, staged: Any, *, tombstones: bool = False) -> PlainPlan:
    plan = PlainPlan.of(deser, staged, partition_columns=("_outcome", "topic", "date"), ok="ok",
                        raw_value=RAW_VALUE_COLUMN, tombstones=tombstones)  # fmt: skip
    assert isinstance(plan, PlainPlan), plan
    return plan


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)  # -0.0 is not 0.0
    return type(a) is type(b) and a == b


def _compare(spark: Any, values: list[bytes | None], deser: Deserialization, *, tombstones: bool = False) -> int:
    """Each of ``values`` staged alone by the read tasks, or refused, against Spark's decoder; the count staged."""
    batch = _batch(values)
    staged_columns, theirs = _spark_decoded(spark, batch, deser, tombstones=tombstones)
    plan = _plan(deser, staged_columns, tombstones=tombstones)
    schema = staged_arrow_schema(plan)
    staged = 0
    for i, row in enumerate(theirs):
        try:
            ours = laid_out(batch.slice(i, 1), plan, schema).to_pylist()[0]
        except CannotStage:
            continue  # giving way is always allowed: Spark then stages the record, whatever it is
        staged += 1
        assert row[ERROR_COLUMN] is None, (values[i], row[ERROR_COLUMN])  # Spark would quarantine it
        names = [n for n in ours if n != "timestamp"]
        wrong = {n: (ours[n], row[n]) for n in names if not _same(ours[n], row[n])}
        assert not wrong, (values[i], wrong)
    return staged


def test_edge_values_are_staged_as_spark_decodes_them_or_refused(spark: Any) -> None:
    staged = _compare(spark, list(EDGE_VALUES), _deser())
    assert staged >= 10  # the ordinary documents among them do take the path


def _number_text(rng: random.Random) -> str:
    choices = [
        lambda: str(rng.randint(-(2**70), 2**70)),
        lambda: str(rng.randint(-1000, 1000)),
        lambda: repr(struct.unpack("<d", rng.randbytes(8))[0]),
        lambda: f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 20)}f}",
        lambda: f"{rng.randint(1, 9)}.{rng.randint(0, 999)}e{rng.choice(['', '+', '-'])}{rng.randint(0, 330)}",
        lambda: rng.choice(["-0", "-0.0", "0.0", "1E5", "1e-7", "2.2250738585072014e-308", "0.1", "1." + "3" * 40]),
    ]
    return rng.choice(choices)()


def _string_text(rng: random.Random) -> str:
    alphabet = ["a", "é", "😀", "\\n", '\\"', "\\\\", "\\u0000", "\\u00e9", "\\ud83d\\ude00", "\\ud800", " ", "/"]
    return '"' + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) + '"'


def _field_text(rng: random.Random, kind: str) -> str | None:
    own = {"string": lambda: _string_text(rng), "integer": lambda: str(rng.randint(-(2**64), 2**64)),
           "number": lambda: _number_text(rng), "boolean": lambda: rng.choice(["true", "false"])}  # fmt: skip
    pick = rng.random()
    if pick < 0.6:
        return own[kind]()
    if pick < 0.7:
        return "null"
    if pick < 0.8:
        return None  # absent
    other = rng.choice([k for k in own if k != kind])
    return own[other]() if rng.random() < 0.9 else rng.choice(["[1]", '{"a": 2}', "NaN", "Infinity"])


def _document(rng: random.Random) -> bytes:
    parts = []
    for name, kind, _ in FIELDS:
        text = _field_text(rng, kind)
        if text is not None:
            parts.append(f'"{name}":{rng.choice(["", " "])}{text}')
    if rng.random() < 0.3:
        parts.insert(rng.randint(0, len(parts)), f'"extra": {{"x": [{_number_text(rng)}, {_string_text(rng)}]}}')
    if rng.random() < 0.03 and parts:
        parts.append(parts[0])  # a duplicate key
    rng.shuffle(parts)
    return ("{" + ", ".join(parts) + "}").encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
def test_generated_documents_are_staged_as_spark_decodes_them_or_refused(spark: Any, required: bool) -> None:
    rng = random.Random(61)
    values: list[bytes | None] = [_document(rng) for _ in range(3000)]
    staged = _compare(spark, values, _deser(required=required))
    assert staged > 300  # a real share of them takes the path (most have a field of another type)


@pytest.mark.parametrize("tombstones", [False, True], ids=["bad", "change"])
def test_a_null_json_value_is_staged_only_where_spark_decodes_it_as_a_record(spark: Any, tombstones: bool) -> None:
    for required in (True, False):
        staged = _compare(spark, [None, b'{"s": "x"}'], _deser(required=required), tombstones=tombstones)
        assert staged == (2 if tombstones or not required else 1)


@pytest.mark.parametrize("fmt", ["bytes", "string"])
def test_raw_and_text_values_and_keys_are_staged_as_spark_decodes_them_or_refused(spark: Any, fmt: str) -> None:
    values: list[bytes | None] = [b"plain", b"", None, "é😀".encode(), b"\xff\xfe", b"\xed\xa0\x80", b"\x00\x01"]
    staged = _compare(spark, values, _deser(fmt))
    assert staged == (len(values) if fmt == "bytes" else len(values) - 2)
    batch = _batch([b"v", b"v"], [b"ok", b"\xc3\x28"])  # a key that is not UTF-8: Spark's decoder refuses it
    staged_columns, theirs = _spark_decoded(spark, batch, _deser(fmt))
    plan = _plan(_deser(fmt), staged_columns)
    assert theirs[1][ERROR_COLUMN] == "key is not valid UTF-8"
    with pytest.raises(CannotStage, match="a key that is not UTF-8"):
        laid_out(batch, plan, staged_arrow_schema(plan))
    assert _compare(spark, [b"v"], _deser(fmt, key_format="bytes")) == 1


def test_a_plan_refuses_columns_it_does_not_write(spark: Any) -> None:
    from pyspark.sql.types import StructField, StructType

    staged, _ = _spark_decoded(spark, _batch([b"{}"]), _deser())
    more = StructType([*staged.fields, StructField("_row_hash", staged["offset"].dataType)])
    assert "not the ones the read tasks write" in str(
        PlainPlan.of(
            _deser(), more, partition_columns=("_outcome", "topic", "date"), ok="ok", raw_value=RAW_VALUE_COLUMN
        )
    )
    ddl = Deserialization(format="json", schema_ddl="s string")
    assert "schema_ddl" in str(PlainPlan.of(ddl, staged, partition_columns=("_outcome", "topic", "date"), ok="ok",
                                            raw_value=RAW_VALUE_COLUMN))  # fmt: skip
    assert json.loads(_plan(_deser(), staged).file_schema)["type"] == "struct"
