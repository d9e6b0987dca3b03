"""Every value as its schema says, or refused (issue 42): the shapes producers really send, end to end on the real
cluster and a real schema registry, each compared with the format's reference decoder reading the same bytes.

A schema change the format's own resolution rules do not allow fails the run at planning, naming the subject, the
versions and the field; a body the reference decoder does not read exactly (bytes left over or missing, a value
Spark's types cannot hold) is quarantined with its reason, on the read-task path and on Spark's path alike.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import env_of
from tests.integration.job.test_registry_formats import RegistryEnv

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> RegistryEnv:
    return env_of(RegistryEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _decimal_order(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": precision,
                                    "scale": scale}},
    ]}  # fmt: skip


def test_avro_decimal_read_at_another_scale_is_refused_naming_subject_versions_and_field(env: RegistryEnv) -> None:
    # decimal(10,2) read as decimal(12,4): Avro's rules resolve decimals only at equal precision and scale, and
    # from_avro would publish 3.34 as 0.0334.
    v1, v2 = env.serializer(_decimal_order(10, 2)), env.serializer(_decimal_order(12, 4))
    first = v1({"id": 1, "amount": Decimal("3.34")})
    env.produce([first, v1({"id": 2, "amount": Decimal("5.00")})], 0)
    env.produce([v2({"id": 3, "amount": Decimal("1.2345")})], 1)
    subject = f"{env.topic}-value"
    v1_id = int.from_bytes(first[1:5], "big")

    with pytest.raises(Exception, match="cannot be read with the reader schema") as info:
        env.run()

    env.assert_refused(
        info, f"{env.topic}[0] offset 0", f"schema id {v1_id} (version 1 of subject '{subject}')",
        f"subject '{subject}' version 2", "field 'Order.amount': written as decimal(10,2), read as decimal(12,4)",
    )  # fmt: skip


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
