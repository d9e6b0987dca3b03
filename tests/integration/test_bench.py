"""``make bench`` itself, shrunk: its runners work and its proofs hold on the real cluster.

The speed targets are checked by the full benchmark, never here; this test only makes
sure the benchmark that reports them runs, and that what it measures besides speed holds
(Tidemark reads Kafka exactly once per run, in the read alone and end to end).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.extended]  # `make test-extended`


def test_bench_runs_interleaved_rounds_and_reads_kafka_once(kafka: KafkaTestCluster, tmp_path: Path) -> None:
    env = {**os.environ, **kafka.connection.to_env()}
    cmd = [sys.executable, "-m", "tests.bench.read", "--records", "16000", "--runs", "2", "--only", "R1,RF,R3,R6",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    doc = json.loads((tmp_path / "bench-16000.json").read_text())
    assert set(doc["runners"]) == {"R1", "RF", "R3", "R6"}
    for runner in doc["runners"].values():
        assert runner["error"] is None
        assert [s["records"] for s in runner["samples"]] == [16000, 16000]
    assert doc["runners"]["R3"]["kafka_payload_read_ratio"] == 1.0
    # CPU by process kind: Spark's JVM, the Python workers, and the test cluster's local brokers.
    for name in ("R3", "R6"):
        split = doc["runners"][name]["median_cpu_split"]
        assert set(split) == {"jvm", "python", "brokers"} and min(split.values()) > 0, split
    assert doc["runners"]["R6"]["kafka_payload_read_ratio"] == 1.0
    assert len(doc["r6_steps_seconds"]) == 2
    assert len(doc["ratios_by_round"]["R3/R1"]) == 2 and doc["ratios_by_round"]["R3/R4"] == []
    # Warm-up first, then the runners take turns round by round.
    order = [line.split()[0] for line in proc.stdout.splitlines() if " rec/s, " in line]
    assert order == ["R1", "RF", "R3", "R6"] * 3
    assert (tmp_path / "bench-16000.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(1200)  # four spark-submits in a row: slow on a loaded machine
def test_small_run_bench_times_both_sides_over_the_same_offsets(kafka: KafkaTestCluster, tmp_path: Path) -> None:
    """``make bench-small`` shrunk: ``tidemark run`` and Spark's Kafka source, each in its own process."""
    env = {**os.environ, **kafka.connection.to_env()}
    cmd = [sys.executable, "-m", "tests.bench.small", "--quick", "--runs", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1100, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    doc = json.loads((tmp_path / "bench-small-quick.json").read_text())
    assert [row["records"] for row in doc["table"]] == [0, 1000]
    empty, small = doc["table"]
    for row in doc["table"]:
        assert len(row["tidemark_rounds_s"]) == len(row["spark_rounds_s"]) == len(row["ratios_by_round"]) == 1
        # The ratio is of the unrounded medians; the seconds are printed rounded to 0.01.
        assert row["ratio"] == pytest.approx(row["spark_s"] / row["tidemark_s"], rel=0.02)
    # Nothing to read starts no Spark application; 1,000 records go through every job step.
    assert empty["job_steps_s"] == {}
    assert {"write", "validate", "publish"} <= set(small["job_steps_s"])
    # Each side checked it moved exactly the size's records (the bench raises otherwise).
    lines = [line for line in proc.stdout.splitlines() if " records, round " in line]
    assert len(lines) == 2
    assert set(doc["targets"]) == {"0 records: tidemark seconds", "1,000 records: tidemark seconds",
                                   "1,000 records: spark/tidemark"}  # fmt: skip
    assert (tmp_path / "bench-small-quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_avro_bench_sides_must_write_the_same_records(spark: Any) -> None:
    """The Avro row's output check: a record missing, or one decoded field differing, fails the benchmark."""
    from tests.bench.avro import check_output, content_digest
    from tidemark.errors import TidemarkError

    rows = [(p, o, f"sku-{o}", o * 1.5) for p in range(2) for o in range(50)]
    columns = ["partition", "offset", "sku", "price"]
    tidemark = spark.createDataFrame(rows, columns)
    other_order = spark.createDataFrame(list(reversed(rows)), columns)
    one_field_off = spark.createDataFrame([(*r[:3], r[3] + (r == rows[7])) for r in rows], columns)
    fields = ["sku", "price"]

    digest = check_output("A6", content_digest(tidemark, fields), None, 100)
    assert check_output("A4w", content_digest(other_order, fields), digest, 100) == digest
    with pytest.raises(TidemarkError, match="A4w wrote other content than the other side"):
        check_output("A4w", content_digest(one_field_off, fields), digest, 100)
    with pytest.raises(TidemarkError, match="A4w wrote 99 records, expected 100"):
        check_output("A4w", content_digest(tidemark.where("offset != 7 or partition != 1"), fields), digest, 100)


def test_avro_bench_runs_both_rows_through_the_registry(kafka: KafkaTestCluster, registry: str, tmp_path: Path) -> None:
    """``make bench``'s Avro rows shrunk: two schema versions on the topic, every runner once per round."""
    env = {**os.environ, **kafka.connection.to_env(), "TIDEMARK_SCHEMA_REGISTRY_URL": registry}
    cmd = [sys.executable, "-m", "tests.bench.avro", "--records", "8000", "--runs", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    doc = json.loads((tmp_path / "bench-avro-8000.json").read_text())
    assert set(doc["runners"]) == {"A3b", "A3", "A3r", "A3s", "A6", "A4w"}
    assert len(set(doc["writer_schema_ids"])) == 2
    for runner in doc["runners"].values():
        assert [s["records"] for s in runner["samples"]] == [8000]
    # Checked after every A6 and A4w round: both wrote all the records, with the same content.
    assert doc["content_digest"][0] == 8000
    assert "schemas" in doc["a6_steps_seconds"][0]
    assert set(doc["targets"]) == {"A6/A4w", "A3/A3b"}
    assert set(doc["ratios"]) == {"A6/A4w", "A3/A3b", "A3/A3r", "A3s/A3b"}
    order = [line.split()[0] for line in proc.stdout.splitlines() if " rec/s, " in line]
    assert order == ["A3b", "A3", "A3r", "A3s", "A6", "A4w"] * 2
