"""Decoding per feed: bytes, UTF-8 strings, JSON with declared fields; failures kept aside."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tidemark.config.models import Deserialization, JsonField
from tidemark.errors import ConfigError
from tidemark.spark.decode import annotate, declared_json, decode
from tidemark.staged import ERROR_COLUMN, RAW_VALUE_COLUMN

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
    assert "value" not in out.good.columns and not [c for c in out.good.columns if c.startswith("_tidemark")]
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


NESTED_DDL = (
    "order_id long NOT NULL, customer struct<id: long, name: string>, placed_at timestamp, "
    "day date, amount decimal(10,2), tags array<string>, attrs map<string, int>"
)


def test_json_schema_ddl_gives_nested_and_logical_columns_and_a_nested_type_error_is_a_bad_record(spark: Any) -> None:
    from datetime import date
    from decimal import Decimal

    values: list[bytes | None] = [
        b'{"order_id": 1, "customer": {"id": 7, "name": "Ana"}, "placed_at": "2026-01-02T03:04:05Z", '
        b'"day": "2026-01-02", "amount": 12.5, "tags": ["new", "gift"], "attrs": {"size": 2}}',
        b'{"order_id": 2}',  # everything but the NOT NULL field may be missing
        b'{"order_id": 3, "customer": {"id": "seven"}}',  # a nested field of the wrong type
        b'{"order_id": 4, "tags": "gift"}',  # not an array
        b'{"order_id": 5, "day": "yesterday"}',  # not a date
        b'{"customer": {"id": 8}}',  # the required field missing
        None,
    ]
    df = _records(spark, [(b"k", v) for v in values])
    out = decode(df, Deserialization(format="json", schema_ddl=NESTED_DDL))

    assert not [c for c in out.good.columns if c.startswith("_tidemark")]
    types = dict(out.good.dtypes)
    assert [types[c] for c in ("order_id", "customer", "placed_at", "day", "amount", "tags", "attrs")] == [
        "bigint", "struct<id:bigint,name:string>", "timestamp", "date", "decimal(10,2)", "array<string>",
        "map<string,int>",
    ]  # fmt: skip
    good = out.good.orderBy("offset").collect()
    assert [r.offset for r in good] == [0, 1]
    first = good[0]
    assert (first.customer.id, first.customer.name, first.day, first.amount, first.tags, first.attrs) == (
        7, "Ana", date(2026, 1, 2), Decimal("12.50"), ["new", "gift"], {"size": 2})  # fmt: skip
    assert out.good.where("offset = 0").selectExpr("unix_timestamp(placed_at)").first()[0] == 1767323045
    bad = {r.offset: r[ERROR_COLUMN] for r in out.bad.collect()}
    assert bad == {
        2: "value is not a JSON object matching the declared field types",
        3: "value is not a JSON object matching the declared field types",
        4: "value is not a JSON object matching the declared field types",
        5: "required field 'order_id' is missing or null",
        6: "value is null (tombstone)",
    }


def test_json_schema_ddl_that_does_not_parse_names_itself(spark: Any) -> None:
    df = _records(spark, [(b"k", b"{}")])
    with pytest.raises(ConfigError, match=r"schema_ddl 'id lo ng,' is not a Spark DDL schema"):
        decode(df, Deserialization(format="json", schema_ddl="id lo ng,"))
    with pytest.raises(ConfigError, match=r"\['offset'\] clash"):
        decode(df, Deserialization(format="json", schema_ddl="offset long, x string"))


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


def test_declared_fields_map_to_nullable_spark_scalars_and_keep_what_is_required() -> None:
    declared, required = declared_json(
        Deserialization(format="json", fields=_fields(a="integer", b="number", c="string", d="boolean"))
    )
    assert declared.simpleString() == "struct<a:bigint,b:double,c:string,d:boolean>"
    assert all(f.nullable for f in declared.fields) and required == ("a", "b", "c", "d")
