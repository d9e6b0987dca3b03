"""The pure parts of the JSON Schema and Protobuf formats: a JSON Schema as Spark types, Protobuf's message indexes."""

from __future__ import annotations

import pytest

from tidemark.config.models import Deserialization


def test_json_schema_maps_nullable_refs_maps_and_logical_strings_onto_spark_types() -> None:
    from pyspark.sql import types as T

    from tidemark.spark.json_schema import spark_type

    doc = {
        "type": "object",
        "properties": {
            "n": {"type": ["null", "integer"]},
            "x": {"anyOf": [{"type": "null"}, {"type": "number"}]},
            "who": {"$ref": "#/$defs/Who"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "state": {"enum": ["A", "B"]},
            "flags": {"type": "array", "items": {"type": "boolean"}},
        },
        "$defs": {"Who": {"type": "object", "properties": {"name": {"type": "string"}}}},
    }
    assert spark_type(doc) == T.StructType([
        T.StructField("n", T.LongType()), T.StructField("x", T.DoubleType()),
        T.StructField("who", T.StructType([T.StructField("name", T.StringType())])),
        T.StructField("counts", T.MapType(T.StringType(), T.LongType())), T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()), T.StructField("state", T.StringType()),
        T.StructField("flags", T.ArrayType(T.BooleanType())),
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("prop", "why"),
    [
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "no single Spark type"),
        ({"$ref": "#/properties/p"}, "recursive"),
        ({"type": "object"}, "without properties"),
        ({"$ref": "other.json#/X"}, "not a reference inside the schema"),
    ],
)
def test_json_schema_without_one_spark_type_is_refused_naming_the_property(prop: dict[str, object], why: str) -> None:
    from tidemark.spark.json_schema import spark_type

    with pytest.raises(ValueError, match=why):
        spark_type({"type": "object", "properties": {"p": prop}})


@pytest.mark.parametrize(
    ("after_prefix", "path", "body_at"),
    [
        (b"\x00", (0,), 6),  # the serializers' short form for the first message
        (b"\x04\x00\x02", (0, 1), 8),  # two indexes, zigzag: 2 -> 4, 0 -> 0, 1 -> 2
        (b"\x02\x80\x01", (64,), 8),  # one index of two varint bytes: 64 -> 128
    ],
)
def test_protobuf_message_indexes_are_zigzag_varints_after_the_prefix(
    after_prefix: bytes, path: tuple[int, ...], body_at: int
) -> None:
    from tidemark.spark.protobuf import message_indexes

    assert message_indexes(b"\x00\x00\x00\x00\x07" + after_prefix + b"\x08\x01") == (path, body_at)


@pytest.mark.parametrize("after_prefix", [b"", b"\x04\x00", b"\x02\x80", b"\x01"])
def test_protobuf_message_indexes_cut_short_or_negative_are_a_bad_record(after_prefix: bytes) -> None:
    from tidemark.spark.protobuf import _BadRecord, message_indexes

    with pytest.raises(_BadRecord):
        message_indexes(b"\x00\x00\x00\x00\x07" + after_prefix)


def test_registry_formats_take_subject_and_version_and_other_formats_do_not() -> None:
    for fmt in ("avro", "json_schema", "protobuf"):
        assert Deserialization(format=fmt, subject="s-value", schema_version=2).subject == "s-value"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="need format: avro, json_schema or protobuf"):
        Deserialization(format="json", fields=({"name": "a", "type": "string"},), subject="s")  # type: ignore[arg-type]


def test_registry_keys_read_their_own_subject_and_version_and_other_key_formats_take_neither() -> None:
    from tidemark.config.models import Feed

    keyed = Deserialization(format="string", key_format="avro")
    assert (keyed.reader_subject(("orders",), "key"), keyed.reader_version("key")) == ("orders-key", None)
    assert keyed.registry_parts == ("key",) and keyed.decodes_avro
    pinned = Deserialization(format="protobuf", key_format="json_schema", key_subject="k", key_schema_version=3)
    assert (pinned.reader_subject(("a", "b"), "key"), pinned.reader_version("key")) == ("k", 3)
    assert pinned.registry_parts == ("key", "value") and not pinned.decodes_avro
    with pytest.raises(ValueError, match="need key_format: avro, json_schema or protobuf"):
        Deserialization(format="avro", key_format="string", key_subject="k")
    with pytest.raises(ValueError, match=r"deserialization\.key_subject: a feed of several topics"):
        Feed(name="f", topics=("a", "b"), group="g", deserialization={"key_format": "avro"})  # type: ignore[arg-type]


def test_a_registry_keys_reasons_come_first_and_name_the_key() -> None:
    from tidemark.spark.decode import decode_reasons

    assert decode_reasons(Deserialization(format="avro", key_format="json_schema")) == [
        "key is not valid UTF-8",
        "key is not JSON (RFC 8259, as json.loads reads it)",
        "key is not valid under the reader JSON Schema",  # with the run's schemas, each field's rules besides
        "value is null (tombstone)",
        "value does not decode against its Avro writer schema",
        "value has bytes left over after the fields of its Avro writer schema",
    ]
    assert decode_reasons(Deserialization(format="bytes", key_format="protobuf")) == [
        "key does not decode as the Protobuf message of its writer schema"
    ]
