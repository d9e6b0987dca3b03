"""Keys in the Schema Registry formats end to end on the real cluster and a real schema registry (Apicurio).

Keys are produced with confluent-kafka's own serializers (Avro, JSON Schema, Protobuf) under the key's subject
(``<topic>-key``); each publishing test compares the feed's whole output, keys included,
with an independent ``read_committed`` scan decoded by confluent-kafka's deserializers,
and the run's range statistics with the same statistics over the scan's raw bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import ORDER_V1, _as_published, _published_value, env_of, order
from tests.integration.job.test_registry_formats import RegistryEnv
from tests.integration.read_helpers import consume_independently, plan_for
from tidemark.kafka.admin import Record

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ORDER_KEY = {
    "type": "record", "name": "OrderKey", "namespace": "shop",
    "fields": [
        {"name": "region", "type": "string"},
        {"name": "id", "type": "long"},
        {"name": "shard", "type": ["null", "int"], "default": None},
    ],
}  # fmt: skip
ORDER_KEY_JSON = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "OrderKey", "type": "object",
    "properties": {"region": {"enum": ["eu", "us"]}, "id": {"type": "integer"}},
    "required": ["id"],
}  # fmt: skip


def order_key(i: int) -> dict[str, Any]:
    return {"region": ["eu", "us"][i % 2], "id": 10_000 + i, "shard": None if i % 3 == 0 else i % 4}


class KeyEnv(RegistryEnv):
    def key_serializer(self, kind: str, schema: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
        """confluent-kafka's serializer of ``kind`` for keys: it registers ``schema`` under ``<topic>-key``."""
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.schema_registry.json_schema import JSONSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        conf = {"auto.register.schemas": True}
        if kind == "avro":
            ser: Any = AvroSerializer(self.sr, json.dumps(schema), conf=conf)
        else:
            ser = JSONSerializer(json.dumps(schema), self.sr, conf=conf)
        ctx = SerializationContext(self.topic, MessageField.KEY)
        return lambda doc: ser(doc, ctx)

    def produce_keyed(self, records: Sequence[tuple[bytes, bytes]], partition: int) -> None:
        self.kafka.produce(self.topic, [Record(key=k, value=v, partition=partition) for k, v in records])

    def raw_scan(self) -> list[tuple[Any, ...]]:
        """The oracle's records, read_committed by a plain consumer: (topic, partition, offset, key, value)."""
        return consume_independently(self.kafka.connection, plan_for(self.kafka.adapter, [self.topic]))

    def scan_stats(self, records: list[tuple[Any, ...]]) -> dict[int, tuple[int, str]]:
        """Per partition, the bytes and checksum of the scan's raw keys and values, by the statistics' own rule."""
        from pyspark.sql import types as T

        from tidemark.spark.stats import range_stats

        schema = T.StructType([
            T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()), T.StructField("key", T.BinaryType()),
            T.StructField("value", T.BinaryType()), T.StructField("timestamp", T.TimestampType()),
        ])  # fmt: skip
        df = self.spark.createDataFrame([(*r, None) for r in records], schema)
        return {s.partition: (s.bytes, s.checksum) for s in range_stats(df, plan_for(self.kafka.adapter, [self.topic]))}


@pytest.fixture
def env(kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> KeyEnv:
    return env_of(KeyEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _deserializer(env: KeyEnv, kind: str, field: str, schema: dict[str, Any]) -> Callable[[bytes], Any]:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ctx = SerializationContext(env.topic, MessageField.KEY if field == "key" else MessageField.VALUE)
    if kind == "avro":
        de: Any = AvroDeserializer(env.sr, json.dumps(schema))
    else:
        de = JSONDeserializer(None, schema_registry_client=env.sr)
    return lambda raw: de(raw, ctx)


def test_avro_keyed_feed_publishes_the_scan_with_decoded_keys_and_quarantines_a_bad_key(env: KeyEnv) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    env.write_feed(key_format="avro")
    key, value = env.key_serializer("avro", ORDER_KEY), env.serializer(ORDER_V1)
    sent: dict[tuple[int, int], dict[str, Any]] = {}
    for partition in range(2):
        ids = range(partition, 20, 2)
        env.produce_keyed([(key(order_key(i)), value(order(i))) for i in ids], partition)
        sent |= {(partition, n): order_key(i) for n, i in enumerate(ids)}
    known = key(order_key(99))
    bad_key = known[:5] + b"\xff\xff\xff\xff\xff"  # the key's registered id, a body that does not decode
    env.produce_keyed([(bad_key, value(order(50)))], 1)

    _, job, _ = env.run()

    raw = env.raw_scan()
    key_of, value_of = _deserializer(env, "avro", "key", ORDER_KEY), _deserializer(env, "avro", "value", ORDER_V1)
    scanned = {(p, o): (key_of(k), value_of(v)) for (_, p, o, k, v) in raw if (p, o) != (1, 10)}
    published = env.published()
    assert {k: r["key"] for k, r in published.items()} == {k: kv[0] for k, kv in scanned.items()} == sent
    names = [f["name"] for f in ORDER_V1["fields"]]
    assert {k: _published_value(r, names) for k, r in published.items()} == {
        k: _as_published(kv[1]) for k, kv in scanned.items()
    }
    schema = pq.read_schema(next(iter(env.output.glob("plan_id=*/topic=*/date=*/*.parquet"))))
    assert schema.field("key").type == pa.struct([("region", pa.string()), ("id", pa.int64()), ("shard", pa.int32())])
    # Nor what the job staged beside the records: raw bytes, their digests, the wire-format headers.
    assert {"_raw_key", "_raw_value", "value", "_row_hash", "_row_bytes", "_key_head", "_value_head"}.isdisjoint(
        schema.names
    )

    (quarantined,) = env.quarantined()
    assert (quarantined["partition"], quarantined["offset"]) == (1, 10)
    assert quarantined["_reason"] == "decode_error: key does not decode against its Avro writer schema"
    assert quarantined["_raw_key"] == bad_key
    # The range statistics count and hash the bytes Kafka holds, not the decoded key.
    assert {r["partition"]: (r["bytes"], r["checksum"]) for r in job["ranges"]} == env.scan_stats(raw)
    report = env.report()
    key_id = int.from_bytes(known[1:5], "big")
    assert report["status"] == "succeeded" and report["schemas"]["key"]["format"] == "avro"
    assert report["schemas"]["key"]["reader"] == {"subject": f"{env.topic}-key", "version": 1, "id": key_id}
    assert report["schemas"]["key"]["writer_ids"] == [key_id]
    assert report["schemas"]["reader"]["subject"] == f"{env.topic}-value"
    assert env.committed() == {0: 10, 1: 11}


def test_json_schema_keyed_feed_publishes_the_scan_and_quarantines_a_key_breaking_its_schema(env: KeyEnv) -> None:
    env.write_feed(format="string", key_format="json_schema")
    key = env.key_serializer("json_schema", ORDER_KEY_JSON)
    for partition in range(2):
        ids = range(partition, 8, 2)
        env.produce_keyed([(key({"region": "eu", "id": i}), f"v{i}".encode()) for i in ids], partition)
    prefix = key({"region": "us", "id": 99})[:5]
    bad = {(0, 4): prefix + b'{"region": "eu"}', (1, 4): prefix + b'{"region": "mars", "id": 3}'}
    env.produce_keyed([(bad[(0, 4)], b"v-bad0")], 0)
    env.produce_keyed([(bad[(1, 4)], b"v-bad1")], 1)

    _, job, _ = env.run()

    raw = env.raw_scan()
    key_of = _deserializer(env, "json_schema", "key", ORDER_KEY_JSON)
    expected = {(p, o): (key_of(k), v.decode()) for (_, p, o, k, v) in raw if (p, o) not in bad}
    published = {k: (r["key"], r["value"]) for k, r in env.published().items()}
    assert published == expected and len(published) == 8
    quarantined = {(q["partition"], q["offset"]): q for q in env.quarantined()}
    assert {k: q["_raw_key"] for k, q in quarantined.items()} == bad
    assert {k: q["_reason"] for k, q in quarantined.items()} == {
        (0, 4): "decode_error: key field 'id' is missing, and the reader JSON Schema requires it",
        (1, 4): "decode_error: key field 'region' breaks the reader JSON Schema: 'enum': [\"eu\", \"us\"]",
    }
    assert {r["partition"]: (r["bytes"], r["checksum"]) for r in job["ranges"]} == env.scan_stats(raw)
    assert env.report()["schemas"]["key"]["reader"]["subject"] == f"{env.topic}-key"
    assert env.committed() == {0: 5, 1: 5}


def _proto_key_class() -> Any:
    """``shop.OrderKey`` (a region enum and an id), built at run time from its descriptor as generated code holds it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="shop/order_key.proto", package="shop", syntax="proto3")
    region = file.enum_type.add(name="Region")
    for n, name in enumerate(["EU", "US"]):
        region.value.add(name=name, number=n)
    key = file.message_type.add(name="OrderKey")
    key.field.add(name="region", number=1, type=field.TYPE_ENUM, type_name=".shop.Region", label=field.LABEL_OPTIONAL)
    key.field.add(name="id", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.OrderKey"))


def test_protobuf_keyed_feed_publishes_the_scan_and_quarantines_a_key_that_does_not_parse(env: KeyEnv) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    env.write_feed(format="string", key_format="protobuf")
    key_cls = _proto_key_class()
    ctx = SerializationContext(env.topic, MessageField.KEY)
    ser = ProtobufSerializer(key_cls, env.sr, {"auto.register.schemas": True, "use.deprecated.format": False})
    for partition in range(2):
        ids = range(partition, 8, 2)
        env.produce_keyed([(ser(key_cls(region=i % 2, id=i), ctx), f"v{i}".encode()) for i in ids], partition)
    bad_key = ser(key_cls(id=99), ctx)[:6] + b"\xff\xff\xff"  # the key's id and message index, a broken body
    env.produce_keyed([(bad_key, b"v-bad")], 1)

    _, job, _ = env.run()

    raw = env.raw_scan()
    de = ProtobufDeserializer(key_cls, {"use.deprecated.format": False})
    region = key_cls.DESCRIPTOR.fields_by_name["region"].enum_type.values_by_number
    expected = {
        (p, o): ({"region": region[m.region].name, "id": m.id}, v.decode())
        for (_, p, o, k, v) in raw if (p, o) != (1, 4) for m in [de(k, ctx)]
    }  # fmt: skip
    published = {k: (r["key"], r["value"]) for k, r in env.published().items()}
    assert published == expected and len(published) == 8
    schema = pq.read_schema(next(iter(env.output.glob("plan_id=*/topic=*/date=*/*.parquet"))))
    assert schema.field("key").type == pa.struct([("region", pa.string()), ("id", pa.int64())])
    (quarantined,) = env.quarantined()
    assert (quarantined["partition"], quarantined["offset"], quarantined["_raw_key"]) == (1, 4, bad_key)
    assert quarantined["_reason"] == "decode_error: key does not decode as the Protobuf message of its writer schema"
    assert {r["partition"]: (r["bytes"], r["checksum"]) for r in job["ranges"]} == env.scan_stats(raw)
    assert env.report()["schemas"]["key"]["reader"]["message"] == "shop.OrderKey"
    assert env.committed() == {0: 4, 1: 5}


def test_a_field_added_to_an_iceberg_feeds_key_is_added_to_the_key_struct_in_the_datas_snapshot(env: KeyEnv) -> None:
    import uuid

    from tidemark.output.iceberg import plan_history

    env.write_feed(format="string", key_format="avro", iceberg=f"lake.keyed_{uuid.uuid4().hex[:8]}")
    key_v1 = env.key_serializer("avro", ORDER_KEY)
    env.produce_keyed([(key_v1(order_key(i)), b"v") for i in range(3)], 0)
    env.run()
    # The key schema gains a field with a default; run 2 holds v1 and v2 keys.
    key_v2_schema = {
        **ORDER_KEY,
        "fields": [*ORDER_KEY["fields"], {"name": "tier", "type": "string", "default": "std"}],
    }
    key_v2 = env.key_serializer("avro", key_v2_schema)
    env.produce_keyed([(key_v1(order_key(3)), b"v"), (key_v2({**order_key(4), "tier": "gold"}), b"v")], 0)
    env.run()

    table = env.iceberg_table()
    assert str(table.schema().find_field("key.tier").field_type) == "string"
    first, second = reversed(plan_history(table))
    assert "key.tier" not in table.schemas()[first.schema_id].column_names
    assert second.schema_id == table.schema().schema_id  # the new key field arrived with the data that has it
    keys = {r["offset"]: r["key"] for r in table.scan().to_arrow().to_pylist()}
    key_of = _deserializer(env, "avro", "key", key_v2_schema)
    expected = {o: key_of(k) for (_, p, o, k, _) in env.raw_scan() if p == 0}
    # Run 1's rows predate the field: Iceberg reads it as null there; run 2 resolved its v1 key to the default.
    assert keys == {o: {**k, "tier": None} if o < 3 else k for o, k in expected.items()}
    assert keys[3]["tier"] == "std" and env.committed() == {0: 5, 1: 0}


def test_unknown_key_schema_id_fails_the_run_with_nothing_committed(env: KeyEnv) -> None:
    env.write_feed(format="string", key_format="avro")
    key = env.key_serializer("avro", ORDER_KEY)
    env.produce_keyed([(key(order_key(i)), b"v") for i in range(3)], 0)
    env.produce_keyed([(b"\x00" + (2_000_000_000).to_bytes(4, "big") + b"\x02eu", b"v")], 1)

    with pytest.raises(Exception, match="schema id 2000000000 is unknown to the schema registry") as info:
        env.run()

    env.assert_refused(info, f"{env.topic}[1] offset 0", "in their key", "nothing was published or committed")
