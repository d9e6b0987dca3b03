"""The Spark job end to end on the real cluster: spark-submit, job.json, idempotent publish, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.read_helpers import chunk_layout, plan_for
from tidemark.kafka.admin import Record
from tidemark.output.parquet import load_pending, promote, published_dir

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[3]
JOB = ROOT / "spark_jobs" / "tidemark_job.py"
KEEP = {"retention.ms": "-1"}


def _feed_file(tmp_path: Path, topic: str, on_bad: str = "quarantine") -> Path:
    path = tmp_path / "jobfeed.yaml"
    path.write_text(
        f"topics: [{topic}]\ngroup: g-{topic}\noutput: {tmp_path / 'out'}\n"
        "deserialization:\n  format: json\n  fields:\n    - {name: n, type: integer}\n    - {name: s, type: string}\n"
        f"validation:\n  on_bad_records: {on_bad}\n  quarantine_max_ratio: 0.5\n"
    )
    return path


def _produce(kafka: KafkaTestCluster, topic: str) -> None:
    records = [Record(value=json.dumps({"n": i, "s": f"x{i}"}).encode(), key=b"k%d" % i, partition=i % 2,
                      timestamp_ms=1_767_225_600_000 + i)  # 2026-01-01
               for i in range(200)]  # fmt: skip
    records.append(Record(value=b"not json", key=b"bad", partition=0, timestamp_ms=1_767_225_600_000))
    kafka.produce(topic, records)


def test_spark_submit_publishes_once_and_reports(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = kafka.new_topic(partitions=2, config=KEEP, prefix="job")
    _produce(kafka, topic)
    feed_path = _feed_file(tmp_path, topic)
    plan = plan_for(kafka.adapter, [topic], feed="jobfeed", group=f"g-{topic}")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan.to_json())
    env = {**os.environ, **kafka.connection.to_env(), "PYSPARK_PYTHON": sys.executable,
           "TIDEMARK_SHIP_PACKAGE": "1"}  # fmt: skip
    spark_submit = str(Path(sys.executable).with_name("spark-submit"))

    def submit(run_dir: Path) -> dict[str, Any]:
        cmd = [spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false", str(JOB),
               "--plan", str(plan_path), "--feed", str(feed_path), "--run-dir", str(run_dir)]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((run_dir / "job.json").read_text())

    first = submit(tmp_path / "run1")
    assert first["published"] and not first["reused"]
    assert (first["records_read"], first["records_published"], first["records_quarantined"]) == (201, 200, 1)
    assert first["spark"]["master"] == "local[2]"
    assert first["reader"] == "driver"  # 201 records: read by the driver, no Python workers
    ranges = {r["partition"]: r for r in first["ranges"]}
    assert ranges[0]["records"] == 101 and ranges[1]["records"] == 100
    assert ranges[0]["first_offset"] == 0 and ranges[0]["last_offset"] == 100 and ranges[0]["gaps"] == 0
    final = published_dir(tmp_path / "out", plan.plan_id)
    # The job of run "run1" staged the plan for that run: nothing shown until the commit step promotes it.
    assert not final.exists() and load_pending(tmp_path / "out", plan.plan_id, "run1") is not None
    assert promote(tmp_path / "out", plan.plan_id, "run1").records == 200
    assert sorted(p.name for p in final.iterdir() if p.name.startswith("topic=")) == [f"topic={topic}"]
    assert (final / f"topic={topic}" / "date=2026-01-01").is_dir()

    # The plan's job once more (a retried task; the job's own entry point, in this process's session).
    from tidemark.job.entry import main

    for key, value in kafka.connection.to_env().items():
        monkeypatch.setenv(key, value)
    assert main(["--plan", str(plan_path), "--feed", str(feed_path), "--run-dir", str(tmp_path / "run2")]) == 0
    second = json.loads((tmp_path / "run2" / "job.json").read_text())
    assert second["published"] and second["reused"]
    assert second["manifest"]["files"] == first["manifest"]["files"]
    import pyarrow.dataset as ds

    table = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 200
    assert sorted(table.column("n").to_pylist()) == list(range(200))
    # The files hold the decoded record only: no staging columns, no raw value.
    import pyarrow.parquet as pq

    (one_file, *_) = sorted(final.glob("topic=*/date=*/*.parquet"))
    assert pq.read_schema(one_file).names == ["partition", "offset", "timestamp", "timestamp_type", "key", "n", "s",
                                              "headers"]  # fmt: skip
    # The bad record is kept aside with why, and its raw bytes.
    bad = ds.dataset(str(final / "_quarantine"), format="parquet", partitioning="hive", ignore_prefixes=["."])
    (row,) = bad.to_table().to_pylist()
    assert row["_reason"] == "decode_error: value is not a JSON object matching the declared field types"
    assert (row["offset"], row["key"], row["_raw_value"], row["n"]) == (100, "bad", b"not json", None)
    (bad_file,) = final.glob("_quarantine/**/*.parquet")
    layout = chunk_layout(bad_file, ["_raw_value", "offset"])
    assert layout["_raw_value"] == (False, False) and layout["offset"][0]


def test_job_fails_with_a_named_partition_when_the_start_was_deleted(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemark.job.entry import main

    topic = kafka.new_topic(partitions=2, config=KEEP, prefix="job-lost")
    _produce(kafka, topic)
    feed_path = _feed_file(tmp_path, topic)
    plan = plan_for(kafka.adapter, [topic], feed="jobfeed", group=f"g-{topic}")
    (tmp_path / "plan.json").write_text(plan.to_json())
    kafka.adapter.delete_records({(topic, 1): 30})
    for key, value in kafka.connection.to_env().items():
        monkeypatch.setenv(key, value)

    rc = main(["--plan", str(tmp_path / "plan.json"), "--feed", str(feed_path), "--run-dir", str(tmp_path / "run")])
    assert rc == 1
    job = json.loads((tmp_path / "run" / "job.json").read_text())
    assert job["published"] is False
    assert job["error_type"] == "ReadError"
    assert f"{topic}[1] offsets [0, 100)" in job["error"] and "log now starts at 30" in job["error"]
    out = tmp_path / "out"
    assert not out.exists() or not any(p.name.startswith("plan_id=") for p in out.iterdir())


def test_job_refuses_a_range_the_reader_left_short(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation compares where the reader stopped, as it reports it, with the planned ends.

    A reader that closes partition 1's range one record early (a reader bug, made here by
    shortening that range inside the reader only) must fail the run naming the partition
    and both offsets, and publish nothing; the plan's own ends would let it pass.
    """
    from tidemark.config.models import load_feed
    from tidemark.errors import ValidationFailedError
    from tidemark.job.steps import run
    from tidemark.spark import source

    topic = kafka.new_topic(partitions=2, config=KEEP, prefix="job-short")
    _produce(kafka, topic)
    feed_path = _feed_file(tmp_path, topic)
    plan = plan_for(kafka.adapter, [topic], feed="jobfeed", group=f"g-{topic}")
    assert {p.partition: p.end for p in plan.partitions} == {0: 101, 1: 100}
    wave_init = source._Wave.__init__

    def short_of_the_end(self: Any, ranges: Any) -> None:
        wave_init(self, ranges)
        for r in ranges:
            if r.partition == 1:
                self.end[self.slot(r.topic, r.partition)] = r.end - 1

    monkeypatch.setattr(source._Wave, "__init__", short_of_the_end)
    with pytest.raises(ValidationFailedError) as err:
        run(spark, plan, load_feed(str(feed_path)), kafka.connection, tmp_path / "run")
    assert f"{topic}[1]: read stopped at offset 99, before the planned end 100" in str(err.value)
    out = tmp_path / "out"
    assert not out.exists() or not any(p.name.startswith("plan_id=") for p in out.iterdir())
