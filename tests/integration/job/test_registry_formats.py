"""JSON Schema and Protobuf feeds end to end on the real cluster and a real schema registry (Apicurio).

Records are produced with confluent-kafka's own ``JSONSerializer`` and ``ProtobufSerializer``
through the registry. Each publishing test compares the feed's whole output with an
independent ``read_committed`` scan of the topic decoded by confluent-kafka's
``JSONDeserializer`` / ``ProtobufDeserializer``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import AvroEnv, env_of
from tests.integration.read_helpers import consume_independently, plan_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ORDER_JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order", "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"$ref": "#/definitions/Customer"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}}, "required": ["sku"]}},
        "tags": {"type": "object", "additionalProperties": {"type": "integer"}},
        "amount": {"type": "number"},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "status": {"enum": ["NEW", "PAID", "SHIPPED"]},
        "note": {"type": ["string", "null"]},
        "paid": {"type": "boolean"},
    },
    "required": ["id", "customer", "status"],
    "definitions": {"Customer": {"type": "object", "properties": {
        "id": {"type": "integer"}, "email": {"type": ["null", "string"]}}, "required": ["id"]}},
}  # fmt: skip


def json_order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": {"id": 1000 + i, "email": None if i % 3 == 0 else f"c{i}@example.com"},
        "items": [{"sku": f"sku-{j}", "qty": j} for j in range(i % 3)],
        "tags": {f"t{j}": j for j in range(i % 3)},
        "amount": i + 0.25,
        "day": (dt.date(2026, 1, 1) + dt.timedelta(days=i)).isoformat(),
        "at": (dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i, microseconds=i)).isoformat(),
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "note": None if i % 2 else f"n{i}",
        "paid": i % 2 == 0,
    }


class RegistryEnv(AvroEnv):
    def json_serializer(self, schema: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
        from confluent_kafka.schema_registry.json_schema import JSONSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        ser = JSONSerializer(json.dumps(schema), self.sr, conf={"auto.register.schemas": True})
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        return lambda doc: ser(doc, ctx)

    def scan_with(
        self, decode: Callable[[bytes], Any], undecodable: Collection[tuple[int, int]] = ()
    ) -> dict[tuple[int, int], Any]:
        """The oracle: every record of the topic read_committed by a plain consumer, decoded by ``decode`` (except
        those at ``undecodable``, given as their raw bytes)."""
        plan = plan_for(self.kafka.adapter, [self.topic])
        records = consume_independently(self.kafka.connection, plan)
        return {(p, o): v if (p, o) in undecodable else decode(v) for (_, p, o, _, v) in records}

    def assert_refused(self, error: pytest.ExceptionInfo[Exception], *says: str) -> None:
        """The run failed saying each of ``says``, with nothing published and the group not moved."""
        assert [part for part in says if part not in str(error.value)] == [], str(error.value)
        assert not list(self.output.glob("plan_id=*"))
        assert self.committed() == {0: None, 1: None}

    def json_scan(self, undecodable: Collection[tuple[int, int]] = ()) -> dict[tuple[int, int], Any]:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        de = JSONDeserializer(None, schema_registry_client=self.sr)
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        return self.scan_with(lambda v: de(v, ctx), undecodable)


@pytest.fixture
def env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> RegistryEnv:
    return env_of(RegistryEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _utc(value: Any) -> dt.datetime:
    value = value.to_pydatetime() if hasattr(value, "to_pydatetime") else value
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _json_as_published(doc: dict[str, Any]) -> dict[str, Any]:
    """An oracle record as Parquet hands it back: typed dates and timestamps, maps as (key, value) pairs."""
    return {
        **doc,
        "items": [{"sku": it["sku"], "qty": it.get("qty")} for it in doc["items"]],
        "tags": sorted(doc["tags"].items()),
        "day": dt.date.fromisoformat(doc["day"]),
        "at": dt.datetime.fromisoformat(doc["at"]),
    }


def test_json_schema_feed_publishes_the_scan_typed_and_quarantines_bad_bodies(env: RegistryEnv) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    env.write_feed(format="json_schema")
    ser = env.json_serializer(ORDER_JSON_SCHEMA)
    for partition in range(2):
        env.produce([ser(json_order(i)) for i in range(partition, 20, 2)], partition)
    prefix = ser(json_order(99))[:5]  # a registered id; bodies the serializer would have refused
    bad = {
        (1, 10): prefix + b"{not json",
        (1, 11): prefix + b'{"id": "seven", "customer": {"id": 1}, "status": "NEW"}',  # a string for an integer
        (1, 12): prefix + b'{"id": 7, "customer": {"email": "x@example.com"}, "status": "NEW"}',  # nested required
        (1, 13): prefix + b'{"id": 7, "customer": {"id": 1}, "status": "LOST"}',  # not one of the enum's values
    }
    env.produce(list(bad.values()), 1)

    env.run()

    scanned = env.json_scan(undecodable=bad)
    assert {k: scanned.pop(k) for k in bad} == bad
    expected = {k: _json_as_published(v) for k, v in scanned.items()}
    names = list(ORDER_JSON_SCHEMA["properties"])
    published = {
        k: {**{n: r[n] for n in names}, "tags": sorted(r["tags"]), "at": _utc(r["at"])}
        for k, r in env.published().items()
    }
    assert published == expected and len(published) == 20

    schema = pq.read_schema(next(iter(env.output.glob("plan_id=*/topic=*/date=*/*.parquet"))))
    assert schema.field("customer").type == pa.struct([("id", pa.int64()), ("email", pa.string())])
    assert schema.field("items").type == pa.list_(
        pa.field("element", pa.struct([("sku", pa.string()), ("qty", pa.int64())]))
    )
    assert schema.field("tags").type == pa.map_(pa.string(), pa.int64())
    assert (schema.field("id").type, schema.field("amount").type) == (pa.int64(), pa.float64())
    assert schema.field("day").type == pa.date32() and pa.types.is_timestamp(schema.field("at").type)
    assert (schema.field("status").type, schema.field("paid").type) == (pa.string(), pa.bool_())

    quarantined = {(q["partition"], q["offset"]): q for q in env.quarantined()}
    assert {k: q["_raw_value"] for k, q in quarantined.items()} == bad
    assert {k: q["_reason"] for k, q in quarantined.items()} == {
        (1, 10): "decode_error: value is not JSON (RFC 8259, as json.loads reads it)",
        (1, 11): "decode_error: value field 'id' breaks the reader JSON Schema: 'type': \"integer\"",
        (1, 12): "decode_error: value field 'customer.id' is missing, and the reader JSON Schema requires it",
        (1, 13): "decode_error: value field 'status' breaks the reader JSON Schema: 'enum': [\"NEW\", \"PAID\", "
        '"SHIPPED"]',
    }
    report = env.report()
    writer_id = int.from_bytes(prefix[1:5], "big")
    assert report["status"] == "succeeded" and report["schemas"]["format"] == "json_schema"
    assert report["schemas"]["reader"] == {"subject": f"{env.topic}-value", "version": 1, "id": writer_id}
    assert env.committed() == {0: 10, 1: 14}


# What goes before a JSON body, and what the failed run must say.
REFUSED = {
    "unknown_id": (
        b"\x00" + (2_000_000_000).to_bytes(4, "big"),
        "schema id 2000000000 is unknown to the schema registry",
    ),
    "not_framed": (b"", "not in the Schema Registry wire format"),
}


@pytest.mark.parametrize(
    ("fmt", "case"), [("json_schema", "unknown_id"), ("json_schema", "not_framed"), ("protobuf", "unknown_id")]
)
def test_unknown_id_or_other_framing_fails_the_run_with_nothing_committed(
    env: RegistryEnv, fmt: str, case: str
) -> None:
    env.write_feed(format=fmt)
    if fmt == "json_schema":
        ser = env.json_serializer(ORDER_JSON_SCHEMA)
        env.produce([ser(json_order(i)) for i in range(3)], 0)
    else:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        order_cls, _ = _order_classes()
        proto = ProtobufSerializer(order_cls, env.sr, {"use.deprecated.format": False})
        ctx = SerializationContext(env.topic, MessageField.VALUE)
        env.produce([proto(proto_order(order_cls, i), ctx) for i in range(3)], 0)
    prefix, says = REFUSED[case]
    env.produce([prefix + b'{"id": 4}'], 1)

    with pytest.raises(Exception, match=says) as info:  # the job's error, as the run raises it
        env.run()

    env.assert_refused(info, f"{env.topic}[1] offset 0", "nothing was published or committed")


def _order_classes(amount: str = "double") -> tuple[Any, Any]:
    """``shop.Order`` (importing ``shop.Customer`` from its own file, and the well-known Timestamp) and
    ``shop.Order.Line``, built at run time from descriptors, as a producer's generated code would hold them;
    ``amount``: the type of field 5."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    field = descriptor_pb2.FieldDescriptorProto
    one, many = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    customer = descriptor_pb2.FileDescriptorProto(name="shop/customer.proto", package="shop", syntax="proto3")
    c = customer.message_type.add(name="Customer")
    c.field.add(name="id", number=1, type=field.TYPE_INT64, label=one)
    c.field.add(name="email", number=2, type=field.TYPE_STRING, label=one, proto3_optional=True, oneof_index=0)
    c.oneof_decl.add(name="_email")
    order = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto", package="shop", syntax="proto3",
        dependency=["shop/customer.proto", "google/protobuf/timestamp.proto"],
    )  # fmt: skip
    status = order.enum_type.add(name="Status")
    for n, name in enumerate(["NEW", "PAID", "SHIPPED"]):
        status.value.add(name=name, number=n)
    o = order.message_type.add(name="Order")
    o.field.add(name="id", number=1, type=field.TYPE_INT32, label=one)
    o.field.add(name="customer", number=2, type=field.TYPE_MESSAGE, type_name=".shop.Customer", label=one)
    o.field.add(name="items", number=3, type=field.TYPE_STRING, label=many)
    o.field.add(name="tags", number=4, type=field.TYPE_MESSAGE, type_name=".shop.Order.TagsEntry", label=many)
    o.field.add(name="amount", number=5, type=getattr(field, "TYPE_" + amount.upper()), label=one)
    o.field.add(name="at", number=6, type=field.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=one)
    o.field.add(name="status", number=7, type=field.TYPE_ENUM, type_name=".shop.Status", label=one)
    o.field.add(name="lines", number=8, type=field.TYPE_MESSAGE, type_name=".shop.Order.Line", label=many)
    entry = o.nested_type.add(name="TagsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=one)
    entry.field.add(name="value", number=2, type=field.TYPE_INT32, label=one)
    line = o.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=field.TYPE_STRING, label=one)
    line.field.add(name="qty", number=2, type=field.TYPE_INT64, label=one)
    pool = descriptor_pool.DescriptorPool()
    for proto in (
        descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb),
        customer,
        order,
    ):
        pool.Add(proto)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("shop.Order")), get(pool.FindMessageTypeByName("shop.Order.Line"))


def proto_order(cls: Any, i: int) -> Any:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i, microseconds=i)
    msg = cls(id=i, items=[f"sku-{j}" for j in range(i % 4)], tags={f"t{j}": j for j in range(i % 3)},
              amount=i + 0.5, at=at, status=i % 3)  # fmt: skip
    if i % 5:  # every fifth order has no customer (an unset message reads null)
        msg.customer.id = 1000 + i
        if i % 3:
            msg.customer.email = f"c{i}@example.com"
    for j in range(i % 2):
        msg.lines.add(sku=f"sku-{j}", qty=j + 1)
    return msg


def _proto_as_published(m: Any) -> dict[str, Any]:
    """An oracle message as the published row should hold it, read off the message's own accessors."""
    customer = None
    if m.HasField("customer"):
        customer = {"id": m.customer.id, "email": m.customer.email if m.customer.HasField("email") else None}
    return {
        "id": m.id, "customer": customer, "items": list(m.items), "tags": sorted(m.tags.items()),
        "amount": m.amount, "at": m.at.ToDatetime(tzinfo=dt.UTC),
        "status": m.DESCRIPTOR.fields_by_name["status"].enum_type.values_by_number[m.status].name,
        "lines": [{"sku": x.sku, "qty": x.qty} for x in m.lines],
    }  # fmt: skip


def test_protobuf_feed_publishes_the_scan_typed_and_quarantines_bad_bodies(env: RegistryEnv) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    env.write_feed(format="protobuf")
    order_cls, line_cls = _order_classes()
    ctx = SerializationContext(env.topic, MessageField.VALUE)
    conf = {"auto.register.schemas": True, "use.deprecated.format": False}
    ser = ProtobufSerializer(order_cls, env.sr, conf)
    for partition in range(2):
        env.produce([ser(proto_order(order_cls, i), ctx) for i in range(partition, 20, 2)], partition)
    good = ser(proto_order(order_cls, 99), ctx)
    # The serializer registered shop/customer.proto under its own subject: the reader schema references it.
    (reference,) = env.sr.get_latest_version(f"{env.topic}-value").schema.references
    assert reference.name == "shop/customer.proto"
    assert good[5] == 0  # the first message's index, in the serializers' short form
    # A nested message of the same file, framed by its own serializer: indexes [0, 1], not the reader's message.
    line = ProtobufSerializer(line_cls, env.sr, conf)  # registers the same file: the same id
    bad = {(1, 10): good[:6] + b"\xff\xff\xff", (1, 11): line(line_cls(sku="x", qty=2), ctx)}
    assert bad[(1, 11)][:5] == good[:5] and bad[(1, 11)][5:8] == b"\x04\x00\x02"
    env.produce(list(bad.values()), 1)

    env.run()

    de = ProtobufDeserializer(order_cls, {"use.deprecated.format": False})
    scanned = env.scan_with(lambda v: de(v, ctx), undecodable=bad)
    assert {k: scanned.pop(k) for k in bad} == bad
    expected = {k: _proto_as_published(m) for k, m in scanned.items()}
    names = [f.name for f in order_cls.DESCRIPTOR.fields]
    published = {
        k: {**{n: r[n] for n in names}, "tags": sorted(r["tags"]), "at": _utc(r["at"])}
        for k, r in env.published().items()
    }
    assert published == expected and len(published) == 20
    assert sum(r["customer"] is None for r in published.values()) == 4

    schema = pq.read_schema(next(iter(env.output.glob("plan_id=*/topic=*/date=*/*.parquet"))))
    assert schema.field("customer").type == pa.struct([("id", pa.int64()), ("email", pa.string())])
    assert schema.field("items").type == pa.list_(pa.field("element", pa.string()))
    assert schema.field("tags").type == pa.map_(pa.string(), pa.int32())
    assert schema.field("lines").type == pa.list_(
        pa.field("element", pa.struct([("sku", pa.string()), ("qty", pa.int64())]))
    )
    assert (schema.field("id").type, schema.field("amount").type) == (pa.int32(), pa.float64())
    assert pa.types.is_timestamp(schema.field("at").type) and schema.field("status").type == pa.string()

    quarantined = {(q["partition"], q["offset"]): q for q in env.quarantined()}
    assert {k: q["_raw_value"] for k, q in quarantined.items()} == bad
    assert {q["_reason"] for q in quarantined.values()} == {
        "decode_error: value does not decode as the Protobuf message of its writer schema"
    }
    report = env.report()
    writer_id = int.from_bytes(good[1:5], "big")
    assert report["status"] == "succeeded" and report["schemas"]["format"] == "protobuf"
    reader = {"subject": f"{env.topic}-value", "version": 1, "id": writer_id, "message": "shop.Order"}
    assert report["schemas"]["reader"] == reader and report["schemas"]["writer_ids"] == [writer_id]
    assert env.committed() == {0: 10, 1: 12}


def test_protobuf_field_number_retyped_fails_before_publishing_naming_offset_ids_and_field(env: RegistryEnv) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    env.write_feed(format="protobuf")
    ctx = SerializationContext(env.topic, MessageField.VALUE)
    conf = {"auto.register.schemas": True, "use.deprecated.format": False}
    (v1_cls, _), (v2_cls, _) = _order_classes(), _order_classes(amount="string")
    v1, v2 = ProtobufSerializer(v1_cls, env.sr, conf), ProtobufSerializer(v2_cls, env.sr, conf)
    first = v1(proto_order(v1_cls, 0), ctx)
    env.produce([first] + [v1(proto_order(v1_cls, i), ctx) for i in range(1, 4)], 0)
    # v2 reuses number 5 for a string: read with v2, a v1 record's double would silently become "".
    retyped = v2_cls(id=4, amount="4.50")
    env.produce([v2(retyped, ctx)], 0)
    latest = env.sr.get_latest_version(f"{env.topic}-value").schema_id
    v1_id = int.from_bytes(first[1:5], "big")
    assert latest != v1_id

    with pytest.raises(Exception, match="cannot be read with the reader schema") as info:
        env.run()

    env.assert_refused(
        info, f"{env.topic}[0] offset 0", f"schema id {v1_id}", f"reader schema id {latest}",
        "field 'Order.amount' (number 5) is double in the writer and string in the reader",
    )  # fmt: skip
