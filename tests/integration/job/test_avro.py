"""Avro feeds end to end on the real cluster and a real schema registry (Apicurio, the ``registry`` fixture).

Records are produced with confluent-kafka's own ``AvroSerializer`` through the registry.
Each publishing test compares the feed's whole output with an independent
``read_committed`` scan of the topic decoded by confluent-kafka's ``AvroDeserializer``;
each failing one checks that nothing was published and the group did not move.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
import yaml

from tests.conftest import KafkaTestCluster
from tests.integration.read_helpers import consume_independently, plan_for, run_job_in_process
from tests.support.eventlog import event_log_conf
from tidemark.kafka.admin import Record
from tidemark.kafka.connection import KafkaConnection
from tidemark.runs.pipeline import RunHandle, run_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None}]}},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "tags", "type": {"type": "map", "values": "int"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    ],
}  # fmt: skip
# v2: an added field with a default, and id promoted from int to long.
ORDER_V2 = {**ORDER_V1, "fields": [
    {"name": "id", "type": "long"}, *ORDER_V1["fields"][1:],
    {"name": "channel", "type": "string", "default": "web"},
]}  # fmt: skip
# v2 with a nested addition too: the customer record gains a field with a default.
ORDER_V2_NESTED = {**ORDER_V2, "fields": [
    ORDER_V2["fields"][0],
    {"name": "customer", "type": {**ORDER_V1["fields"][1]["type"], "fields": [
        *ORDER_V1["fields"][1]["type"]["fields"], {"name": "vip", "type": "boolean", "default": False}]}},
    *ORDER_V2["fields"][2:],
]}  # fmt: skip
# An incompatible v2: an added field without a default (v1 records have no value for it).
ORDER_BAD = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "region", "type": "string"}]}


def order(i: int, *, v2: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": i,
        "customer": {"id": 1000 + i, "email": None if i % 3 == 0 else f"c{i}@example.com"},
        "items": [f"sku-{j}" for j in range(i % 4)],
        "tags": {f"t{j}": j for j in range(i % 3)},
        "amount": Decimal(f"{i}.{i % 100:02d}"),
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=i),
        "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
    }
    if v2:
        doc["channel"] = "app" if i % 2 else "store"
    return doc


class AvroEnv:
    """A feeds folder, a state dir, a topic and its registry subject for one test."""

    feed_options: ClassVar[dict[str, Any]] = {}  # more top-level keys of the feed

    def __init__(self, kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.kafka, self.registry, self.spark = kafka, registry, spark
        self.root, self.feeds, self.output = tmp_path / "state", tmp_path / "feeds", tmp_path / "out"
        self.feeds.mkdir()
        self.topic = kafka.new_topic(partitions=2, prefix="avro")
        self.group = f"g-avro-{uuid.uuid4().hex[:8]}"
        self.sr = SchemaRegistryClient({"url": registry})
        self.write_feed()

    def write_feed(
        self, expectations: Sequence[dict[str, Any]] = (), *, iceberg: str | None = None, **deserialization: Any
    ) -> None:
        """The feed ``orders``; ``iceberg``: the Iceberg table it publishes to (SQLite catalog in the state dir)."""
        doc = {
            "topics": [self.topic], "group": self.group, "output": str(self.output),
            "deserialization": {"format": "avro", **deserialization},
            "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5,
                           "expectations": list(expectations)},
        }  # fmt: skip
        if iceberg is not None:
            doc |= {"output_format": "iceberg", "iceberg": {"table": iceberg}}
        (self.feeds / "orders.yaml").write_text(yaml.safe_dump(doc | self.feed_options))

    def serializer(self, schema: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        ser = AvroSerializer(self.sr, json.dumps(schema), conf={"auto.register.schemas": True})
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        return lambda doc: ser(doc, ctx)

    def produce(self, values: Sequence[bytes], partition: int) -> None:
        records = [Record(value=v, key=f"k{partition}-{n}".encode(), partition=partition) for n, v in enumerate(values)]
        self.kafka.produce(self.topic, records)

    def committed(self) -> dict[int, int | None]:
        tps = [(self.topic, p) for p in range(2)]
        return {p: c.offset for (_, p), c in self.kafka.adapter.committed(self.group, tps).items()}

    def scan(self, reader: dict[str, Any], undecodable: Sequence[tuple[int, int]] = ()) -> dict[tuple[int, int], Any]:
        """The oracle: every record of the topic read_committed by a plain consumer, decoded by confluent-kafka
        (except those at ``undecodable``, given as their raw bytes)."""
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        de = AvroDeserializer(self.sr, json.dumps(reader))
        ctx = SerializationContext(self.topic, MessageField.VALUE)
        plan = plan_for(self.kafka.adapter, [self.topic])
        records = consume_independently(self.kafka.connection, plan)
        return {(p, o): v if (p, o) in undecodable else de(v, ctx) for (_, p, o, _, v) in records}

    def published(self) -> dict[tuple[int, int], dict[str, Any]]:
        import pyarrow.dataset as ds

        files = [str(f) for f in sorted(self.output.glob("plan_id=*/topic=*/date=*/*.parquet"))]  # not _quarantine
        table = ds.dataset(files, format="parquet").to_table()
        return {(r["partition"], r["offset"]): r for r in table.to_pylist()}

    def quarantined(self) -> list[dict[str, Any]]:
        import pyarrow.dataset as ds

        found = list(self.output.glob("plan_id=*/_quarantine"))
        if not found:
            return []
        quarantine = ds.dataset(str(found[0]), format="parquet", partitioning="hive", ignore_prefixes=["."])
        return quarantine.to_table().to_pylist()

    def in_process(self, handle: RunHandle, connection: KafkaConnection) -> dict[str, Any]:
        return run_job_in_process(self.spark, handle, connection)

    def run(self, job_runner: Any = None) -> tuple[RunHandle, dict[str, Any], Any]:
        return run_feed("orders", self.kafka.connection, root=self.root, job_runner=job_runner or self.in_process)

    def report(self) -> dict[str, Any]:
        (path,) = self.root.glob("runs/orders/*/report.json")
        return dict(json.loads(path.read_text()))

    def iceberg_table(self) -> Any:
        """The feed's Iceberg table, read back through the catalog."""
        from tidemark.config.models import load_feed
        from tidemark.output.iceberg import IcebergPublisher

        table = IcebergPublisher(load_feed("orders")).load()
        assert table is not None
        return table


E = TypeVar("E", bound=AvroEnv)


def env_of(
    cls: type[E], kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> E:
    """A test's environment of class ``cls``, with the feeds, state and registry settings the CLI reads."""
    e = cls(kafka, registry, tmp_path, spark)
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(e.feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(e.root))
    monkeypatch.setenv("TIDEMARK_SCHEMA_REGISTRY_URL", registry)
    return e


@pytest.fixture
def env(kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> AvroEnv:
    return env_of(AvroEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _as_published(doc: dict[str, Any]) -> dict[str, Any]:
    """An oracle record as Parquet hands it back: maps as (key, value) pairs, timestamps in UTC."""
    out = dict(doc)
    out["tags"] = sorted(doc["tags"].items())
    return out


def _published_value(row: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    out = {n: row[n] for n in names}
    out["tags"] = sorted(out["tags"])
    at = out["at"]  # Parquet timestamps come back in UTC, naive or not
    at = at.to_pydatetime() if hasattr(at, "to_pydatetime") else at
    out["at"] = at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)
    return out


def test_avro_feed_publishes_the_scan_with_nested_and_logical_types(env: AvroEnv) -> None:
    import pyarrow as pa

    # GX on Spark names a nested field with a dot (a backquoted `customer`.`id` finds no column).
    nested = {"column": "customer.id", "min_value": 1000, "max_value": 1029}
    env.write_feed(expectations=[{"type": "expect_column_values_to_be_between", "kwargs": nested}])
    ser = env.serializer(ORDER_V1)
    for partition in range(2):
        env.produce([ser(order(i)) for i in range(partition, 30, 2)], partition)
    good = ser(order(99))
    env.produce([good[:5] + b"\xff\xff\xff\xff"], 1)  # a known schema id, a body that does not decode

    env.run()

    scanned = env.scan(ORDER_V1, undecodable=[(1, 15)])
    assert scanned.pop((1, 15)) == good[:5] + b"\xff\xff\xff\xff"
    expected = scanned
    published = env.published()
    names = [f["name"] for f in ORDER_V1["fields"]]
    assert {k: _published_value(r, names) for k, r in published.items()} == {
        k: _as_published(v) for k, v in expected.items()
    }
    import pyarrow.parquet as pq

    schema = pq.read_schema(next(iter(env.output.glob("plan_id=*/topic=*/date=*/*.parquet"))))
    assert schema.field("customer").type == pa.struct([("id", pa.int64()), ("email", pa.string())])
    assert schema.field("items").type == pa.list_(pa.field("element", pa.string()))
    assert pa.types.is_map(schema.field("tags").type)
    assert schema.field("amount").type == pa.decimal128(10, 2)
    assert schema.field("day").type == pa.date32()
    assert pa.types.is_timestamp(schema.field("at").type)
    assert schema.field("status").type == pa.string()
    assert {"value", "_raw_value", "_row_hash", "_row_bytes", "_value_head"}.isdisjoint(schema.names)
    # Spark takes the columns from the footers' Spark schema: the published files' own, without the staged ones.
    (plan_folder,) = env.output.glob("plan_id=*")
    assert env.spark.read.parquet(str(plan_folder)).columns == [*schema.names, "topic", "date"]

    (bad,) = env.quarantined()
    assert (bad["partition"], bad["offset"]) == (1, 15)
    assert bad["_reason"] == "decode_error: value does not decode against its Avro writer schema"
    assert bad["_raw_value"] == good[:5] + b"\xff\xff\xff\xff"
    writer_id = int.from_bytes(good[1:5], "big")
    report = env.report()
    assert report["status"] == "succeeded"
    (checked,) = [e for e in report["validation"]["expectations"] if e["kwargs"] == nested]
    # A nested path is a row rule too: a record breaking it would be quarantined, not fail the run.
    assert (checked["success"], checked["unexpected_count"], checked["row_level"]) == (True, 0, True)
    assert report["schemas"]["writer_ids"] == [writer_id]
    assert report["schemas"]["reader"] == {"subject": f"{env.topic}-value", "version": 1, "id": writer_id}
    assert env.committed() == {0: 15, 1: 16}


def test_v1_to_v2_mid_range_publishes_one_table_with_both_resolved(env: AvroEnv) -> None:
    v1, v2 = env.serializer(ORDER_V1), env.serializer(ORDER_V2)
    for partition in range(2):
        env.produce([v1(order(i)) for i in range(10)] + [v2(order(i, v2=True)) for i in range(10, 20)], partition)

    env.run()

    published = env.published()
    expected = env.scan(ORDER_V2)  # the subject's latest: v2, as the feed pins no version
    assert len(published) == len(expected) == 40
    names = [f["name"] for f in ORDER_V2["fields"]]
    assert {k: _published_value(r, names) for k, r in published.items()} == {
        k: _as_published(v) for k, v in expected.items()
    }
    assert {r["channel"] for k, r in published.items() if k[1] < 10} == {"web"}  # v1 rows: the default
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(next(iter(env.output.glob("plan_id=*/topic=*/date=*/*.parquet"))))
    assert schema.field("id").type == pa.int64()
    report = env.report()
    id1 = env.sr.get_latest_version(f"{env.topic}-value").schema_id
    changes = [e for e in report["events"] if e["kind"] == "schema_changed"]
    assert sorted((e["partition"], e["details"]["offset"], e["details"]["to_schema_id"]) for e in changes) == [
        (0, 10, id1), (1, 10, id1)
    ]  # fmt: skip
    assert len(report["schemas"]["writer_ids"]) == 2 and report["schemas"]["reader"]["id"] == id1
    assert env.committed() == {0: 20, 1: 20}


def test_writers_outside_the_subject_are_decoded_on_a_second_read_and_unused_versions_stay_out_of_the_report(
    env: AvroEnv,
) -> None:
    from confluent_kafka.schema_registry import record_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    v1, v2 = env.serializer(ORDER_V1), env.serializer(ORDER_V2)
    # v1's fields under the record's own subject (shop.Order), with a doc: its id is none of the topic subject's.
    other_schema = {**ORDER_V1, "doc": "written under the record's name"}
    other_ser = AvroSerializer(env.sr, json.dumps(other_schema), conf={
        "auto.register.schemas": True, "subject.name.strategy": record_subject_name_strategy})  # fmt: skip
    other = other_ser(order(5), SerializationContext(env.topic, MessageField.VALUE))
    env.produce([v1(order(i)) for i in range(5)] + [other] + [v2(order(i, v2=True)) for i in range(6, 10)], 0)
    env.produce([v2(order(i, v2=True)) for i in range(10, 14)], 1)
    # v3 of the topic's subject becomes the reader; no record is written with it.
    env.sr.register_schema(f"{env.topic}-value", _schema(ORDER_V2_NESTED))
    ids = {name: int.from_bytes(raw[1:5], "big") for name, raw in
           (("v1", v1(order(0))), ("other", other), ("v2", v2(order(6, v2=True))))}  # fmt: skip
    reader_id = env.sr.get_latest_version(f"{env.topic}-value").schema_id
    assert len({*ids.values(), reader_id}) == 4

    env.run()

    names = [f["name"] for f in ORDER_V2_NESTED["fields"]]
    expected = env.scan(ORDER_V2_NESTED)
    assert len(expected) == 14
    assert {k: _published_value(r, names) for k, r in env.published().items()} == {
        k: _as_published(v) for k, v in expected.items()
    }
    assert env.quarantined() == []
    report = env.report()
    assert report["schemas"]["writer_ids"] == sorted(ids.values())
    assert report["schemas"]["reader"]["id"] == reader_id
    (change,) = [e for e in report["events"] if e["kind"] == "schema_changed"]  # one per partition with several
    assert (change["partition"], change["details"]["offset"], change["details"]["to_schema_id"]) == (
        0, 5, ids["other"]
    )  # fmt: skip
    assert [(w["schema_id"], w["first_offset"], w["last_offset"], w["records"]) for w in change["details"]["writers"]
            ] == [(ids["v1"], 0, 4, 5), (ids["other"], 5, 5, 1), (ids["v2"], 6, 9, 4)]  # fmt: skip
    assert "write_again" in report["timings_s"]  # the other subject's record: decoded with every writer, again
    assert env.committed() == {0: 10, 1: 4}


def test_records_of_the_subjects_versions_are_read_from_kafka_once(env: AvroEnv) -> None:
    v1, v2 = env.serializer(ORDER_V1), env.serializer(ORDER_V2)
    env.produce([v1(order(i)) for i in range(3)] + [v2(order(i, v2=True)) for i in range(3, 6)], 0)
    env.produce([v2(order(i, v2=True)) for i in range(6, 9)], 1)

    env.run()

    report = env.report()
    assert {"schemas", "schema_ids", "write"} <= set(report["timings_s"])
    assert "write_again" not in report["timings_s"]
    assert len(env.published()) == 9 and env.committed() == {0: 6, 1: 3}


def test_an_exact_backfill_reports_the_schema_changes_beside_its_window(env: AvroEnv) -> None:
    v1, v2 = env.serializer(ORDER_V1), env.serializer(ORDER_V2)
    base = int(time.time() * 1000) - 3_600_000
    for partition in range(2):  # stamped a second apart: the window keeps the middle of each partition
        values = [v1(order(i)) for i in range(4)] + [v2(order(i, v2=True)) for i in range(4, 8)]
        env.kafka.produce(env.topic, [Record(value=v, timestamp_ms=base + n * 1000, partition=partition)
                                      for n, v in enumerate(values)])  # fmt: skip
    start, end = datetime.fromtimestamp((base + 2000) / 1000, UTC), datetime.fromtimestamp((base + 6000) / 1000, UTC)

    _, job, outcome = run_feed("orders", env.kafka.connection, mode="backfill", root=env.root,
                               job_runner=env.in_process, params={"start_timestamp": start.isoformat(),
                                                                  "end_timestamp": end.isoformat(),
                                                                  "max_skew": "1m"})  # fmt: skip

    import pyarrow.dataset as ds

    files = sorted(str(f) for f in Path(job["manifest"]["location"]).glob("topic=*/date=*/*.parquet"))
    published = ds.dataset(files, format="parquet").to_table(columns=["partition", "offset"]).to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in published) == [(p, o) for p in range(2) for o in range(2, 6)]
    report = json.loads(Path(outcome.report_path).read_text())
    assert report["window"] and sum(w["kept"] for w in report["window"]) == job["records_published"] == 8
    v2_id = env.sr.get_latest_version(f"{env.topic}-value").schema_id
    changes = sorted((e["partition"], e["details"]["offset"], e["details"]["to_schema_id"])
                     for e in report["events"] if e["kind"] == "schema_changed")  # fmt: skip
    assert changes == [(0, 4, v2_id), (1, 4, v2_id)]


def _schema(doc: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(doc), "AVRO")


def test_incompatible_change_fails_before_publishing_naming_offset_ids_and_field(env: AvroEnv) -> None:
    v1, bad = env.serializer(ORDER_V1), env.serializer(ORDER_BAD)
    env.produce([v1(order(i)) for i in range(5)], 0)
    first = v1(order(0))
    env.produce([bad({**order(i), "region": "eu"}) for i in range(5, 8)], 0)
    env.produce([v1(order(i)) for i in range(3)], 1)
    latest = env.sr.get_latest_version(f"{env.topic}-value").schema_id
    v1_id = int.from_bytes(first[1:5], "big")

    with pytest.raises(Exception, match="cannot be read with the reader schema") as info:
        env.run()

    message = str(info.value)
    assert f"{env.topic}[0] offset 0" in message
    assert f"schema id {v1_id}" in message and f"reader schema id {latest}" in message
    assert "region" in message
    assert not list(env.output.glob("plan_id=*")) if env.output.exists() else True
    assert env.committed() == {0: None, 1: None}


@pytest.mark.parametrize("case", ["unknown_id", "not_framed"])
def test_unknown_schema_id_or_other_framing_fails_the_run(env: AvroEnv, case: str) -> None:
    ser = env.serializer(ORDER_V1)
    env.produce([ser(order(i)) for i in range(4)], 0)
    good = ser(order(4))
    odd = b"\x00" + (2_000_000_000).to_bytes(4, "big") + good[5:] if case == "unknown_id" else b'{"id": 4}'
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


def test_registry_stopped_during_the_run_fails_it_with_nothing_committed(
    env: AvroEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from tidemark.devtools import registry as local_registry

    own = local_registry.start()  # the session's registry stays up for the other tests
    try:
        monkeypatch.setenv("TIDEMARK_SCHEMA_REGISTRY_URL", own.url)
        env.sr = SchemaRegistryClient({"url": own.url})
        ser = env.serializer(ORDER_V1)
        env.produce([ser(order(i)) for i in range(6)], 0)

        def stop_then_run(handle: RunHandle, connection: KafkaConnection) -> dict[str, Any]:
            own.stop(purge=False)  # planned; the registry goes away before the job asks it
            return env.in_process(handle, connection)

        with pytest.raises(Exception, match="cannot be reached") as info:
            env.run(stop_then_run)
    finally:
        own.stop()
    assert "start it or fix the registry connection's URL, then rerun" in str(info.value)
    assert not env.output.exists() or not list(env.output.glob("plan_id=*"))
    assert type(info.value).__name__ == "RegistryUnavailableError"
    assert env.committed() == {0: None, 1: None}


def test_registry_password_reaches_no_artefact(env: AvroEnv, tmp_path: Path) -> None:
    ser = env.serializer(ORDER_V1)
    env.produce([ser(order(i)) for i in range(4)], 0)
    password = f"pw-{uuid.uuid4().hex}"
    # The Spark UI's environment page shows what the event log records: the application's properties.
    conf_dir, events = event_log_conf(tmp_path)
    cli_env = {
        **os.environ, **env.kafka.connection.to_env(), "SPARK_CONF_DIR": str(conf_dir),
        "TIDEMARK_SCHEMA_REGISTRY_USERNAME": "tidemark", "TIDEMARK_SCHEMA_REGISTRY_PASSWORD": password,
    }  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "tidemark.cli", "run", "orders"], env=cli_env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert env.committed() == {0: 4, 1: 0}
    assert password not in proc.stdout + proc.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "spark-submit.log" for p in files) and any(p.name == "report.json" for p in files)
    event_logs = [p for p in events.rglob("*") if p.is_file()]
    assert any(b"SparkListenerEnvironmentUpdate" in p.read_bytes() for p in event_logs)
    leaks = [p for p in files if password.encode() in p.read_bytes()]
    assert leaks == []


def test_iceberg_table_schema_evolves_in_the_snapshot_that_adds_the_data(env: AvroEnv) -> None:
    from pyiceberg.serializers import FromInputFile

    from tidemark.output.iceberg import plan_history

    env.write_feed(iceberg=f"lake.orders_{uuid.uuid4().hex[:8]}")
    v1 = env.serializer(ORDER_V1)
    for partition in range(2):
        env.produce([v1(order(i)) for i in range(6)], partition)
    env.run()
    assert env.committed() == {0: 6, 1: 6}
    # The producer moves to v2 (channel and customer.vip added with defaults, id int -> long) in the middle of
    # run 2's range.
    v2 = env.serializer(ORDER_V2_NESTED)

    def order_v2(i: int) -> dict[str, Any]:
        doc = order(i, v2=True)
        return {**doc, "customer": {**doc["customer"], "vip": i % 2 == 0}}

    for partition in range(2):
        env.produce([v1(order(i)) for i in range(6, 8)] + [v2(order_v2(i)) for i in range(8, 12)], partition)
    env.run()
    assert env.committed() == {0: 12, 1: 12}

    table = env.iceberg_table()
    schema = table.schema()
    assert str(schema.find_field("id").field_type) == "long"
    assert str(schema.find_field("channel").field_type) == "string" and schema.find_field("channel").optional
    assert str(schema.find_field("customer.vip").field_type) == "boolean"
    first, second = reversed(plan_history(table))
    schemas = table.schemas()
    assert "channel" not in schemas[first.schema_id].column_names
    assert str(schemas[first.schema_id].find_field("id").field_type) == "int"
    assert second.schema_id == schema.schema_id  # the data's snapshot is the one written with the new schema
    # Every earlier version of the table's metadata has the old schema: the schema change never stood alone.
    earlier = [FromInputFile.table_metadata(table.io.new_input(e.metadata_file)) for e in table.metadata.metadata_log]
    assert earlier and all("channel" not in m.schema().column_names for m in earlier)
    assert earlier[-1].current_snapshot_id == first.snapshot_id

    rows = table.scan().to_arrow().to_pylist()
    published = {(r["partition"], r["offset"]): r for r in rows}
    assert {r["topic"] for r in rows} == {env.topic} and len(rows) == len(published) == 24
    names = [f["name"] for f in ORDER_V2_NESTED["fields"]]

    def before_the_columns(v: dict[str, Any]) -> dict[str, Any]:
        return {**v, "channel": None, "customer": {**v["customer"], "vip": None}}

    # Run 1's files predate the columns: Iceberg reads a column added later as null there. Run 2's v1
    # records were resolved by Avro, so they carry the fields' defaults, as the oracle's do.
    scanned = env.scan(ORDER_V2_NESTED)
    expected = {k: _as_published(before_the_columns(v) if k[1] < 6 else v) for k, v in scanned.items()}
    assert {k: _published_value(r, names) for k, r in published.items()} == expected
    assert {(r["channel"], r["customer"]["vip"]) for k, r in published.items() if 6 <= k[1] < 8} == {("web", False)}
    reports = [json.loads(p.read_text()) for p in env.root.glob("runs/orders/*/report.json")]
    (event,) = [e for r in reports for e in r["events"] if e["kind"] == "table_schema_evolved"]
    assert event["details"]["snapshot_id"] == second.snapshot_id
    assert event["details"]["changes"] == [
        "promoted id: int -> long", "added customer.vip: boolean", "added channel: string"
    ]  # fmt: skip


def test_iceberg_column_narrowed_by_the_reader_fails_before_publishing(env: AvroEnv) -> None:
    from tidemark.output.iceberg import plan_history

    table_name = f"lake.orders_{uuid.uuid4().hex[:8]}"
    env.write_feed(iceberg=table_name)
    wide = env.serializer(ORDER_V2)  # the table is created with id: long
    env.produce([wide(order(i, v2=True)) for i in range(4)], 0)
    env.run()
    files_before = {f["file_path"] for f in env.iceberg_table().inspect.files().to_pylist()}
    uploaded_before = sorted(env.output.rglob("*.parquet"))
    # The subject's next version narrows id back to int (and drops channel); its records resolve in Avro.
    narrow = env.serializer(ORDER_V1)
    env.produce([narrow(order(i)) for i in range(4, 8)], 0)
    env.produce([narrow(order(i)) for i in range(3)], 1)

    with pytest.raises(Exception, match="cannot take") as info:
        env.run()

    message = str(info.value)
    assert table_name in message and "'id'" in message and "long" in message and "int" in message
    assert "schema_version" in message  # what to do
    table = env.iceberg_table()
    assert len(plan_history(table)) == 1 and str(table.schema().find_field("id").field_type) == "long"
    assert {f["file_path"] for f in table.inspect.files().to_pylist()} == files_before
    assert sorted(env.output.rglob("*.parquet")) == uploaded_before  # nothing uploaded, no quarantine
    assert env.committed() == {0: 4, 1: 0}  # run 1's ends
