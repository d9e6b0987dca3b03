"""Every value as its schema says, or refused (issue 42): the shapes producers really send, end to end on the real
cluster and a real schema registry, each compared with the format's reference decoder reading the same bytes.

A schema change the format's own resolution rules do not allow fails the run at planning, naming the subject, the
versions and the field; a body the reference decoder does not read exactly (bytes left over or missing, a value
Spark's types cannot hold) is quarantined with its reason, on the read-task path and on Spark's path alike.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import env_of
from tests.integration.job.test_read_task_staging import V1, StagingEnv, reading
from tests.integration.job.test_registry_formats import (
    RegistryEnv,
    _order_classes,
    _proto_as_published,
    _utc,
    proto_order,
)
from tests.support.differential import avro_within_spec
from tidemark.spark.arrow_avro import SWITCH_ENV

pytestmark = [pytest.mark.integration, pytest.mark.spark]
LEFT_OVER = "decode_error: value has bytes left over after the fields of its Avro writer schema"


@pytest.fixture
def env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> RegistryEnv:
    return env_of(RegistryEnv, kafka, registry, tmp_path, spark, monkeypatch)


@pytest.fixture
def staging_env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> StagingEnv:
    """An Avro feed read by the data source, where the read tasks may stage."""
    return env_of(StagingEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _comparable(row: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A published row's value fields, its timestamps in UTC (Parquet hands them back naive or not)."""
    out = {f["name"]: row[f["name"]] for f in schema["fields"]}
    for name, value in out.items():
        if isinstance(value, dt.datetime):
            out[name] = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    return out


def _decimal_order(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": precision,
                                    "scale": scale}},
    ]}  # fmt: skip


@pytest.mark.parametrize(
    ("writer", "reader"), [((10, 2), (10, 4)), ((12, 4), (12, 2))], ids=["fewer-digits", "lower-scale"]
)
def test_avro_decimal_read_at_another_scale_is_refused_naming_subject_versions_and_field(
    env: RegistryEnv, writer: tuple[int, int], reader: tuple[int, int]
) -> None:
    # decimal(10,2) read as decimal(10,4): 12345678.90 has eight digits before the point, the reader six; decimal(12,4)
    # read as decimal(12,2): 1.2345 has no exact value at scale 2. Refused at planning, before anything is read.
    v1, v2 = env.serializer(_decimal_order(*writer)), env.serializer(_decimal_order(*reader))
    first = v1({"id": 1, "amount": Decimal("3.34")})
    env.produce([first, v1({"id": 2, "amount": Decimal("5.00")})], 0)
    env.produce([v2({"id": 3, "amount": Decimal("1.00")})], 1)
    subject = f"{env.topic}-value"
    v1_id = int.from_bytes(first[1:5], "big")

    with pytest.raises(Exception, match="cannot be read with the reader schema") as info:
        env.run()

    env.assert_refused(
        info, f"{env.topic}[0] offset 0", f"schema id {v1_id} (version 1 of subject '{subject}')",
        f"subject '{subject}' version 2",
        f"field 'Order.amount': written as decimal({writer[0]},{writer[1]}), read as decimal({reader[0]},{reader[1]})",
    )  # fmt: skip


def test_avro_decimal_read_at_a_higher_scale_publishes_every_value_exactly(env: RegistryEnv) -> None:
    # decimal(10,2) read as decimal(12,4): the same eight digits before the point, two more after it, so every written
    # value is representable; read at the writer's scale, then cast (from_avro alone would read 3.34 as 0.0334).
    v1, v2 = env.serializer(_decimal_order(10, 2)), env.serializer(_decimal_order(12, 4))
    amounts = [Decimal("3.34"), Decimal("99999999.99"), Decimal("-99999999.99"), Decimal("0.01"), Decimal("0.00")]
    env.produce([v1({"id": i, "amount": a}) for i, a in enumerate(amounts)], 0)
    env.produce([v2({"id": 10, "amount": Decimal("12345678.1234")})], 1)

    env.run()

    published = {k: (r["id"], r["amount"]) for k, r in env.published().items()}
    written = {k: (v["id"], v["amount"]) for k, v in env.scan_with(_writer_decoded(env)).items()}
    assert published == written and len(published) == 6
    assert published[(0, 0)] == (0, Decimal("3.3400")) and published[(0, 1)] == (1, Decimal("99999999.9900"))


def _writer_decoded(env: RegistryEnv) -> Any:
    """Each record decoded with its own writer schema by confluent-kafka's AvroDeserializer (no reader given)."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    de = AvroDeserializer(env.sr)
    ctx = SerializationContext(env.topic, MessageField.VALUE)
    return lambda v: de(v, ctx)


@pytest.mark.parametrize(("writer", "reader"), [((12, 3), (14, 3)), ((12, 3), (12, 3))])
def test_avro_decimal_widened_at_the_same_scale_publishes_every_value_exactly(
    env: RegistryEnv, writer: tuple[int, int], reader: tuple[int, int]
) -> None:
    # decimal(12,3) read as decimal(14,3): the unscaled bytes mean the same number at the same scale, and every
    # value of the writer fits the reader; Avro's own compatibility check accepts it and producers make the change.
    v1, v2 = env.serializer(_decimal_order(*writer)), env.serializer(_decimal_order(*reader))
    amounts = [Decimal("123456789.123"), Decimal("-999999999.999"), Decimal("0.001"), Decimal("0.000")]
    env.produce([v1({"id": i, "amount": a}) for i, a in enumerate(amounts)], 0)
    widest = Decimal("12345678901.234") if reader[0] >= 14 else Decimal("987654321.234")  # the reader's digits
    env.produce([v2({"id": 10, "amount": widest})], 1)

    env.run()

    published = {k: (r["id"], r["amount"]) for k, r in env.published().items()}
    scanned = {k: (v["id"], v["amount"]) for k, v in env.scan(_decimal_order(*reader)).items()}
    assert published == scanned and len(published) == 5
    assert published[(0, 1)] == (1, Decimal("-999999999.999"))
    assert published[(1, 0)] == (10, widest)


def test_avro_decimal_narrowed_at_the_same_scale_is_refused_naming_the_field(env: RegistryEnv) -> None:
    # decimal(14,3) read as decimal(12,3): a written value may not fit the reader, so the change is refused.
    v1, v2 = env.serializer(_decimal_order(14, 3)), env.serializer(_decimal_order(12, 3))
    env.produce([v1({"id": 1, "amount": Decimal("12345678901.234")})], 0)
    env.produce([v2({"id": 2, "amount": Decimal("1.000")})], 1)

    with pytest.raises(Exception, match="cannot be read with the reader schema") as info:
        env.run()

    env.assert_refused(info, "field 'Order.amount': written as decimal(14,3), read as decimal(12,3)")


def _line_order_classes(qty: str) -> Any:
    """``shop.Order`` with ``map<string, Line> lines`` whose ``Line.qty`` has type ``qty``."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    one, many = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    proto = descriptor_pb2.FileDescriptorProto(name="shop/lines.proto", package="shop", syntax="proto3")
    o = proto.message_type.add(name="Order")
    o.field.add(name="id", number=1, type=field.TYPE_INT32, label=one)
    o.field.add(name="lines", number=2, type=field.TYPE_MESSAGE, type_name=".shop.Order.LinesEntry", label=many)
    entry = o.nested_type.add(name="LinesEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=one)
    entry.field.add(name="value", number=2, type=field.TYPE_MESSAGE, type_name=".shop.Line", label=one)
    line = proto.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=field.TYPE_STRING, label=one)
    line.field.add(name="qty", number=2, type=getattr(field, "TYPE_" + qty.upper()), label=one)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_protobuf_field_retyped_inside_a_map_value_message_is_refused_naming_it(env: RegistryEnv) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    env.write_feed(format="protobuf")
    ctx = SerializationContext(env.topic, MessageField.VALUE)
    conf = {"auto.register.schemas": True, "use.deprecated.format": False}
    v1_cls, v2_cls = _line_order_classes("string"), _line_order_classes("int32")
    v1, v2 = ProtobufSerializer(v1_cls, env.sr, conf), ProtobufSerializer(v2_cls, env.sr, conf)
    first = v1(v1_cls(id=1, lines={"a": {"sku": "x", "qty": "7"}}), ctx)  # "7" read as int32 would publish 0
    env.produce([first], 0)
    env.produce([v2(v2_cls(id=2, lines={"b": {"sku": "y", "qty": 7}}), ctx)], 1)
    subject = f"{env.topic}-value"
    v1_id = int.from_bytes(first[1:5], "big")

    with pytest.raises(Exception, match="cannot be read with the reader schema") as info:
        env.run()

    env.assert_refused(
        info, f"{env.topic}[0] offset 0", f"schema id {v1_id} (version 1 of subject '{subject}')",
        f"subject '{subject}' version 2", "field 'Order.lines.qty' (number 2) is string in the writer and int32",
    )  # fmt: skip


def _whole_body_fastavro(schema: dict[str, Any], value: bytes) -> Any:
    """fastavro's reading of ``value``'s body, or None when its fields do not read it to its last byte."""
    import fastavro

    buffer = io.BytesIO(value[5:])
    try:
        doc = fastavro.schemaless_reader(buffer, fastavro.parse_schema(schema), None)
    except Exception:  # noqa: BLE001 - any failure of the reference decoder is a body that does not decode
        return None
    return doc if buffer.tell() == len(value) - 5 else None


@pytest.mark.parametrize("path", ["read_tasks", "spark"])
def test_an_avro_body_with_bytes_left_over_is_quarantined_on_both_paths(
    staging_env: StagingEnv, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    env = staging_env
    if path == "spark":
        monkeypatch.setenv(SWITCH_ENV, "0")
    write = env.serializer(V1)
    values = [write(reading(i, v2=False)) for i in range(20)]
    good = write({**reading(99, v2=False), "note": "", "qty": None})
    assert good.endswith(b"\x02\x00\x00")  # note: the string branch (2), "" (0); qty: the null branch (0)
    bad = {
        (0, 20): good + b"\x00",  # one byte too many
        (0, 21): good[:-3] + b"\x00\x00\x00",  # note's branch flipped to null: qty reads "", its null is left over
    }
    assert all(_whole_body_fastavro(V1, v) is None for v in bad.values())  # the reference decoder's verdict
    env.produce([*values, *bad.values()], 0)

    env.run()

    assert env.job()["staged_by"] == "spark"  # the read tasks give way on such a body
    scanned = env.scan(V1, undecodable=list(bad))
    assert {k: scanned.pop(k) for k in bad} == bad
    assert {k: _comparable(r, V1) for k, r in env.published().items()} == scanned
    quarantined = {(q["partition"], q["offset"]): q for q in env.quarantined()}
    assert {k: q["_raw_value"] for k, q in quarantined.items()} == bad
    assert {q["_reason"] for q in quarantined.values()} == {LEFT_OVER}


FLAGS = {"type": "record", "name": "Parcel", "namespace": "plant", "fields": [
    {"name": "id", "type": "long"},
    {"name": "paid", "type": "boolean"},
    {"name": "checked", "type": ["null", "boolean"]},
]}  # fmt: skip
NESTED_FLAGS = {"type": "record", "name": "Order", "namespace": "plant", "fields": [
    {"name": "id", "type": "long"},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "shipped", "type": ["null", "boolean"]}]}}},
]}  # fmt: skip


def _boolean_reason(field: str) -> str:
    return (
        f"decode_error: value field '{field}' holds a boolean byte other than 0 or 1 (Avro's booleans are the byte 0 "
        "or 1 only)"
    )


@pytest.mark.parametrize("path", ["read_tasks", "spark", "nested"])
def test_a_boolean_byte_other_than_0_or_1_is_quarantined_on_both_paths_naming_the_field(
    staging_env: StagingEnv, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # The spec allows a boolean only the byte 0 or 1; Java's reader and polars' read any other as false and published
    # it, fastavro reads it as true. Neither is the writer's value: the record is a bad record, its field named.
    env = staging_env
    if path == "spark":
        monkeypatch.setenv(SWITCH_ENV, "0")
    schema = NESTED_FLAGS if path == "nested" else FLAGS
    write = env.serializer(schema)
    if path == "nested":
        values = [write({"id": i, "lines": [{"sku": "a", "shipped": i % 3 == 0 or None}]}) for i in range(20)]
        good = write({"id": 100, "lines": [{"sku": "a", "shipped": None}, {"sku": "b", "shipped": True}]})
        assert good.endswith(b"\x02b\x02\x01\x00")  # the second line's shipped: its branch (2), true (1); the end
        bad = {(0, 20): good[:-2] + b"\x02\x00"}
        fields = {(0, 20): "lines[].shipped"}
    else:
        values = [write({"id": i, "paid": i % 2 == 0, "checked": [None, True, False][i % 3]}) for i in range(20)]
        good = write({"id": 100, "paid": True, "checked": True})
        assert good.endswith(b"\x01\x02\x01")  # paid: 1; checked: the boolean branch (2), 1
        bad = {(0, 20): good[:-3] + b"\x02\x02\x01", (0, 21): good[:-3] + b"\x00\x02\xff"}
        fields = {(0, 20): "paid", (0, 21): "checked"}
    assert all(not avro_within_spec(schema, v[5:]) for v in bad.values())  # the spec's verdict
    assert all(_whole_body_fastavro(schema, v) is not None for v in bad.values())  # fastavro reads them as true
    env.produce([*values, *bad.values()], 0)

    env.run()

    assert env.job()["staged_by"] == "spark"  # the read tasks give way on such a body (or never take nested ones)
    scanned = env.scan(schema, undecodable=list(bad))
    assert {k: scanned.pop(k) for k in bad} == bad
    assert {k: _comparable(r, schema) for k, r in env.published().items()} == scanned
    quarantined = {(q["partition"], q["offset"]): q for q in env.quarantined()}
    assert {k: q["_raw_value"] for k, q in quarantined.items()} == bad
    assert {k: q["_reason"] for k, q in quarantined.items()} == {k: _boolean_reason(f) for k, f in fields.items()}


MILLIS_ONLY = {"type": "record", "name": "Tick", "namespace": "plant", "fields": [
    {"name": "id", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}  # fmt: skip


@pytest.mark.parametrize("path", ["read_tasks", "spark"])
def test_timestamp_millis_that_overflow_microseconds_are_quarantined_on_both_paths(
    staging_env: StagingEnv, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    env = staging_env
    if path == "spark":
        monkeypatch.setenv(SWITCH_ENV, "0")
    write = env.serializer(MILLIS_ONLY)
    start = dt.datetime(2025, 11, 26, tzinfo=dt.UTC)
    values = [write({"id": i, "at": start + dt.timedelta(milliseconds=i)}) for i in range(30)]
    # Epoch nanoseconds in the millis field, a common producer bug: times 1000 they overflow a long.
    nanos = [1764115200000000100, -1764115200000000100, 2**62]
    bad = {(0, 30 + n): write({"id": 100 + n, "at": v}) for n, v in enumerate(nanos)}
    env.produce([*values, *bad.values()], 0)

    env.run()

    scanned = env.scan(MILLIS_ONLY, undecodable=list(bad))
    assert {k: scanned.pop(k) for k in bad} == bad
    assert {k: _comparable(r, MILLIS_ONLY) for k, r in env.published().items()} == scanned
    quarantined = {(q["partition"], q["offset"]): q for q in env.quarantined()}
    assert {k: q["_raw_value"] for k, q in quarantined.items()} == bad
    assert {q["_reason"] for q in quarantined.values()} == {
        "decode_error: value field 'at' is a timestamp-millis whose microseconds overflow a long (epoch nanoseconds "
        "or microseconds in a millis field?)"
    }


@pytest.mark.parametrize("path", ["read_tasks", "spark"])
def test_every_published_timestamp_is_int64_micros_adjusted_to_utc_on_both_paths(
    staging_env: StagingEnv, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    import pyarrow.parquet as pq

    env = staging_env
    if path == "spark":
        monkeypatch.setenv(SWITCH_ENV, "0")
    write = env.serializer(MILLIS_ONLY)
    start = dt.datetime(2025, 11, 26, tzinfo=dt.UTC)
    env.produce([write({"id": i, "at": start + dt.timedelta(milliseconds=i)}) for i in range(30)], 0)

    env.run()

    assert env.job()["staged_by"] == path
    files = sorted(env.output.glob("plan_id=*/topic=*/date=*/*.parquet"))
    assert files
    for file in files:
        schema = pq.ParquetFile(file).schema
        for name in ("at", "timestamp"):  # the record's field and Kafka's timestamp
            column = schema.column(schema.names.index(name))
            assert column.physical_type == "INT64", (file, name)
            logical = json.loads(column.logical_type.to_json())
            assert (logical["Type"], logical["timeUnit"], logical["isAdjustedToUTC"]) == (
                "Timestamp", "microseconds", True
            ), logical  # fmt: skip


def test_a_protobuf_timestamp_outside_years_1_to_9999_is_quarantined_naming_the_field(env: RegistryEnv) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    env.write_feed(format="protobuf")
    order_cls, _ = _order_classes()
    ctx = SerializationContext(env.topic, MessageField.VALUE)
    conf = {"auto.register.schemas": True, "use.deprecated.format": False}
    ser = ProtobufSerializer(order_cls, env.sr, conf)
    env.produce([ser(proto_order(order_cls, i), ctx) for i in range(10)], 0)
    bad: dict[tuple[int, int], bytes] = {}
    for n, seconds in enumerate([253402300800, -62135596801]):  # 10000-01-01 and the second before 0001-01-01
        message = proto_order(order_cls, 10 + n)
        message.at.seconds = seconds
        bad[(0, 10 + n)] = ser(message, ctx)
    env.produce(list(bad.values()), 0)

    env.run()  # before: the run failed with "An exception was thrown from the Python worker" and nothing else

    de = ProtobufDeserializer(order_cls, {"use.deprecated.format": False})
    scanned = env.scan_with(lambda v: de(v, ctx), undecodable=bad)
    assert {k: scanned.pop(k) for k in bad} == bad
    names = [f.name for f in order_cls.DESCRIPTOR.fields]
    published = {
        k: {**{n: r[n] for n in names}, "tags": sorted(r["tags"]), "at": _utc(r["at"])}
        for k, r in env.published().items()
    }
    assert published == {k: _proto_as_published(m) for k, m in scanned.items()}
    quarantined = {(q["partition"], q["offset"]): q for q in env.quarantined()}
    assert {k: q["_raw_value"] for k, q in quarantined.items()} == bad
    assert {q["_reason"] for q in quarantined.values()} == {
        "decode_error: value field 'Order.at' is a google.protobuf.Timestamp outside years 1 to 9999, which Spark's "
        "timestamps cannot hold"
    }


NULLABLE_ENUM = {"type": "record", "name": "Parcel", "namespace": "plant", "fields": [
    {"name": "id", "type": "long"},
    {"name": "state", "type": ["null", {"type": "enum", "name": "State", "symbols": ["NEW", "SENT", "LOST"]}],
     "default": None},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["BOX", "BAG"]}},
]}  # fmt: skip


def test_a_flat_record_with_a_nullable_enum_is_staged_by_the_read_tasks_as_the_scan(staging_env: StagingEnv) -> None:
    env = staging_env
    write = env.serializer(NULLABLE_ENUM)
    states = [None, "NEW", "SENT", "LOST"]
    for partition in range(2):
        env.produce([write({"id": i, "state": states[i % 4], "kind": ["BOX", "BAG"][i % 2]}) for i in range(40)],
                    partition)  # fmt: skip

    env.run()

    assert env.job()["staged_by"] == "read_tasks"  # polars panicked on the enum in a union: Spark staged it
    published = {k: _comparable(r, NULLABLE_ENUM) for k, r in env.published().items()}
    assert published == env.scan(NULLABLE_ENUM) and len(published) == 80


def test_schema_changed_names_per_partition_each_writers_offsets_and_count_when_producers_switch_back_and_forth(
    env: RegistryEnv,
) -> None:
    from tests.integration.job.test_avro import ORDER_V1, ORDER_V2, order

    v1, v2 = env.serializer(ORDER_V1), env.serializer(ORDER_V2)
    # Partition 0: v1, v2, v1 again, v2 again (two producers in a rolling deploy); partition 1: v2 only.
    blocks = [(v1, range(0, 3)), (v2, range(3, 5)), (v1, range(5, 9)), (v2, range(9, 10))]
    env.produce([w(order(i, v2=w is v2)) for w, numbers in blocks for i in numbers], 0)
    env.produce([v2(order(i, v2=True)) for i in range(10, 13)], 1)
    v1_id = int.from_bytes(v1(order(0))[1:5], "big")
    v2_id = env.sr.get_latest_version(f"{env.topic}-value").schema_id

    env.run()

    changes = [e for e in env.report()["events"] if e["kind"] == "schema_changed"]
    assert [(e["topic"], e["partition"]) for e in changes] == [(env.topic, 0)]  # one event per partition
    (change,) = changes
    writers = [
        (w["schema_id"], w["first_offset"], w["last_offset"], w["records"]) for w in change["details"]["writers"]
    ]
    assert writers == [(v1_id, 0, 8, 7), (v2_id, 3, 9, 3)]
    assert change["details"]["interleaved"] is True
    assert f"id {v1_id} at offsets 0..8 (7 records), id {v2_id} at offsets 3..9 (3 records)" in change["message"]
    assert "switched back and forth" in change["message"]
