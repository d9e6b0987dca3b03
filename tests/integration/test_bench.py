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

import pytest

from tests.conftest import KafkaTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_bench_runs_interleaved_rounds_and_reads_kafka_once(kafka: KafkaTestCluster, tmp_path: Path) -> None:
    env = {**os.environ, **kafka.connection.to_env()}
    cmd = [sys.executable, "-m", "tidemark.bench", "--records", "16000", "--runs", "2", "--only", "R1,RF,R3,R6",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    doc = json.loads((tmp_path / "bench-16000.json").read_text())
    assert set(doc["runners"]) == {"R1", "RF", "R3", "R6"}
    for runner in doc["runners"].values():
        assert runner["error"] is None
        assert [s["records"] for s in runner["samples"]] == [16000, 16000]
    assert doc["runners"]["R3"]["kafka_payload_read_ratio"] == 1.0
    assert doc["runners"]["R6"]["kafka_payload_read_ratio"] == 1.0
    assert len(doc["r6_steps_seconds"]) == 2
    assert len(doc["ratios_by_round"]["R3/R1"]) == 2 and doc["ratios_by_round"]["R3/R4"] == []
    # Warm-up first, then the runners take turns round by round.
    order = [line.split()[0] for line in proc.stdout.splitlines() if " rec/s, " in line]
    assert order == ["R1", "RF", "R3", "R6"] * 3
    assert (tmp_path / "bench-16000.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
