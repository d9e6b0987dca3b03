"""``masking:`` in a feed file: treatments load, paths are checked against the declared schema, refusals name
the file and the path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.feed_files import assert_refused_naming
from tidemark.config.declared import avro_fields, ddl_fields
from tidemark.config.masking import Masking, Truncate, masking_problems
from tidemark.config.models import load_feed_file

DDL = (
    "order_id long NOT NULL, customer struct<email: string, name: string, age: int>, "
    "items array<struct<sku: string, note: string>>, tags array<string>, amount decimal(10,2)"
)
BASE = f'topics: [orders]\ngroup: orders-batch\ndeserialization:\n  format: json\n  schema_ddl: "{DDL}"\n'


def feed_file(tmp_path: Path, text: str, base: str = BASE) -> Path:
    path = tmp_path / "orders.yaml"
    path.write_text(base + text)
    return path


def test_every_treatment_loads_for_nested_paths_the_key_and_headers(tmp_path: Path) -> None:
    feed = load_feed_file(feed_file(tmp_path, (
        "masking:\n"
        "  fields:\n"
        "    customer.email: hash\n"
        "    customer.name: {truncate: 2}\n"
        "    items.note: redact\n"
        "    customer.age: drop\n"
        "  key: hash\n"
        "  headers: {x-user: redact, trace: drop}\n"
        f"  keep_raw: {tmp_path / 'secured'}\n"
    )))  # fmt: skip
    masking = feed.masking
    assert masking is not None
    assert masking.fields == {"customer.email": "hash", "customer.name": Truncate(truncate=2),
                              "items.note": "redact", "customer.age": "drop"}  # fmt: skip
    assert masking.key == "hash" and masking.headers == {"x-user": "redact", "trace": "drop"}
    assert masking.hashes and masking.dropped == ("customer.age",)
    assert load_feed_file(feed_file(tmp_path, "")).masking is None


@pytest.mark.parametrize(
    ("masking", "names"),
    [
        (
            "  fields: {customer.mail: hash}\n",
            ["masking.fields.customer.mail", "'customer' has no field 'mail'", "email"],
        ),
        ("  fields: {phone: redact}\n", ["masking.fields.phone", "the declared schema has no field 'phone'"]),
        ("  fields: {order_id.x: hash}\n", ["masking.fields.order_id.x", "'order_id' is of type long, not a record"]),
        ("  fields: {customer.age: {truncate: 3}}\n", ["masking.fields.customer.age", "truncate needs a string"]),
        ("  fields: {customer: drop, customer.email: hash}\n", ["'customer.email' lies inside 'customer'"]),
        ("  fields: {customer.email: scramble}\n", ["masking.fields.customer.email"]),
        ("  fields: {customer.email: {truncate: 0}}\n", ["masking.fields.customer.email", "truncate"]),
        ("  key: {truncate: 2, extra: 1}\n", ["masking.key"]),
    ],
)
def test_bad_masking_is_refused_naming_the_file_and_the_path(tmp_path: Path, masking: str, names: list[str]) -> None:
    assert_refused_naming(feed_file(tmp_path, "masking:\n" + masking), names)


def test_top_level_json_fields_are_checked_too(tmp_path: Path) -> None:
    base = ("topics: [orders]\ngroup: g\ndeserialization:\n  format: json\n"
            "  fields: [{name: email, type: string}, {name: n, type: integer}]\n")  # fmt: skip
    assert load_feed_file(feed_file(tmp_path, "masking: {fields: {email: hash}}\n", base)).masking is not None
    assert_refused_naming(feed_file(tmp_path, "masking: {fields: {mail: hash}}\n", base), ["masking.fields.mail"])
    truncated = feed_file(tmp_path, "masking: {fields: {n: {truncate: 1}}}\n", base)
    assert_refused_naming(
        truncated, ["masking.fields.n", "truncate needs a string or binary field; 'n' is of type integer"]
    )


def test_value_fields_of_a_string_feed_and_expectations_on_dropped_fields_are_refused(tmp_path: Path) -> None:
    plain = "topics: [orders]\ngroup: g\ndeserialization: {format: string}\n"
    assert_refused_naming(feed_file(tmp_path, "masking: {fields: {email: hash}}\n", plain),
                          ["masking.fields", "format string has no fields"])  # fmt: skip
    assert load_feed_file(feed_file(tmp_path, "masking: {key: redact, headers: {a: hash}}\n", plain)).masking
    dropped = ("validation:\n  expectations:\n    - {type: expect_column_values_to_not_be_null, "
               "kwargs: {column: customer.email}}\nmasking: {fields: {customer: drop}}\n")  # fmt: skip
    assert_refused_naming(feed_file(tmp_path, dropped), ["customer.email", "drop"])


def test_raw_bytes_are_never_kept_inside_the_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for inside in (out, out / "raw", Path(f"{out}.quarantine") / "raw"):
        text = f"output: {out}\nmasking: {{key: hash, keep_raw: {inside}}}\n"
        assert_refused_naming(feed_file(tmp_path, text), ["masking.keep_raw", "separately secured"])
    assert load_feed_file(feed_file(tmp_path, f"output: {out}\nmasking: {{key: hash, keep_raw: {tmp_path}/raw}}\n"))


def test_the_ddl_reader_sees_nested_records_and_arrays_of_records() -> None:
    fields = ddl_fields(DDL)
    assert set(fields) == {"order_id", "customer", "items", "tags", "amount"}
    assert fields["customer"].fields is not None and set(fields["customer"].fields) == {"email", "name", "age"}
    assert fields["items"].type == "array" and set(fields["items"].fields or {}) == {"sku", "note"}
    assert fields["tags"].fields is None and fields["amount"].type == "decimal"


def test_avro_reader_schemas_give_nested_records_arrays_unions_and_named_types() -> None:
    schema = {
        "type": "record", "name": "Order", "namespace": "shop",
        "fields": [
            {"name": "id", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "customer", "type": ["null", {"type": "record", "name": "Customer", "fields": [
                {"name": "email", "type": "string"}, {"name": "tier", "type": {"type": "enum", "name": "T",
                                                                               "symbols": ["A"]}}]}]},
            {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
                {"name": "note", "type": ["null", "string"]}, {"name": "raw", "type": "bytes"}]}}},
            {"name": "previous", "type": ["null", "shop.Customer"]},
        ],
    }  # fmt: skip
    fields = avro_fields(json.dumps(schema))
    masking = Masking(fields={"customer.email": {"truncate": 2}, "items.note": "hash", "items.raw": {"truncate": 1},
                              "previous.tier": "redact", "customer.tier": {"truncate": 1}})  # fmt: skip
    assert masking_problems(masking, fields) == []
    assert masking_problems(Masking(fields={"id": {"truncate": 1}, "customer.phone": "drop"}), fields) == [
        "masking.fields.id: truncate needs a string or binary field; 'id' is of type timestamp-millis",
        "masking.fields.customer.phone: 'customer' has no field 'phone' (its fields: email, tier)",
    ]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("output_format: iceberg\niceberg: {mode: upsert, key: order_id, change_format: state}\n"
         "masking: {fields: {order_id: drop}}\n", "the keyed table's key"),
        ("output_format: iceberg\niceberg: {mode: upsert, key: key, change_format: state}\nmasking: {key: drop}\n",
         "the keyed table's key"),
        ("parquet: {partition_by: {field: amount}}\nmasking: {fields: {amount: drop}}\n",
         "parquet.partition_by partitions by"),
    ],
)  # fmt: skip
def test_a_column_the_output_is_built_on_may_not_be_dropped(tmp_path: Path, text: str, named: str) -> None:
    base = BASE.replace("order_id long NOT NULL", "order_id long")  # a keyed table's fields may be null (tombstones)
    with pytest.raises(Exception, match=named):
        load_feed_file(feed_file(tmp_path, text, base=base))


def test_path_problems_name_the_walked_path_and_the_fields_there() -> None:
    from tidemark.config.declared import DeclaredField
    from tidemark.config.masking import path_problem

    inner = DeclaredField("struct", {"leaf": DeclaredField("int")})
    declared = {
        **ddl_fields(DDL),
        "meta": DeclaredField("struct", {}),
        "outer": DeclaredField("struct", {"inner": inner}),
    }
    assert path_problem("outer.inner.leaf.x", "redact", declared) == (
        "'outer.inner.leaf' is of type int, not a record: it has no field 'x'"
    )
    assert path_problem("outer.inner.nope", "redact", declared) == (
        "'outer.inner' has no field 'nope' (its fields: leaf)"
    )
    assert path_problem("nope", "redact", declared) == (
        "the declared schema has no field 'nope' (its fields: amount, customer, items, meta, order_id, outer, tags)"
    )
    assert path_problem("meta.x", "hash", declared) == "'meta' has no field 'x' (its fields: none)"
    assert path_problem("outer.inner.leaf", Truncate(truncate=1), declared) == (
        "truncate needs a string or binary field; 'outer.inner.leaf' is of type int"
    )
    assert path_problem("customer.email", Truncate(truncate=1), declared) is None
    assert path_problem("outer.inner.leaf", "drop", declared) is None


@pytest.mark.parametrize(
    ("treatment", "name"),
    [("drop", "drop"), ("hash", "hash"), ("redact", "redact"), (Truncate(truncate=3), "truncate")],
)
def test_each_treatment_has_its_name(treatment: object, name: str) -> None:
    from tidemark.config.masking import treatment_name

    assert treatment_name(treatment) == name  # type: ignore[arg-type]
