"""A topic deleted and recreated under the same name is a new topic, never a resumed position.

Each test commits 2×100 records of a topic through whole runs, deletes the topic,
recreates it under the same name and refills it with 2×150 records (more than the
checkpoint), then runs the feed again. The feed's whole output must then be exactly the
old topic's records (scanned before the delete) plus an independent ``read_committed``
scan of the new topic: every record once, none missing. Values are unique per record,
so the new topic's offsets 0..99 are told apart from the old topic's.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, Row, oracle
from tidemark.errors import PlanningError
from tidemark.runs.pipeline import CommitOutcome

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def env(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    e = FaultEnv(kafka, spark, tmp_path, "topic-identity", partitions=2)
    e.install(monkeypatch)
    return e


def recreate(env: FaultEnv) -> None:
    """Delete the topic and create it again under the same name (deletion finishes asynchronously)."""
    adapter = env.kafka.adapter
    adapter.delete_topic(env.topic)
    deadline = time.monotonic() + 60
    while env.topic in adapter.admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{env.topic} was not deleted within 60 s"
        time.sleep(0.2)
    adapter.create_topic(env.topic, env.partitions)
    env.sent = 0


def topic_id(env: FaultEnv) -> str:
    """The topic's id as Kafka's admin API gives it."""
    from confluent_kafka import TopicCollection

    futures = env.kafka.adapter.admin.describe_topics(TopicCollection([env.topic]), request_timeout=10)
    return str(futures[env.topic].result(timeout=15).topic_id)


def events(outcome: CommitOutcome) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(Path(outcome.report_path).read_text())["events"]
    return found


def old_topic_output(env: FaultEnv) -> Counter[Row]:
    """The old topic's records committed so far: its own scan, checked against the output now."""
    committed = env.committed()
    assert committed == dict.fromkeys(range(env.partitions), 100)
    scan = oracle(env.kafka.connection, {(env.topic, p): (0, 100) for p in range(env.partitions)})
    assert sum(scan.values()) == 200 and env.published() == scan
    return scan


@pytest.mark.parametrize("cap", [None, 40], ids=["uncapped", "capped"])
def test_recreated_topic_longer_than_the_checkpoint_is_read_from_its_start(env: FaultEnv, cap: int | None) -> None:
    if cap is not None:
        env.write_feed(max_records_per_partition=cap)
    env.produce(200)
    env.run_until_idle(6)
    old = old_topic_output(env)
    old_id = topic_id(env)

    recreate(env)
    new_id = topic_id(env)
    assert new_id and new_id != old_id
    env.produce(300)
    outcomes = env.run_until_idle(6)

    assert env.committed() == {0: 150, 1: 150}
    tps = [(env.topic, p) for p in range(env.partitions)]
    new = oracle(env.kafka.connection, {tp: (0, 150) for tp in tps})
    assert sum(new.values()) == 300
    published = env.published()
    assert not (old + new) - published, f"missing: {sorted((old + new) - published)[:5]}"
    assert published == old + new  # nothing twice, nothing missing

    first = events(outcomes[0])
    recreated = [e for e in first if e["kind"] == "topic_recreated"]
    assert len(recreated) == 1 and recreated[0]["topic"] == env.topic
    assert recreated[0]["details"]["old_topic_id"] == old_id
    assert recreated[0]["details"]["new_topic_id"] == new_id
    committed = env.kafka.adapter.committed(env.group, tps)
    assert {json.loads(c.metadata).get("topic_id") for c in committed.values()} == {new_id}


def test_recreated_topic_with_on_missing_fail_is_refused(env: FaultEnv) -> None:
    env.write_feed(on_missing="fail")
    env.produce(200)
    # A fresh group with on_missing: fail needs a start position: commit 0 on both partitions.
    tps = [(env.topic, p) for p in range(env.partitions)]
    assert set(env.kafka.adapter.alter_committed(env.group, {tp: (0, "") for tp in tps}).values()) == {None}
    env.run_until_idle(6)
    old = old_topic_output(env)
    old_id = topic_id(env)
    recreate(env)
    env.produce(300)

    with pytest.raises(PlanningError) as refused:
        env.run()

    message = str(refused.value)
    assert env.topic in message and old_id in message and topic_id(env) in message
    assert "on_missing is fail" in message and "reset the group's offsets" in message.lower()
    assert env.committed() == {0: None, 1: None}
    assert env.published() == old  # nothing of the new topic published under the old topic's offsets
