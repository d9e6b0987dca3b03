"""Avro records staged by the read tasks (tidemark.spark.arrow_avro) against Spark's staging and the scan.

Real cluster, real registry (Apicurio), records produced with confluent-kafka's
``AvroSerializer`` in two schema versions. The feed reads with the data source
(``driver_read_max_records: 0``), where the read tasks stage; the same plan staged by
Spark (``TIDEMARK_READ_TASK_STAGING=0``) must publish the same rows and the same range
statistics, and both must equal an independent ``read_committed`` scan decoded by
confluent-kafka's ``AvroDeserializer``.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import AvroEnv, env_of
from tidemark.spark.arrow_avro import SWITCH_ENV
from tidemark.staged import STAGED_BY_READ_TASKS as WRITER

pytestmark = [pytest.mark.integration, pytest.mark.spark]

V1 = {
    "type": "record", "name": "Reading", "namespace": "plant",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "ratio", "type": "float"},
        {"name": "price", "type": "double"},
        {"name": "name", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "qty", "type": ["null", "int"], "default": None},
    ],
}  # fmt: skip
# v2 (the reader): id and qty promoted to long, ratio to double, a symbol added, a field added with a default.
V2 = {**V1, "fields": [
    {"name": "id", "type": "long"}, V1["fields"][1], {"name": "ratio", "type": "double"}, *V1["fields"][3:6],
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    *V1["fields"][7:11], {"name": "qty", "type": ["null", "long"], "default": None},
    {"name": "channel", "type": "string", "default": "web"},
]}  # fmt: skip
NAMES = [f["name"] for f in V2["fields"]]


def reading(i: int, *, v2: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": (-1) ** i * i * 1_000_003, "ok": i % 2 == 0, "ratio": i / 8, "price": i * 2.5 - 100,
        "name": "é" * (i % 40) + str(i), "blob": bytes(range(i % 150)),
        "status": ["NEW", "PAID", "SHIPPED"][i % 3] if v2 else ["NEW", "PAID"][i % 2],
        "day": dt.date(1969, 12, 20) + dt.timedelta(days=i), "at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
        + dt.timedelta(milliseconds=i * 997), "at_us": dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
        + dt.timedelta(microseconds=i * 7_919), "note": None if i % 3 else f"note {i}",
        "qty": None if i % 5 == 0 else i * (2**33 if v2 else 1),
    }  # fmt: skip
    if v2:
        doc["channel"] = ["app", "store"][i % 2]
    return doc


class StagingEnv(AvroEnv):
    feed_options: ClassVar[dict[str, Any]] = {"driver_read_max_records": 0}  # the data source reads

    def produce_versions(self, per_partition: int) -> None:
        v1, v2 = self.serializer(V1), self.serializer(V2)
        for partition in range(2):
            numbers = range(partition, 2 * per_partition, 2)
            half = per_partition // 2
            values = [(v2 if n >= half else v1)(reading(i, v2=n >= half)) for n, i in enumerate(numbers)]
            self.produce(values, partition)

    def job(self) -> dict[str, Any]:
        (path,) = self.root.glob("runs/orders/*/job.json")
        return dict(json.loads(path.read_text()))


@pytest.fixture
def staging_env(
    kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> StagingEnv:
    return env_of(StagingEnv, kafka, registry, tmp_path, spark, monkeypatch)


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    out = {n: row[n] for n in NAMES}
    for name in ("at", "at_us"):  # Spark's Parquet timestamps come back in UTC, naive or not
        at = out[name]
        out[name] = at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at.astimezone(dt.UTC)
    return out


def _scanned(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    out["ratio"] = float(out["ratio"])
    return out


def test_read_tasks_publish_the_scan_and_what_spark_would_with_the_same_statistics(
    staging_env: StagingEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = staging_env
    env.write_feed(expectations=[{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}}])
    env.produce_versions(per_partition=400)

    handle, _, _ = env.run()

    job = env.job()
    assert job["staged_by"] == WRITER, job
    assert job["reader"] == "data_source"
    published = env.published()
    scanned = env.scan(V2)
    assert len(published) == 800
    assert {k: _comparable(r) for k, r in published.items()} == {k: _scanned(v) for k, v in scanned.items()}
    assert env.quarantined() == []
    assert env.committed() == {0: 400, 1: 400}

    # The same plan staged by Spark: the same rows, columns and range statistics (checksums of the raw bytes).
    import pyarrow.parquet as pq

    (plan_folder,) = env.output.glob("plan_id=*")
    schema = pq.read_schema(next(iter(plan_folder.glob("topic=*/date=*/*.parquet"))))
    assert {"_raw_value", "_value_head", "_row_hash", "value"}.isdisjoint(schema.names)
    assert env.spark.read.parquet(str(plan_folder)).columns == [*schema.names, "topic", "date"]
    monkeypatch.setenv(SWITCH_ENV, "0")
    from tidemark.config.models import load_feed
    from tidemark.job.steps import run

    by_spark = run(env.spark, handle.plan(), load_feed("orders"), env.kafka.connection, tmp_path / "again",
                   output_dir=tmp_path / "by-spark")  # fmt: skip
    assert by_spark.staged_by == "spark"
    assert [r["checksum"] for r in by_spark.ranges] == [r["checksum"] for r in job["ranges"]]
    assert by_spark.ranges == job["ranges"]
    ours = env.spark.read.parquet(str(plan_folder))
    theirs = env.spark.read.parquet(str(next((tmp_path / "by-spark").glob("plan_id=*"))))
    assert ours.schema == theirs.schema
    assert ours.exceptAll(theirs).count() == 0 and theirs.exceptAll(ours).count() == 0


def test_a_record_the_read_tasks_cannot_read_leaves_the_plan_to_spark_which_quarantines_it(
    staging_env: StagingEnv,
) -> None:
    env = staging_env
    env.produce_versions(per_partition=60)
    good = env.serializer(V2)(reading(7, v2=True))
    env.produce([good + b"\x00", good[:5] + b"\xff\xff\xff"], 1)  # a trailing byte; a body that does not decode

    env.run()

    job = env.job()
    assert job["staged_by"] == "spark", job
    scanned = env.scan(V2, undecodable=[(1, 60), (1, 61)])
    assert scanned.pop((1, 60)) == good + b"\x00"  # Spark's decoder, too, reads a body to its last byte (issue 42)
    assert scanned.pop((1, 61)) == good[:5] + b"\xff\xff\xff"
    published = env.published()
    assert {k: _comparable(r) for k, r in published.items()} == {k: _scanned(v) for k, v in scanned.items()}
    assert {(b["partition"], b["offset"]): b["_reason"] for b in env.quarantined()} == {
        (1, 60): "decode_error: value has bytes left over after the fields of its Avro writer schema",
        (1, 61): "decode_error: value does not decode against its Avro writer schema",
    }
    assert env.committed() == {0: 60, 1: 62}


def test_records_a_row_rule_quarantines_are_staged_again_by_spark_with_their_reason(staging_env: StagingEnv) -> None:
    env = staging_env
    rule = {"type": "expect_column_values_to_be_between", "kwargs": {"column": "price", "max_value": 0}}
    env.write_feed(expectations=[rule])
    env.produce_versions(per_partition=30)  # price = i * 2.5 - 100: records 41 and up break the rule

    env.run()

    job = env.job()
    assert job["staged_by"] == "spark" and "write_again" in job["timings_s"], job
    scanned = {k: _scanned(v) for k, v in env.scan(V2).items()}
    published = {k: _comparable(r) for k, r in env.published().items()}
    quarantined = {(r["partition"], r["offset"]): r for r in env.quarantined()}
    assert published == {k: v for k, v in scanned.items() if v["price"] <= 0}
    assert set(quarantined) == {k for k, v in scanned.items() if v["price"] > 0} and len(quarantined) == 19
    assert {r["_reason"] for r in quarantined.values()} == {"expect_column_values_to_be_between(price)"}
    assert env.committed() == {0: 30, 1: 30}


def test_an_iceberg_table_gets_the_scan_from_the_read_tasks_staging(staging_env: StagingEnv) -> None:
    env = staging_env
    env.write_feed(iceberg=f"lake.readings_{uuid.uuid4().hex[:8]}")
    env.produce_versions(per_partition=100)

    env.run()

    assert env.job()["staged_by"] == WRITER
    table = env.iceberg_table()
    assert str(table.schema().find_field("id").field_type) == "long"
    rows = {(r["partition"], r["offset"]): _comparable(r) for r in table.scan().to_arrow().to_pylist()}
    assert rows == {k: _scanned(v) for k, v in env.scan(V2).items()}
    assert {"_raw_value", "_value_head", "_row_hash"}.isdisjoint(table.schema().column_names)
    assert env.committed() == {0: 100, 1: 100}


def test_ranges_that_hold_only_aborted_records_stage_nothing_and_commit_past_them(staging_env: StagingEnv) -> None:
    from tests.integration.read_helpers import produce_transactions

    env = staging_env
    v2 = env.serializer(V2)
    for partition in range(2):
        produce_transactions(env.kafka.connection, env.kafka.adapter, env.topic,
                             [([v2(reading(i, v2=True)) for i in range(5)], False)], partition)  # fmt: skip

    env.run()

    job = env.job()
    assert job["staged_by"] == WRITER and job["records_read"] == 0, job
    assert env.published() == {} and env.quarantined() == []
    assert env.committed() == {0: 6, 1: 6}  # five aborted records and the marker, passed over
