"""Telling a record that did not decode, or whose body has bytes left over, from one that did, with and without a
required field in the reader."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from tidemark.spark.avro import VALUE_FIELD, AvroSchemas, bytes_left_over, decode_failed, decoded_value
from tidemark.spark.wire import header

pytestmark = pytest.mark.spark

NULLABLE = {"type": "record", "name": "R", "fields": [
    {"name": "a", "type": ["null", "long"], "default": None},
    {"name": "b", "type": ["null", "string"], "default": None},
]}  # fmt: skip
REQUIRED = {"type": "record", "name": "R", "fields": [
    {"name": "a", "type": ["null", "long"], "default": None},
    {"name": "b", "type": "string"},
]}  # fmt: skip


def _framed(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return header(7) + out.getvalue()


def _schemas(reader: dict[str, Any]) -> AvroSchemas:
    text = json.dumps(reader)
    return AvroSchemas(format="avro", subject="s", version=1, reader_id=7, writer_ids=(7,), reader=text,
                       writers={7: text})  # fmt: skip


@pytest.mark.parametrize("reader", [NULLABLE, REQUIRED], ids=["all-nullable", "required-field"])
def test_only_records_that_do_not_decode_are_failed(spark: Any, reader: dict[str, Any]) -> None:
    from pyspark.sql import functions as F

    schemas = _schemas(reader)
    full = _framed(reader, {"a": 5, "b": "x"})
    rows = [
        ("all null", _framed(NULLABLE, {"a": None, "b": None}) if reader is NULLABLE else None),
        ("full", full),
        ("a null", _framed(reader, {"a": None, "b": "y"})),
        ("bad body", header(7) + b"\xff\xff\xff\xff\xff"),
        ("null value", None),
        ("a byte left over", full + b"\x00"),
        ("a byte missing", full[:-1]),
        # The first union's branch flipped from long (2) to null (0): its long 0 (one byte 0) then reads as the
        # next field, and the bytes of that field are left over.
        ("branch flipped", header(7) + b"\x00" + _framed(reader, {"a": 0, "b": "x"})[6:]),
    ]
    df = spark.createDataFrame(rows, "name string, value binary").where(
        F.col("name") != "all null" if reader is REQUIRED else F.lit(True)
    )
    decoded = decoded_value(schemas)
    value = decoded.getField(VALUE_FIELD)
    got = {r["name"]: (r["failed"], r["left"], r["a"], r["b"]) for r in df.select(
        "name", decode_failed(decoded, schemas).alias("failed"), bytes_left_over(decoded).alias("left"),
        value.getField("a").alias("a"), value.getField("b").alias("b"),
    ).collect()}  # fmt: skip
    left = {k: v[1] for k, v in got.items() if v[1]}
    assert left == {"a byte left over": True, "branch flipped": True}
    assert {k: v[0] for k, v in got.items() if v[0]} == {"bad body": True, "null value": True, "a byte missing": True}
    expected = {"full": (5, "x"), "a null": (None, "y")}
    if reader is NULLABLE:
        expected["all null"] = (None, None)  # decoded, though every field is null
    assert {k: v[2:] for k, v in got.items() if not v[0] and not v[1]} == expected
