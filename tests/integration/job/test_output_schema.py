"""One schema per Parquet output (issue 59): a writer that adds a field, widens int to long or widens a decimal's
precision at the same scale evolves the output's one schema, which pyarrow's dataset (no schema given) and Spark's
Parquet reader take for the whole output; the feed's ``schema_change`` says what a change does. End to end on the
real cluster and a real schema registry (the ``registry`` fixture), records produced with confluent-kafka's
``AvroSerializer`` and compared with the independent ``read_committed`` scan decoded with each record's writer.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import env_of
from tests.integration.job.test_registry_formats import RegistryEnv

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _order(*, id_type: str = "int", precision: int = 12, scale: int = 3, channel: bool = False) -> dict[str, Any]:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": id_type},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}},
    ]
    if channel:
        fields.append({"name": "channel", "type": "string", "default": "web"})
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": fields}


V1 = _order()
# Each a writer change Avro resolves: the output's schema evolves with it.
CHANGES = {
    "field_added": (_order(channel=True), {"id": 10, "amount": Decimal("1.250"), "channel": "app"}),
    "int_to_long": (_order(id_type="long"), {"id": 2**40, "amount": Decimal("2.500")}),
    "decimal_widened": (_order(precision=14), {"id": 11, "amount": Decimal("12345678901.234")}),
}


class EvolvingEnv(RegistryEnv):
    feed_options: ClassVar[dict[str, Any]] = {"schema_change": "evolve"}


@pytest.fixture
def env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> RegistryEnv:
    return env_of(RegistryEnv, kafka, registry, tmp_path, spark, monkeypatch)


@pytest.fixture
def evolving(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> EvolvingEnv:
    return env_of(EvolvingEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _writer_scan(env: RegistryEnv) -> dict[tuple[int, int], dict[str, Any]]:
    """The oracle: every record decoded with its own writer schema by confluent-kafka's AvroDeserializer."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    de = AvroDeserializer(env.sr)
    ctx = SerializationContext(env.topic, MessageField.VALUE)
    return env.scan_with(lambda v: de(v, ctx))


def _whole_output_by_pyarrow(env: RegistryEnv) -> tuple[Any, dict[tuple[int, int], dict[str, Any]]]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(env.output), format="parquet", partitioning="hive").to_table()  # no schema given
    return table.schema, {(r["partition"], r["offset"]): r for r in table.to_pylist()}


def _whole_output_by_spark(env: RegistryEnv) -> tuple[Any, dict[tuple[int, int], dict[str, Any]]]:
    df = env.spark.read.parquet(str(env.output))
    return df.schema, {(r["partition"], r["offset"]): r.asDict() for r in df.collect()}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_writer_change_evolves_the_output_s_one_schema_read_whole_by_pyarrow_and_spark(
    evolving: EvolvingEnv, change: str
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    env = evolving
    v1 = env.serializer(V1)
    env.produce([v1({"id": i, "amount": Decimal(f"{i}.125")}) for i in range(3)], 0)
    env.run()
    schema_v2, record = CHANGES[change]
    env.produce([env.serializer(schema_v2)(record)], 1)
    env.run()
    # A third plan read with the older reader (pinned): written with the output's evolved schema all the same.
    env.produce([v1({"id": 7, "amount": Decimal("7.000")})], 0)
    env.write_feed(schema_version=1)
    env.run()

    oracle = _writer_scan(env)
    names = [f["name"] for f in schema_v2["fields"]]
    expected = {k: {n: v.get(n) for n in names} for k, v in oracle.items()}
    for read in (_whole_output_by_pyarrow, _whole_output_by_spark):
        _, rows = read(env)
        assert {k: {n: r[n] for n in names} for k, r in rows.items()} == expected, read.__name__
    arrow_schema, _ = _whole_output_by_pyarrow(env)
    wanted = {"field_added": ("channel", pa.string()), "int_to_long": ("id", pa.int64()),
              "decimal_widened": ("amount", pa.decimal128(14, 3))}[change]  # fmt: skip
    assert arrow_schema.field(wanted[0]).type == wanted[1]
    manifests = [json.loads(m.read_text()) for m in env.output.glob("plan_id=*/_manifest.json")]
    versions = sorted(m["extra"]["output_schema"]["version"] for m in manifests)
    assert versions == [1, 2, 2]
    last = [m for m in manifests if m["extra"]["output_schema"]["readers"].endswith("version 1")
            and m["extra"]["output_schema"]["version"] == 2]  # fmt: skip
    assert len(last) == 1  # the pinned plan: its files carry the output's schema, not its reader's
    (folder,) = [m["location"] for m in last]
    for path in Path(folder).rglob("*.parquet"):
        assert pq.read_schema(path).field(wanted[0]).type == wanted[1]
    reports = [json.loads(p.read_text()) for p in env.root.glob("runs/orders/*/report.json")]
    evolved = [e for r in reports for e in r.get("events", []) if e["kind"] == "output_schema_evolved"]
    assert len(evolved) == 1 and evolved[0]["details"]["version"] == 2, evolved


def test_by_default_a_change_of_the_output_s_schema_fails_naming_subject_versions_and_field(env: RegistryEnv) -> None:
    v1 = env.serializer(V1)
    env.produce([v1({"id": 1, "amount": Decimal("1.000")})], 0)
    env.run()
    before = env.committed()
    plans = sorted(p.name for p in env.output.glob("plan_id=*"))
    env.produce([env.serializer(_order(channel=True))({"id": 2, "amount": Decimal("2.000"), "channel": "x"})], 1)

    with pytest.raises(Exception, match="would change the output's schema") as info:
        env.run()

    subject = f"{env.topic}-value"
    message = str(info.value)
    for part in (f"subject '{subject}' version 2", f"subject '{subject}' version 1", "column 'channel' added",
                 "schema_change is 'fail'"):  # fmt: skip
        assert part in message, message
    assert sorted(p.name for p in env.output.glob("plan_id=*")) == plans
    assert env.committed() == before


def test_a_type_the_output_cannot_widen_is_refused_even_when_evolving(evolving: EvolvingEnv) -> None:
    # int read as float: Avro promotes it, but an int32 column cannot hold floats, nor float32 every int.
    env = evolving
    env.produce([env.serializer(V1)({"id": 1, "amount": Decimal("1.000")})], 0)
    env.run()
    before = env.committed()
    env.produce([env.serializer(_order(id_type="float"))({"id": 2.5, "amount": Decimal("2.000")})], 1)

    with pytest.raises(Exception, match="cannot be written with the output's schema") as info:
        env.run()

    assert "column 'id' is int32 in the output and float in this plan" in str(info.value), str(info.value)
    assert env.committed() == before


class QuarantiningEnv(RegistryEnv):
    feed_options: ClassVar[dict[str, Any]] = {"schema_change": "quarantine"}


@pytest.fixture
def quarantining(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> QuarantiningEnv:
    return env_of(QuarantiningEnv, kafka, registry, tmp_path, spark, monkeypatch)


def test_schema_change_quarantine_sets_an_incompatible_writers_records_aside_with_the_reason(
    quarantining: QuarantiningEnv,
) -> None:
    # Written as decimal(10,2), read as decimal(10,4): eight digits before the point where the reader has six.
    env = quarantining
    v1 = env.serializer(_order(precision=10, scale=2))
    first = v1({"id": 1, "amount": Decimal("12345678.90")})
    env.produce([first, v1({"id": 2, "amount": Decimal("3.34")})], 0)
    v2 = env.serializer(_order(precision=10, scale=4))
    env.produce([v2({"id": i, "amount": Decimal(f"123456.789{i}")}) for i in range(3, 6)], 1)  # under the ratio

    env.run()

    v1_id = int.from_bytes(first[1:5], "big")
    oracle = _writer_scan(env)
    published = {k: {"id": r["id"], "amount": r["amount"]} for k, r in env.published().items()}
    assert published == {(1, o): oracle[(1, o)] for o in range(3)}
    quarantined = sorted(env.quarantined(), key=lambda r: r["offset"])
    assert [(r["partition"], r["offset"]) for r in quarantined] == [(0, 0), (0, 1)]
    for row in quarantined:
        reason = row["_reason"]
        for part in (f"schema id {v1_id}", "version 1 of subject", "written as decimal(10,2), read as decimal(10,4)",
                     "schema_change: quarantine"):  # fmt: skip
            assert part in reason, reason
    assert env.committed() == {0: 2, 1: 3}
    (report,) = [json.loads(p.read_text()) for p in env.root.glob("runs/orders/*/report.json")]
    events = [e for e in report["events"] if e["kind"] == "schema_change_quarantined"]
    assert [(e["partition"], e["details"]["records"]) for e in events] == [(0, 2)], events
