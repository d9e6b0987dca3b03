"""Telling a record that did not decode from one that did, with and without a required field in the reader."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from tidemark.spark.avro import DECODED_MARK, AvroSchemas, decode_failed, decoded_value
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
    assert schemas.marked == (reader is NULLABLE)  # the mark only where a record of nulls is a valid record
    rows = [
        ("all null", _framed(NULLABLE, {"a": None, "b": None}) if reader is NULLABLE else None),
        ("full", _framed(reader, {"a": 5, "b": "x"})),
        ("a null", _framed(reader, {"a": None, "b": "y"})),
        ("bad body", header(7) + b"\xff\xff\xff\xff\xff"),
        ("null value", None),
    ]
    df = spark.createDataFrame(rows, "name string, value binary").where(
        F.col("name") != "all null" if reader is REQUIRED else F.lit(True)
    )
    decoded = decoded_value(schemas)
    got = {r["name"]: (r["failed"], r["a"], r["b"]) for r in df.select(
        "name", decode_failed(decoded, schemas).alias("failed"), decoded.getField("a").alias("a"),
        decoded.getField("b").alias("b"),
    ).collect()}  # fmt: skip
    expected = {
        "full": (False, 5, "x"),
        "a null": (False, None, "y"),
        "bad body": (True, None, None),
        "null value": (True, None, None),
    }
    if reader is NULLABLE:
        expected["all null"] = (False, None, None)  # decoded: its mark is set, though every field is null
    assert got == expected
    names = df.select(decoded.alias("d")).schema["d"].dataType.names
    assert (DECODED_MARK in names) == schemas.marked
