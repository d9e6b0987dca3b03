"""Publishing re-drives of JSON Schema and Protobuf feeds on the real cluster and a real schema registry.

JSON Schema: the feed pins version 1 of its subject (``amount`` at most 100) while the
producer writes with version 2 (at most 1000); the records over 100 are dead letters. The
fix pins version 2: the re-drive decodes the dead letters' raw bytes with their writer ids
resolved against that *current* reader and publishes the ones it now takes. Protobuf: two
writer versions (version 2 adds a field) and a rule refusing ``amount`` over 100; the fix
relaxes the rule. In both, the re-drive's output must equal an independent
``read_committed`` scan of the topic decoded and classified in the test (``jsonschema``
under version 2; the ``protobuf`` library with version 2's message class and the fixed
rule), a record the fix does not help keeps its new reason, and a second re-drive publishes
nothing. A dead letter whose writer id the registry does not have stays with a reason
naming that id, beside one that passes: one bad writer never fails the re-drive.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import env_of
from tests.integration.job.test_registry_formats import RegistryEnv
from tests.integration.runs.test_redrive_avro import published_keys, redriven_output
from tidemark.config.models import load_feed
from tidemark.job.redrive import recheck
from tidemark.kafka.registry import RegistryConnection
from tidemark.output.deadletters import DeadLetter, dead_letters
from tidemark.runs.redrive import redrive_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ORDER_V1 = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {"id": {"type": "integer"}, "amount": {"type": "integer", "maximum": 100},
                   "note": {"type": ["string", "null"]}},
    "required": ["id", "amount"],
}  # fmt: skip
ORDER_V2 = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "amount": {"type": "integer", "maximum": 1000}}}
RULE = {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0, "max_value": 100}}
FIXED = {"type": "expect_column_values_to_be_between",
         "kwargs": {"column": "amount", "min_value": 0, "max_value": 1000}}  # fmt: skip
UNKNOWN_ID = 987_654_321  # no registry of these tests hands out such an id


@pytest.fixture
def env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> RegistryEnv:
    return env_of(RegistryEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _register_json(env: RegistryEnv, doc: dict[str, Any]) -> int:
    from confluent_kafka.schema_registry import Schema

    return int(env.sr.register_schema(f"{env.topic}-value", Schema(json.dumps(doc), "JSON")))


def _framed(sid: int, body: bytes) -> bytes:
    return b"\x00" + sid.to_bytes(4, "big") + body


def _valid(doc: dict[str, Any], schema: dict[str, Any]) -> bool:
    import jsonschema

    return bool(jsonschema.Draft7Validator(schema).is_valid(doc))


def test_a_json_schema_feeds_dead_letters_are_redriven_with_the_current_reader_once(env: RegistryEnv) -> None:
    _register_json(env, ORDER_V1)
    v2 = _register_json(env, ORDER_V2)
    env.write_feed(format="json_schema", schema_version=1)
    for partition in range(2):  # bodies written raw: version 2's serializer would refuse 5000 itself
        docs = [{"id": i, "amount": i * 5, "note": f"n{i}"} for i in range(partition, 12, 2)]
        docs += [{"id": 100 + partition, "amount": 500 + partition, "note": None}]
        env.produce([_framed(v2, json.dumps(d).encode()) for d in docs], partition)
    env.produce([_framed(v2, b'{"id": 7, "amount": 5000}')], 1)  # over version 2's maximum too
    env.run()

    assert {(d.partition, d.offset) for d in dead_letters(load_feed("orders"))} == {(0, 6), (1, 6), (1, 7)}
    first_good = published_keys(env)
    assert len(first_good) == 12

    env.write_feed(format="json_schema", schema_version=2)  # the fix: the reader is version 2 now
    first = redrive_feed(env.spark, "orders", root=env.root)
    assert (first.state, first.published, first.passing) == ("shown", 2, 2)

    # The oracle: every record of the topic, its body parsed and checked by jsonschema itself under each version.
    scanned = {k: json.loads(v[5:]) for k, v in env.scan_with(lambda v: v).items()}
    assert all(int.from_bytes(v[1:5], "big") == v2 for v in env.scan_with(lambda v: v).values())
    want = {k: d for k, d in scanned.items() if _valid(d, ORDER_V2) and not _valid(d, ORDER_V1)}
    assert sorted(want) == [(0, 6), (1, 6)]
    names = list(ORDER_V2["properties"])
    assert {k: {n: r[n] for n in names} for k, r in redriven_output(env).items()} == {
        k: {n: d.get(n) for n in names} for k, d in want.items()
    }
    assert sorted(published_keys(env)) == sorted([*first_good, *want])  # each once, beside the run's own

    (left,) = dead_letters(load_feed("orders"))
    assert (left.partition, left.offset, left.reason_codes, left.rechecked_by) == (1, 7, ("decode_error",),
                                                                                   first.run_id)  # fmt: skip
    (kept,) = [v for v in first.verdicts if not v.passes]
    assert "amount" in kept.reason and "maximum" in kept.reason, kept.reason

    second = redrive_feed(env.spark, "orders", root=env.root)
    assert (second.state, second.published, second.passing) == ("shown", 0, 0)
    assert sorted(published_keys(env)) == sorted([*first_good, *want])


def _order_classes() -> tuple[Any, Any]:
    """``shop.Order`` as versions 1 and 2 of a producer's file: version 2 adds ``note`` (field 3)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    classes = []
    for version in (1, 2):
        proto = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
        o = proto.message_type.add(name="Order")
        o.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
        o.field.add(name="amount", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
        if version == 2:
            o.field.add(name="note", number=3, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(proto)
        classes.append(message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order")))
    return classes[0], classes[1]


def test_a_protobuf_feeds_dead_letters_are_redriven_once_the_rule_is_fixed(env: RegistryEnv) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf.message import DecodeError

    v1_cls, v2_cls = _order_classes()
    ctx = SerializationContext(env.topic, MessageField.VALUE)
    conf = {"auto.register.schemas": True, "use.deprecated.format": False}
    v1, v2 = ProtobufSerializer(v1_cls, env.sr, conf), ProtobufSerializer(v2_cls, env.sr, conf)
    env.produce([v1(v1_cls(id=i, amount=i * 5), ctx) for i in range(6)] + [v1(v1_cls(id=50, amount=500), ctx)], 0)
    written = [v2(v2_cls(id=i, amount=i * 5, note=f"n{i}"), ctx) for i in range(6, 12)]
    written.append(v2(v2_cls(id=51, amount=700, note="late"), ctx))
    corrupt = written[0][:6] + b"\xff\xff\xff"  # a known writer id and index, a body that does not decode
    env.produce([*written, corrupt], 1)
    env.write_feed([RULE], format="protobuf")  # the reader: the subject's latest, version 2
    env.run()

    assert {(d.partition, d.offset) for d in dead_letters(load_feed("orders"))} == {(0, 6), (1, 6), (1, 7)}
    first_good = published_keys(env)
    assert len(first_good) == 12

    env.write_feed([FIXED], format="protobuf")  # the fix: the rule takes amounts up to 1000
    first = redrive_feed(env.spark, "orders", root=env.root)
    assert (first.state, first.published, first.passing) == ("shown", 2, 2)

    # The oracle: every record decoded by the protobuf library with version 2's class, classified by the rules.
    def decoded(raw: bytes) -> dict[str, Any] | None:
        assert raw[5] == 0  # the first message, in the serializers' short form of the indexes
        try:
            m = v2_cls.FromString(raw[6:])
        except DecodeError:
            return None
        return {"id": m.id, "amount": m.amount}

    scanned = env.scan_with(decoded)
    assert [k for k, d in scanned.items() if d is None] == [(1, 7)]
    want = {k: d for k, d in scanned.items() if d is not None and 100 < d["amount"] <= 1000}
    assert sorted(want) == [(0, 6), (1, 6)]
    assert {k: {n: r[n] for n in ("id", "amount")} for k, r in redriven_output(env).items()} == {
        k: {n: d[n] for n in ("id", "amount")} for k, d in want.items()
    }
    assert redriven_output(env)[(1, 6)]["note"] == "late"
    assert sorted(published_keys(env)) == sorted([*first_good, *want])

    (left,) = dead_letters(load_feed("orders"))
    assert (left.partition, left.offset, left.reason_codes, left.rechecked_by) == (1, 7, ("decode_error",),
                                                                                   first.run_id)  # fmt: skip
    assert left.value == corrupt

    second = redrive_feed(env.spark, "orders", root=env.root)
    assert (second.state, second.published, second.passing) == ("shown", 0, 0)
    assert sorted(published_keys(env)) == sorted([*first_good, *want])


def _letter(env: RegistryEnv, offset: int, value: bytes) -> DeadLetter:
    return DeadLetter(topic=env.topic, partition=0, offset=offset, timestamp=datetime(2026, 1, 1, tzinfo=UTC),
                      key=b"k", value=value, headers=(), plan_id="p", run_id="r", reason_codes=("decode_error",),
                      reason="decode_error: earlier")  # fmt: skip


def _protobuf_framed(env: RegistryEnv, cls: Any, message: Any) -> bytes:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = ProtobufSerializer(cls, env.sr, {"auto.register.schemas": True, "use.deprecated.format": False})
    return bytes(ser(message, SerializationContext(env.topic, MessageField.VALUE)))


def _retyped_class() -> Any:
    """``shop.Order`` with field 2 (``amount``) a string: a reader of an int64 there cannot read it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
    o = proto.message_type.add(name="Order")
    o.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    o.field.add(name="amount", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


@pytest.mark.parametrize(
    ("fmt", "writer", "says"),
    [("json_schema", "unknown", "which the schema registry does not have"),
     ("json_schema", "avro", "registered as AVRO, not JSON"),
     ("protobuf", "unknown", "which the schema registry does not have"),
     ("protobuf", "retyped", "cannot read: field 'Order.amount' (number 2) is string")],
    ids=["json_schema-unknown", "json_schema-avro", "protobuf-unknown", "protobuf-retyped"],
)  # fmt: skip
def test_a_dead_letter_whose_writer_does_not_resolve_stays_naming_it_beside_one_that_passes(
    env: RegistryEnv, registry: str, fmt: str, writer: str, says: str
) -> None:
    """A writer the registry lacks, of another schema type, or whose message retypes a field number of the reader:
    its dead letter keeps a decode error naming the schema id; the other dead letter passes, in the same re-drive."""
    from confluent_kafka.schema_registry import Schema

    if fmt == "json_schema":
        framed = _framed(_register_json(env, ORDER_V2), json.dumps({"id": 1, "amount": 5, "note": None}).encode())
    else:
        _, cls = _order_classes()
        framed = _protobuf_framed(env, cls, cls(id=1, amount=5, note="n"))
    if writer == "unknown":
        sid = UNKNOWN_ID
    elif writer == "avro":
        avro = Schema(json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}), "AVRO")
        sid = int(env.sr.register_schema(f"{env.topic}-other", avro))
    else:
        retyped = _retyped_class()
        sid = int.from_bytes(_protobuf_framed(env, retyped, retyped(id=1, amount="five"))[1:5], "big")
    env.write_feed(format=fmt, schema_version=1)
    letters = [_letter(env, 0, framed), _letter(env, 1, _framed(sid, framed[5:]))]

    checked = recheck(env.spark, load_feed("orders"), letters, RegistryConnection(url=registry))

    assert [(v.letter.offset, v.passes, v.reason_codes) for v in checked.verdicts] == [
        (0, True, ()),
        (1, False, ("decode_error",)),
    ]
    why = checked.verdicts[1].reason
    assert f"schema id {sid}, " in why and says in why, why
