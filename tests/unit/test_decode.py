"""Decoding per feed: bytes, UTF-8 strings, JSON with declared fields; failures kept aside."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tidemark.config.models import Deserialization, JsonField
from tidemark.errors import ConfigError
from tidemark.spark.decode import ERROR_COLUMN, RAW_VALUE_COLUMN, annotate, decode, json_schema_ddl

pytestmark = pytest.mark.spark

TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _records(spark: Any, pairs: list[tuple[bytes | None, bytes | None]]) -> Any:
    from tidemark.spark.source import SCHEMA

    rows = [("t", 0, i, TS, 0, k, v, [], "plan") for i, (k, v) in enumerate(pairs)]
    return spark.createDataFrame(rows, SCHEMA)


def _fields(**types: str) -> tuple[JsonField, ...]:
    return tuple(JsonField(name=n, type=t) for n, t in types.items())  # type: ignore[arg-type]


def test_bytes_keep_values_and_decode_keys(spark: Any) -> None:
    df = _records(spark, [(b"k1", b"\xff\x00"), (None, None), (b"\xc3\x28", b"v")])
    out = decode(df, Deserialization(format="bytes"))
    good = out.good.orderBy("offset").collect()
    assert [(r.key, bytes(r.value) if r.value is not None else None) for r in good] == [
        ("k1", b"\xff\x00"),
        (None, None),
    ]
    (bad,) = out.bad.collect()
    assert (bad.offset, bytes(bad.key), bad[ERROR_COLUMN]) == (2, b"\xc3\x28", "key is not valid UTF-8")


def test_key_format_bytes_never_fails(spark: Any) -> None:
    df = _records(spark, [(b"\xff", b"x")])
    out = decode(df, Deserialization(format="bytes", key_format="bytes"))
    assert [bytes(r.key) for r in out.good.collect()] == [b"\xff"]
    assert out.bad.count() == 0


def test_string_values(spark: Any) -> None:
    df = _records(spark, [(b"a", "héllo".encode()), (b"b", b"\xff\xfe"), (b"c", None)])
    out = decode(df, Deserialization(format="string"))
    assert [(r.offset, r.value) for r in out.good.orderBy("offset").collect()] == [(0, "héllo"), (2, None)]
    assert [(r.offset, r[ERROR_COLUMN]) for r in out.bad.collect()] == [(1, "value is not valid UTF-8")]
    assert dict(out.good.dtypes)["value"] == "string"


def test_json_fields_become_columns_and_failures_are_kept(spark: Any) -> None:
    fields = (*_fields(order_id="integer", amount="number", paid="boolean"),
              JsonField(name="note", type="string", required=False))  # fmt: skip
    values: list[bytes | None] = [
        b'{"order_id": 1, "amount": 9.5, "paid": true, "note": "x"}',
        b'{"order_id": 2, "amount": 3, "paid": false}',  # optional note missing, integer amount is a number
        b'{"order_id": "two", "amount": 1.0, "paid": true}',  # wrong type
        b"not json",
        b"[1, 2]",
        b'{"amount": 1.0, "paid": true}',  # required field missing
        b'{"order_id": null, "amount": 1.0, "paid": true}',  # required field null
        None,  # tombstone
        b'{"order_id": 3, "amount": 1.0, "paid": true, "extra": [1]}',  # extra fields are ignored
    ]
    df = _records(spark, [(b"k", v) for v in values])
    out = decode(df, Deserialization(format="json", fields=fields))
    good = out.good.orderBy("offset").collect()
    assert [(r.offset, r.order_id, r.amount, r.paid, r.note) for r in good] == [
        (0, 1, 9.5, True, "x"),
        (1, 2, 3.0, False, None),
        (8, 3, 1.0, True, None),
    ]
    assert "value" not in out.good.columns
    assert dict(out.good.dtypes)["order_id"] == "bigint"
    bad = {r.offset: r[ERROR_COLUMN] for r in out.bad.collect()}
    assert bad == {
        2: "value is not a JSON object matching the declared field types",
        3: "value is not a JSON object matching the declared field types",
        4: "value is not a JSON object matching the declared field types",
        5: "required field 'order_id' is missing or null",
        6: "required field 'order_id' is missing or null",
        7: "value is null (tombstone)",
    }
    # Nothing is dropped: every record is in exactly one of the two outputs, raw bytes kept.
    assert out.good.count() + out.bad.count() == len(values)
    assert bytes(out.bad.where("offset = 3").collect()[0].value) == b"not json"


@pytest.mark.parametrize("name", ["offset", "date", "_raw_value", "_outcome"])
def test_json_field_names_must_not_clash_with_record_or_job_columns(spark: Any, name: str) -> None:
    df = _records(spark, [(b"k", b"{}")])
    with pytest.raises(ConfigError, match=rf"\['{name}'\] clash"):
        decode(df, Deserialization(format="json", fields=_fields(**{name: "integer"})))


def test_annotate_keeps_every_row_with_its_raw_bytes(spark: Any) -> None:
    df = _records(spark, [(b"k0", b'{"n": 1}'), (b"\xc3\x28", b'{"n": 2}'), (b"k2", b"nope")])
    out = annotate(df, Deserialization(format="json", fields=_fields(n="integer")))
    rows = sorted(out.collect(), key=lambda r: r.offset)
    assert [(r.offset, r.n, r[ERROR_COLUMN]) for r in rows] == [
        (0, 1, None),
        (1, 2, "key is not valid UTF-8"),
        (2, None, "value is not a JSON object matching the declared field types"),
    ]
    assert bytes(rows[2][RAW_VALUE_COLUMN]) == b"nope"
    # The string cast of a key that is not UTF-8 keeps its bytes.
    assert out.selectExpr("cast(key as binary) AS k").where("k = X'C328'").count() == 1
    plain = annotate(df, Deserialization(format="bytes"))
    assert RAW_VALUE_COLUMN not in plain.columns and plain.count() == 3


def test_schema_ddl() -> None:
    ddl = json_schema_ddl(_fields(a="integer", b="number", c="string", d="boolean"))
    assert ddl == "`a` long, `b` double, `c` string, `d` boolean, `_tidemark_corrupt` string"
