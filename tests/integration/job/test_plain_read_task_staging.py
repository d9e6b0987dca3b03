"""JSON (declared fields) and raw bytes feeds staged by the read tasks (tidemark.spark.arrow_plain), against Spark.

Real cluster, records over two partitions and two UTC days. The feed reads with the data
source (``driver_read_max_records: 0``), where the read tasks stage; the same plan staged by
Spark's write (``TIDEMARK_READ_TASK_STAGING=0``) must publish files that pyarrow reads back
with the same schema, the same values in the same order per partition and day, and the same
range statistics; both must equal an independent ``read_committed`` scan (JSON decoded by
:func:`json.loads`). A record Spark's decoder quarantines makes the read tasks give way, and
Spark's write quarantines it as before.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import KafkaTestCluster
from tests.integration.read_helpers import consume_independently, run_job_in_process
from tidemark.kafka.admin import Record
from tidemark.runs.pipeline import run_feed
from tidemark.spark.arrow_avro import SWITCH_ENV

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DAY_MS = 86_400_000
START_MS = 1_772_323_200_000  # 2026-03-01T00:00Z
FIELDS: list[dict[str, Any]] = [{"name": "id", "type": "integer"}, {"name": "name", "type": "string"},
          {"name": "price", "type": "number"}, {"name": "ok", "type": "boolean"},
          {"name": "note", "type": "string", "required": False}]  # fmt: skip


def _json_value(i: int) -> bytes:
    doc: dict[str, Any] = {"id": (-1) ** i * i * 1_000_003_017, "name": "é😀" * (i % 7) + f"n{i}",
                           "price": [i / 8, -0.0, 1e-300, i * 1e300, 7][i % 5], "ok": i % 3 == 0}  # fmt: skip
    if i % 4:
        doc["note"] = None if i % 4 == 1 else f"note {i}"
    if i % 6 == 0:
        doc["extra"] = {"nested": [i, None, {"x": "y"}]}
    return json.dumps(doc, ensure_ascii=i % 2 == 0).encode()


def _bytes_value(i: int) -> bytes | None:
    return None if i % 17 == 5 else bytes((i * 7 + j) % 256 for j in range(i % 300))


class PlainEnv:
    """A feeds folder, a state dir and a two-partition topic for one feed ``plain`` of ``fmt`` values."""

    def __init__(self, kafka: KafkaTestCluster, tmp_path: Path, spark: Any, fmt: str) -> None:
        self.kafka, self.spark, self.fmt = kafka, spark, fmt
        self.root, self.feeds, self.output = tmp_path / "state", tmp_path / "feeds", tmp_path / "out"
        self.feeds.mkdir()
        self.topic = kafka.new_topic(partitions=2, config={"retention.ms": "-1"}, prefix="plain")  # old timestamps
        self.group = f"g-plain-{uuid.uuid4().hex[:8]}"
        deser: dict[str, Any] = {"format": fmt, **({"fields": FIELDS} if fmt == "json" else {})}
        doc = {"topics": [self.topic], "group": self.group, "output": str(self.output), "deserialization": deser,
               "driver_read_max_records": 0,  # the data source reads: the read tasks may stage
               "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5}}  # fmt: skip
        (self.feeds / "plain.yaml").write_text(yaml.safe_dump(doc))

    def produce(self, per_partition: int, bad: dict[tuple[int, int], bytes] | None = None) -> None:
        make = _json_value if self.fmt == "json" else _bytes_value
        for partition in range(2):
            records = []
            for n in range(per_partition):
                i = 2 * n + partition
                value = (bad or {}).get((partition, n), make(i))
                key = None if i % 11 == 3 else f"k{i}-é".encode()
                at = START_MS + (DAY_MS if n >= per_partition // 2 else 0) + i
                records.append(Record(value=value, key=key, partition=partition, timestamp_ms=at))
            self.kafka.produce(self.topic, records)

    def run(self) -> tuple[Any, dict[str, Any]]:
        handle, _, _ = run_feed(
            "plain", self.kafka.connection, root=self.root,
            job_runner=lambda h, c: run_job_in_process(self.spark, h, c),
        )  # fmt: skip
        (path,) = self.root.glob("runs/plain/*/job.json")
        return handle, dict(json.loads(path.read_text()))

    def scan(self, plan: Any) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
        return {(p, o): (k, v) for (_, p, o, k, v) in consume_independently(self.kafka.connection, plan)}


@pytest.fixture
def make_env(kafka: KafkaTestCluster, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(fmt: str) -> PlainEnv:
        env = PlainEnv(kafka, tmp_path, spark, fmt)
        monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(env.feeds))
        monkeypatch.setenv("TIDEMARK_STATE_DIR", str(env.root))
        return env

    return make


def _published(output: Path) -> tuple[Any, dict[tuple[str, str, int], list[dict[str, Any]]]]:
    """A publication read back with pyarrow, file by file: its schema, and per (topic, date folder, partition)
    its rows in the order the files hold them."""
    import pyarrow.parquet as pq

    (plan_folder,) = output.glob("plan_id=*")
    schemas: set[Any] = set()
    rows: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for folder in sorted(plan_folder.glob("topic=*/date=*")):
        for path in sorted(folder.glob("*.parquet")):
            table = pq.read_table(path)
            schemas.add(table.schema.remove_metadata())
            for row in table.to_pylist():
                rows.setdefault((folder.parent.name, folder.name, row["partition"]), []).append(row)
    (schema,) = schemas
    return schema, rows


@pytest.mark.parametrize("fmt", ["json", "bytes"])
def test_read_tasks_publish_what_spark_would_and_the_scan(
    make_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    env = make_env(fmt)
    env.produce(per_partition=300)

    handle, job = env.run()

    assert job["staged_by"] == "read_tasks", job
    assert job["reader"] == "data_source" and job["records_published"] == 600 and job["records_quarantined"] == 0
    ours_schema, ours = _published(env.output)
    assert {"_raw_value", "_row_hash", "_row_bytes"}.isdisjoint(ours_schema.names)

    # The same plan staged by Spark's write.
    monkeypatch.setenv(SWITCH_ENV, "0")
    from tidemark.config.models import load_feed
    from tidemark.job.steps import run

    plan = handle.plan()
    by_spark = run(env.spark, plan, load_feed("plain"), env.kafka.connection, tmp_path / "again",
                   output_dir=tmp_path / "by-spark")  # fmt: skip
    assert by_spark.staged_by == "spark"
    assert by_spark.ranges == job["ranges"]  # the same range statistics (checksums of the raw bytes)
    theirs_schema, theirs = _published(tmp_path / "by-spark")
    assert ours_schema == theirs_schema
    assert ours.keys() == theirs.keys() and len(ours) == 4  # two partitions, two days
    for where, rows in ours.items():  # the same values, in the same order per partition and day
        assert rows == theirs[where], where
        offsets = [r["offset"] for r in rows]
        assert offsets == sorted(offsets), where

    # And both are the scan.
    scanned = env.scan(plan)
    published = {(r["partition"], r["offset"]): r for rows in ours.values() for r in rows}
    assert published.keys() == scanned.keys() and len(scanned) == 600
    names = [f["name"] for f in FIELDS]
    for at, (key, value) in scanned.items():
        row = published[at]
        assert row["key"] == (None if key is None else key.decode())
        if fmt == "bytes":
            assert row["value"] == value
        else:
            doc = json.loads(value)  # type: ignore[arg-type]
            assert {n: row[n] for n in names} == {n: doc.get(n) for n in names}
            assert [str(row["price"])] == [str(float(doc["price"]))]  # -0.0 stays -0.0


def test_a_record_spark_quarantines_makes_the_read_tasks_give_way(make_env: Any) -> None:
    env = make_env("json")
    env.produce(per_partition=50, bad={(1, 10): b'{"id": 1.5, "name": "x", "price": 1, "ok": true}'})

    _, job = env.run()

    assert job["staged_by"] == "spark", job
    assert job["records_published"] == 99 and job["records_quarantined"] == 1
    import pyarrow.dataset as ds

    (quarantine,) = env.output.glob("plan_id=*/_quarantine")
    (row,) = ds.dataset(str(quarantine), format="parquet", partitioning="hive").to_table().to_pylist()
    assert (row["partition"], row["offset"]) == (1, 10)
    assert row["_raw_value"] == b'{"id": 1.5, "name": "x", "price": 1, "ok": true}'
    assert row["_reason"].startswith("decode_error: value is not a JSON object matching the declared field types")
