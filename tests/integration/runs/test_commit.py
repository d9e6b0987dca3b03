"""The commit protocol against the real cluster, asserting the group's offsets after each case."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import CheckpointStore, SqliteCheckpointStore
from tidemark.errors import CommitError, GroupInUseError, OffsetsMovedError
from tidemark.planning.metadata import metadata_plan_id, metadata_run_id
from tidemark.planning.plan import PartitionPlan, Plan, compute_plan_id
from tidemark.runs.commit import commit_plan

pytestmark = pytest.mark.integration


def hand_plan(kafka: KafkaTestCluster, topic: str, group: str, *, commit: bool = True) -> Plan:
    """A plan from the group's committed offsets (else log start) to the high watermarks."""
    adapter = kafka.adapter
    parts = adapter.partitions([topic])
    tps = [(p.topic, p.partition) for p in parts]
    committed = adapter.committed(group, tps)
    log_start = adapter.log_start_offsets(tps)
    hw = adapter.end_offsets(tps, "read_uncommitted")
    partitions = tuple(
        PartitionPlan(
            topic=p.topic,
            partition=p.partition,
            leader=p.leader,
            committed=committed[tp].offset,
            checkpoint=None,
            log_start=log_start[tp],
            high_watermark=hw[tp],
            end_available=hw[tp],
            start=committed[tp].offset if committed[tp].offset is not None else log_start[tp],
            end=hw[tp],
            reason="committed" if committed[tp].offset is not None else "earliest",
        )
        for p, tp in zip(parts, tps, strict=True)
    )
    feed = "commit-test"
    plan_id = compute_plan_id(feed, group, "scheduled", "read_uncommitted", partitions)
    return Plan(
        plan_id=plan_id,
        feed=feed,
        group=group,
        mode="scheduled",
        commit=commit,
        isolation="read_uncommitted",
        created_at=datetime.now(UTC).isoformat(),
        partitions=partitions,
        tasks=(),
    )


def group_offsets(kafka: KafkaTestCluster, plan: Plan) -> dict[TP, int | None]:
    got = kafka.adapter.committed(plan.group, [p.key for p in plan.partitions])
    return {tp: c.offset for tp, c in got.items()}


@pytest.fixture
def topic(kafka: KafkaTestCluster) -> str:
    name = kafka.new_topic(partitions=3, prefix="commit")
    kafka.produce(name, keyed_records(5, partition=0))
    kafka.produce(name, keyed_records(3, partition=1))
    return name  # partition 2 stays empty: it must still be committed


@pytest.fixture
def group() -> str:
    return f"g-commit-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(checkpoint_store: CheckpointStore) -> CheckpointStore:
    """Every commit case runs against both stores: SQLite (the default) and PostgreSQL (shared)."""
    return checkpoint_store


def join_group(kafka: KafkaTestCluster, topic: str, group: str, protocol: str = "classic") -> Consumer:
    """A subscribed consumer of ``group``, returned once the group assigned it partitions.

    ``protocol`` is the consumer's ``group.protocol``: ``classic`` (JoinGroup/SyncGroup) or ``consumer``
    (Kafka 4's KIP-848 protocol: the broker assigns, the group is of type ``consumer``).
    """
    settings = {"group.id": group, "enable.auto.commit": False, "group.protocol": protocol}
    consumer = Consumer(kafka.connection.client_config(**settings))
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment(), "the live consumer never got an assignment"
    return consumer


PROTOCOLS: dict[int, str] = {}  # id() of a live consumer -> its group.protocol


def live_consumer_protocol(consumer: Consumer) -> str:
    return PROTOCOLS[id(consumer)]


@pytest.fixture(params=["classic", "consumer"])
def live_consumer(
    kafka: KafkaTestCluster, topic: str, group: str, request: pytest.FixtureRequest
) -> Iterator[Consumer]:
    """A live member of the group, by each group protocol: Kafka 4's new consumer groups must block a commit too."""
    consumer = join_group(kafka, topic, group, request.param)
    PROTOCOLS[id(consumer)] = request.param
    try:
        yield consumer
    finally:
        consumer.close()


def test_clean_commit_sets_exactly_the_plan_ends_and_checkpoints(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    plan = hand_plan(kafka, topic, group)
    assert group_offsets(kafka, plan) == {(topic, 0): None, (topic, 1): None, (topic, 2): None}

    result = commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert result.status == "committed"
    assert group_offsets(kafka, plan) == {(topic, 0): 5, (topic, 1): 3, (topic, 2): 0}
    committed = kafka.adapter.committed(group, [p.key for p in plan.partitions])
    assert all(metadata_plan_id(c.metadata) == plan.plan_id for c in committed.values())
    assert all(len(c.metadata.encode()) <= 4096 for c in committed.values())
    checkpoints = store.get(group, plan.ends())
    assert {tp: c.offset for tp, c in checkpoints.items()} == plan.ends()
    assert {c.plan_id for c in checkpoints.values()} == {plan.plan_id}
    assert store.run_committed(group, "run-1")
    assert result.to_dict()["offsets"][0] == {"topic": topic, "partition": 0, "offset": 5}


def test_next_plan_commits_from_the_previous_ends(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    commit_plan(hand_plan(kafka, topic, group), kafka.connection, store, run_id="run-1")
    kafka.produce(topic, keyed_records(4, partition=2))
    second = hand_plan(kafka, topic, group)
    assert [p.committed for p in second.partitions] == [5, 3, 0]

    assert commit_plan(second, kafka.connection, store, run_id="run-2").status == "committed"
    assert group_offsets(kafka, second) == {(topic, 0): 5, (topic, 1): 3, (topic, 2): 4}
    assert {c.plan_id for c in store.get(group, second.ends()).values()} == {second.plan_id}


def test_committing_an_already_committed_plan_is_a_no_op(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    plan = hand_plan(kafka, topic, group)
    commit_plan(plan, kafka.connection, store, run_id="run-1")
    before = kafka.adapter.committed(group, [p.key for p in plan.partitions])
    requests_before = store.get(group, plan.ends())

    again = commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert again.status == "already_committed"
    assert kafka.adapter.committed(group, [p.key for p in plan.partitions]) == before
    assert store.get(group, plan.ends()) == requests_before  # not rewritten


def test_commit_that_died_before_the_checkpoint_is_finished(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore, tmp_path: Path
) -> None:
    plan = hand_plan(kafka, topic, group)
    commit_plan(plan, kafka.connection, SqliteCheckpointStore(tmp_path / "lost.sqlite"), run_id="run-1")
    assert not store.run_committed(group, "run-1")

    result = commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert result.status == "already_committed"
    assert result.notes and "checkpoint" in result.notes[0]
    assert store.run_committed(group, "run-1")
    assert group_offsets(kafka, plan) == plan.ends()


def test_live_consumer_blocks_the_commit(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore, live_consumer: Consumer
) -> None:
    plan = hand_plan(kafka, topic, group)
    # The brokers describe the group as the type its member's protocol made: the guard saw a KIP-848 group.
    assert kafka.adapter.describe_group(group).group_type == live_consumer_protocol(live_consumer)

    with pytest.raises(GroupInUseError, match=rf"group '{group}'.*active member.*{topic}\[0\]"):
        commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert group_offsets(kafka, plan) == {(topic, 0): None, (topic, 1): None, (topic, 2): None}
    assert not store.run_committed(group, "run-1")
    assert store.get(group, plan.ends()) == {}


def test_a_member_joining_between_the_compare_and_the_alter_gets_the_commit_refused(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group is empty when checked; a consumer joins right after the compare-and-set read, before the alter."""
    from tidemark.runs import commit

    joined: list[Consumer] = []
    compare = commit.moved_since_planning

    def compare_then_join(*args: Any) -> tuple[list[str], list[TP]]:
        found = compare(*args)
        joined.append(join_group(kafka, topic, group))
        return found

    monkeypatch.setattr(commit, "moved_since_planning", compare_then_join)
    plan = hand_plan(kafka, topic, group)
    try:
        with pytest.raises(GroupInUseError) as err:
            commit_plan(plan, kafka.connection, store, run_id="run-1")
    finally:
        for consumer in joined:
            consumer.close()

    assert len(joined) == 1
    assert f"group '{group}'" in str(err.value) and "gained members while committing" in str(err.value)
    assert f"{topic}[0] offset 5" in str(err.value) and "stop the live consumer and rerun" in str(err.value)
    assert group_offsets(kafka, plan) == {(topic, 0): None, (topic, 1): None, (topic, 2): None}
    assert not store.run_committed(group, "run-1")
    monkeypatch.setattr(commit, "moved_since_planning", compare)
    assert commit_plan(plan, kafka.connection, store, run_id="run-1").status == "committed"
    assert group_offsets(kafka, plan) == plan.ends()


def test_commit_succeeds_once_the_live_consumer_left(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    consumer = Consumer(kafka.connection.client_config(**{"group.id": group, "enable.auto.commit": False}))
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    plan = hand_plan(kafka, topic, group)
    with pytest.raises(GroupInUseError):
        commit_plan(plan, kafka.connection, store, run_id="run-1")
    consumer.close()

    assert commit_plan(plan, kafka.connection, store, run_id="run-1").status == "committed"
    assert group_offsets(kafka, plan) == plan.ends()


def test_offsets_moved_after_planning_block_the_commit(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    plan = hand_plan(kafka, topic, group)
    # Someone else commits for the group after the plan was made.
    assert kafka.adapter.alter_committed(group, {(topic, 0): (2, "someone else")}) == {(topic, 0): None}

    with pytest.raises(OffsetsMovedError, match=rf"{topic}\[0\] plan saw none, group now at 2"):
        commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert group_offsets(kafka, plan) == {(topic, 0): 2, (topic, 1): None, (topic, 2): None}
    assert not store.run_committed(group, "run-1")


def test_a_retried_commit_of_an_old_run_is_a_no_op_that_never_rewinds_the_group(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    first = hand_plan(kafka, topic, group)
    commit_plan(first, kafka.connection, store, run_id="run-1")
    kafka.produce(topic, keyed_records(2, partition=0))
    second = hand_plan(kafka, topic, group)
    commit_plan(second, kafka.connection, store, run_id="run-2")

    again = commit_plan(first, kafka.connection, store, run_id="run-1")

    assert again.status == "already_committed"
    assert again.notes and f"{topic}[0]=7" in again.notes[0]
    assert group_offsets(kafka, first) == {(topic, 0): 7, (topic, 1): 3, (topic, 2): 0}


def test_a_new_run_of_the_same_plan_after_the_group_offsets_vanished_commits(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    """Issue 14: an idle feed plans the same ranges (same plan id) again after expiry."""
    commit_plan(hand_plan(kafka, topic, group), kafka.connection, store, run_id="run-1")
    idle = hand_plan(kafka, topic, group)  # nothing new: [end, end) everywhere
    commit_plan(idle, kafka.connection, store, run_id="run-2")
    kafka.adapter.admin.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=10)
    resumed = replace(idle, partitions=tuple(replace(p, committed=None, checkpoint=p.end) for p in idle.partitions))
    assert resumed.plan_id == idle.plan_id  # same ranges, same plan id: only the run differs

    result = commit_plan(resumed, kafka.connection, store, run_id="run-3")

    assert result.status == "committed"
    assert group_offsets(kafka, idle) == idle.ends()
    got = kafka.adapter.committed(group, [p.key for p in idle.partitions])
    assert {metadata_run_id(c.metadata) for c in got.values()} == {"run-3"}
    assert store.run_committed(group, "run-3")


def test_a_group_reset_to_offsets_it_already_had_is_committed_by_the_next_run(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    first = hand_plan(kafka, topic, group)
    commit_plan(first, kafka.connection, store, run_id="run-1")
    # An operator resets the group to where the first run started (kafka-consumer-groups --reset-offsets).
    start = {p.key: (p.start, "") for p in first.partitions}
    assert set(kafka.adapter.alter_committed(group, start).values()) == {None}
    again = hand_plan(kafka, topic, group)
    assert again.plan_id == first.plan_id and again.ends() == first.ends()

    result = commit_plan(again, kafka.connection, store, run_id="run-2")

    assert result.status == "committed"
    assert group_offsets(kafka, first) == first.ends()


def test_a_position_changed_by_another_writer_names_the_writer(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    plan = hand_plan(kafka, topic, group)
    other = hand_plan(kafka, topic, group)
    commit_plan(other, kafka.connection, store, run_id="run-other")

    with pytest.raises(OffsetsMovedError, match=rf"{topic}\[0\] plan saw none, group now at 5 .*run-other"):
        commit_plan(plan, kafka.connection, store, run_id="run-1")
    assert not store.run_committed(group, "run-1")


def test_expired_group_offsets_are_committed_and_reported(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    kafka.adapter.alter_committed(group, {(topic, 0): (1, "earlier"), (topic, 1): (1, "earlier")})
    plan = hand_plan(kafka, topic, group)
    # Offsets vanish as retention would delete them (the group has no members).
    future = kafka.adapter.admin.delete_consumer_groups([group], request_timeout=10)[group]
    future.result(timeout=10)

    result = commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert result.status == "committed"
    assert set(result.expired) == {(topic, 0), (topic, 1)}
    assert group_offsets(kafka, plan) == plan.ends()


def test_plan_made_without_commit_is_refused(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    plan = hand_plan(kafka, topic, group, commit=False)
    with pytest.raises(CommitError, match="without commit"):
        commit_plan(plan, kafka.connection, store, run_id="run-1")
    assert group_offsets(kafka, plan) == {(topic, 0): None, (topic, 1): None, (topic, 2): None}


def join_share_group(kafka: KafkaTestCluster, topic: str, group: str) -> None:
    """Makes ``group`` a share group (KIP-932): a share consumer joins it and acquires a record, then leaves."""
    from confluent_kafka import ShareConsumer

    consumer = ShareConsumer(kafka.connection.client_config(**{"group.id": group}))
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        got = 0
        while not got and time.monotonic() < deadline:
            kafka.produce(topic, keyed_records(1, partition=2))  # a share group starts at the latest offset
            got = len(consumer.poll(1.0))
        assert got, "the share consumer never received a record"
    finally:
        consumer.close()


def test_a_share_group_as_the_feeds_group_is_refused_naming_it(
    kafka: KafkaTestCluster, topic: str, group: str, store: CheckpointStore
) -> None:
    """Kafka 4's share groups keep per-record state, not offsets: the commit must say so, not fail obscurely."""
    plan = hand_plan(kafka, topic, group)
    join_share_group(kafka, topic, group)

    assert kafka.adapter.describe_group(group).group_type == "other"
    with pytest.raises(GroupInUseError) as err:
        commit_plan(plan, kafka.connection, store, run_id="run-1")

    assert f"group '{group}'" in str(err.value) and "not a consumer group" in str(err.value)
    assert "share group (KIP-932)" in str(err.value) and "group id of its own" in str(err.value)
    assert not store.run_committed(group, "run-1")
