"""``tidemark watch FEED`` on the real cluster: no run below the threshold, one run past it, output = the scan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import KafkaTestCluster, keyed_records
from tests.faults.harness import group_offsets, oracle
from tests.integration.read_helpers import published_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _watch(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemark.cli", "watch", "orders", "--check-every", "0.5", *flags],
                          env=env, capture_output=True, text=True, check=False, timeout=600)  # fmt: skip


def test_watch_runs_the_feed_only_once_its_lag_passes_the_threshold(kafka: KafkaTestCluster, tmp_path: Path) -> None:
    topic = kafka.new_topic(partitions=2, prefix="watch")
    group = f"g-watch-{uuid.uuid4().hex[:8]}"
    feeds, output = tmp_path / "feeds", tmp_path / "out"
    feeds.mkdir()
    (feeds / "orders.yaml").write_text(yaml.safe_dump({
        "topics": [topic], "group": group, "deserialization": {"format": "string"}, "output": str(output),
        "trigger": {"lag_records": 20},
    }))  # fmt: skip
    env = {**os.environ, **kafka.connection.to_env(), "TIDEMARK_FEEDS_DIR": str(feeds),
           "TIDEMARK_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    kafka.produce(topic, keyed_records(9, partition=0) + keyed_records(10, partition=1))  # 19 behind

    below = _watch(env, "--max-checks", "4", "--verbose")

    assert below.returncode == 0, below.stdout + below.stderr
    assert "below the thresholds (lag 19 records" in below.stdout and "running:" not in below.stdout
    assert not output.exists()

    kafka.produce(topic, keyed_records(1, partition=0, prefix="late"))  # 20 behind
    past = _watch(env, "--max-runs", "1")

    assert past.returncode == 0, past.stdout + past.stderr
    assert "running: lag 20 records >= lag_records 20" in past.stdout
    tps = [(topic, 0), (topic, 1)]
    committed = group_offsets(kafka.connection, group, tps)
    assert committed == {(topic, 0): 10, (topic, 1): 10}
    expected = oracle(kafka.connection, {tp: (0, committed[tp] or 0) for tp in tps})
    assert published_rows(output) == expected
    [cause] = [json.loads(p.read_text()) for p in (tmp_path / "state" / "runs" / "orders").glob("*/trigger.json")]
    assert cause["cause"] == "lag" and cause["lag_events"][0]["lag_records"] == 20

    # Caught up: the next watch finds nothing to do.
    idle = _watch(env, "--max-checks", "2", "--verbose")
    assert idle.returncode == 0 and "below the thresholds (lag 0 records" in idle.stdout, idle.stdout + idle.stderr


def test_watch_refuses_a_feed_without_trigger(kafka: KafkaTestCluster, tmp_path: Path) -> None:
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    (feeds / "orders.yaml").write_text(yaml.safe_dump({"topics": ["t"], "group": "g"}))
    env = {**os.environ, **kafka.connection.to_env(), "TIDEMARK_FEEDS_DIR": str(feeds)}
    proc = _watch(env, "--max-checks", "1")
    assert proc.returncode == 2 and "has no 'trigger:' section" in proc.stderr, proc.stdout + proc.stderr
