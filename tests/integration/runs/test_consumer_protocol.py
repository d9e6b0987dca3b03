"""Kafka 4's consumer groups (KIP-848, ``group.protocol=consumer``) in the lag view and the expiry checks.

The commit guard's cases with live members of both protocols are in ``test_commit.py``;
here a group of type ``consumer`` (its members gone, as between a streaming consumer's
deploys) is read by the lag view and committed over after its offsets vanished, on the
real cluster (Kafka 4.3, where the new group coordinator is the default).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from tests.conftest import KafkaTestCluster, keyed_records
from tests.integration.runs.test_commit import group_offsets, hand_plan, join_group
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import Feed
from tidemark.runs.commit import commit_plan
from tidemark.runs.status import feed_status

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka: KafkaTestCluster) -> str:
    name = kafka.new_topic(partitions=2, prefix="kip848")
    kafka.produce(name, keyed_records(6, partition=0))
    kafka.produce(name, keyed_records(4, partition=1))
    return name


@pytest.fixture
def group(kafka: KafkaTestCluster, topic: str) -> str:
    """A group of type ``consumer``: a KIP-848 member committed offsets 2 and 1, then left."""
    name = f"g-kip848-{uuid.uuid4().hex[:10]}"
    consumer = join_group(kafka, topic, name, "consumer")
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 1)], asynchronous=False)
    finally:
        consumer.close()
    info = kafka.adapter.describe_group(name)
    assert (info.group_type, info.state, info.members) == ("consumer", "empty", ())
    return name


def test_the_lag_view_reads_a_consumer_protocol_groups_offsets(kafka: KafkaTestCluster, topic: str, group: str,
                                                                tmp_path: Path) -> None:  # fmt: skip
    feed = Feed(name="kip848", topics=(topic,), group=group, isolation="read_uncommitted")

    status = feed_status(feed, kafka.adapter, SqliteCheckpointStore(tmp_path / "cp.sqlite"), lag_times=True)

    assert {p.partition: (p.committed, p.lag) for p in status.partitions} == {0: (2, 4), 1: (1, 3)}
    assert status.total_lag == 7 and all(p.lag_ms is not None for p in status.partitions)


def test_a_consumer_protocol_group_whose_offsets_vanished_is_committed_and_reported(
    kafka: KafkaTestCluster, topic: str, group: str, tmp_path: Path
) -> None:
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    plan = hand_plan(kafka, topic, group)
    assert {p.partition: p.start for p in plan.partitions} == {0: 2, 1: 1}
    # Offsets vanish as retention would delete them (the group has no members).
    kafka.adapter.admin.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=10)

    result = commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert result.status == "committed" and set(result.expired) == {(topic, 0), (topic, 1)}
    assert group_offsets(kafka, plan) == plan.ends() == {(topic, 0): 6, (topic, 1): 4}


def test_a_consumer_protocol_group_whose_members_left_is_committed_from_its_offsets(
    kafka: KafkaTestCluster, topic: str, group: str, tmp_path: Path
) -> None:
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    plan = hand_plan(kafka, topic, group)

    assert commit_plan(plan, kafka.connection, store, run_id="run-1").status == "committed"
    assert group_offsets(kafka, plan) == {(topic, 0): 6, (topic, 1): 4}
    assert store.run_committed(group, "run-1")
