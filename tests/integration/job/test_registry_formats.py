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
from tests.integration.job.test_avro import AvroEnv
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
    e = RegistryEnv(kafka, registry, tmp_path, spark)
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(e.feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(e.root))
    monkeypatch.setenv("TIDEMARK_SCHEMA_REGISTRY_URL", registry)
    return e


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
    reasons = {k: q["_reason"] for k, q in quarantined.items()}
    assert (
        reasons[(1, 10)]
        == reasons[(1, 11)]
        == ("decode_error: value is not a JSON object of the reader JSON Schema's types")
    )
    assert (
        reasons[(1, 12)]
        == reasons[(1, 13)]
        == ("decode_error: value lacks a required property or has a value outside an enum of the reader JSON Schema")
    )
    report = env.report()
    writer_id = int.from_bytes(prefix[1:5], "big")
    assert report["status"] == "succeeded" and report["schemas"]["format"] == "json_schema"
    assert report["schemas"]["reader"] == {"subject": f"{env.topic}-value", "version": 1, "id": writer_id}
    assert env.committed() == {0: 10, 1: 14}


@pytest.mark.parametrize("case", ["unknown_id", "not_framed"])
def test_json_schema_unknown_id_or_other_framing_fails_the_run(env: RegistryEnv, case: str) -> None:
    env.write_feed(format="json_schema")
    ser = env.json_serializer(ORDER_JSON_SCHEMA)
    env.produce([ser(json_order(i)) for i in range(3)], 0)
    odd = b"\x00" + (2_000_000_000).to_bytes(4, "big") + b'{"id": 4}' if case == "unknown_id" else b'{"id": 4}'
    env.produce([odd], 1)

    with pytest.raises(Exception) as info:  # noqa: PT011 - the message is checked below
        env.run()

    message = str(info.value)
    assert f"{env.topic}[1] offset 0" in message
    if case == "unknown_id":
        assert "schema id 2000000000 is unknown to the schema registry" in message
    else:
        assert "not in the Schema Registry wire format" in message
    assert not env.output.exists() or not list(env.output.glob("plan_id=*"))
    assert env.committed() == {0: None, 1: None}
