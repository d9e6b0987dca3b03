"""The planner against the real cluster: one test per situation the issue names.

Each test makes its own topic and group (uuid names), drives Kafka into the situation
with the admin API (DeleteRecords, deleting a group, recreating a topic, adding
partitions, an open transaction) and checks the plan's ranges, reasons and events.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark import cli
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import Feed
from tidemark.errors import DataLossError, OffsetAheadError, PlanningError, TidemarkError
from tidemark.planning.plan import Plan, PlanStore
from tidemark.planning.requests import ReplaySpec, RunRequest, Window
from tidemark.runs.gather import plan_feed, snapshot_feed

pytestmark = pytest.mark.integration

# Recent timestamps: the cluster runs time retention every second, and records stamped
# with keyed_records' default (2023) are older than any topic's retention.ms, so deleted.
BASE_TS = (int(time.time()) - 600) * 1000  # the first record's timestamp; records are 1 s apart
TIMEOUT_S = 15.0


def make_feed(topic: str, **kw: Any) -> Feed:
    return Feed(name=f"it-{uuid.uuid4().hex[:8]}", topics=(topic,), group=f"g-{uuid.uuid4().hex[:10]}", **kw)


@pytest.fixture
def store(tmp_path: Path) -> SqliteCheckpointStore:
    return SqliteCheckpointStore(tmp_path / "checkpoints.sqlite")


PASSING_COMMIT_ERRORS = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                         KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE}  # fmt: skip


def commit(kafka: KafkaTestCluster, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """Commit offsets for an empty group from outside, as Tidemark's commit step does; retried on a
    retriable error (a coordinator that does not know a just-created topic or partition yet, brokers
    learning of it one by one; or one still loading the offsets partition)."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in offsets.items()])
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        futures = kafka.adapter.admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)
        errors = [tp.error for tp in futures[group].result(timeout=TIMEOUT_S).topic_partitions if tp.error]
        if not errors:
            return
        passing = all(e.code() in PASSING_COMMIT_ERRORS for e in errors)
        assert passing and time.monotonic() < deadline, f"committing {dict(offsets)} for {group}: {errors}"
        time.sleep(0.3)


def try_commit(kafka: KafkaTestCluster, group: str, offsets: Mapping[tuple[str, int], int]) -> bool:
    """Commit, or False on a failure :func:`commit` does not wait out itself (a request-level error, a deadline)."""
    try:
        commit(kafka, group, offsets)
    except (KafkaException, AssertionError):
        return False
    return True


def delete_group(kafka: KafkaTestCluster, group: str) -> None:
    futures = kafka.adapter.admin.delete_consumer_groups([group], request_timeout=TIMEOUT_S)
    futures[group].result(timeout=TIMEOUT_S)


def fill(kafka: KafkaTestCluster, topic: str, counts: Mapping[int, int]) -> None:
    for partition, count in counts.items():
        kafka.produce(topic, keyed_records(count, partition=partition, base_ts_ms=BASE_TS, prefix=f"p{partition}"))


def wait_for(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def by_partition(plan: Plan) -> dict[int, tuple[int, int, str]]:
    return {p.partition: (p.start, p.end, p.reason) for p in plan.partitions}


def event_kinds(plan: Plan, partition: int | None = None) -> list[str]:
    return [e.kind for e in plan.events if partition is None or e.partition == partition]


# -- a new group under each on_missing policy ---------------------------------------------


@pytest.mark.parametrize("on_missing", ["earliest", "latest", "timestamp", "fail"])
def test_new_group_under_each_on_missing(
    kafka: KafkaTestCluster, store: SqliteCheckpointStore, on_missing: str
) -> None:
    topic = kafka.new_topic(partitions=2)
    fill(kafka, topic, {0: 10, 1: 6})
    reset_ts = datetime.fromtimestamp((BASE_TS + 4_000) / 1000, UTC) if on_missing == "timestamp" else None
    feed = make_feed(topic, on_missing=on_missing, reset_timestamp=reset_ts)
    if on_missing == "fail":
        with pytest.raises(PlanningError, match=rf"{topic}\[0\], {topic}\[1\] and on_missing is fail"):
            plan_feed(feed, kafka.adapter, store)
        return
    plan = plan_feed(feed, kafka.adapter, store)
    expected = {
        "earliest": {0: (0, 10, "earliest"), 1: (0, 6, "earliest")},
        "latest": {0: (10, 10, "latest"), 1: (6, 6, "latest")},
        "timestamp": {0: (4, 10, "timestamp"), 1: (4, 6, "timestamp")},
    }[on_missing]
    assert by_partition(plan) == expected
    assert event_kinds(plan) == ["reset", "reset"]
    assert plan.commit is True and plan.mode == "scheduled"


def test_reset_timestamp_after_every_record_starts_at_the_end(
    kafka: KafkaTestCluster, store: SqliteCheckpointStore
) -> None:
    topic = kafka.new_topic(partitions=1)
    fill(kafka, topic, {0: 5})
    feed = make_feed(topic, on_missing="timestamp", reset_timestamp=datetime(2030, 1, 1, tzinfo=UTC))
    plan = plan_feed(feed, kafka.adapter, store)
    assert by_partition(plan) == {0: (5, 5, "timestamp")}
    assert event_kinds(plan) == ["timestamp_past_end", "reset"]


# -- group offsets expired (deleted), with and without a checkpoint ------------------------


@pytest.mark.parametrize("with_checkpoint", [True, False], ids=["checkpoint", "no-checkpoint"])
def test_group_offsets_expired(kafka: KafkaTestCluster, store: SqliteCheckpointStore, with_checkpoint: bool) -> None:
    topic = kafka.new_topic(partitions=2)
    fill(kafka, topic, {0: 10, 1: 10})
    feed = make_feed(topic, on_missing="latest")
    offsets = {(topic, 0): 3, (topic, 1): 7}
    commit(kafka, feed.group, offsets)
    if with_checkpoint:
        store.put(feed.group, "plan-before", offsets, "run-before")
    assert by_partition(plan_feed(feed, kafka.adapter, store)) == {0: (3, 10, "committed"), 1: (7, 10, "committed")}

    delete_group(kafka, feed.group)
    assert all(c.offset is None for c in kafka.adapter.committed(feed.group, list(offsets)).values())
    plan = plan_feed(feed, kafka.adapter, store)
    if with_checkpoint:
        assert by_partition(plan) == {0: (3, 10, "checkpoint"), 1: (7, 10, "checkpoint")}
        assert event_kinds(plan) == ["group_offsets_expired", "group_offsets_expired"]
        assert "resuming from Tidemark's checkpoint 3" in plan.events[0].message
    else:
        # Without a checkpoint the reset policy decides, and says so.
        assert by_partition(plan) == {0: (10, 10, "latest"), 1: (10, 10, "latest")}
        assert event_kinds(plan) == ["reset", "reset"]


# -- committed offset below the log start after DeleteRecords -----------------------------


@pytest.mark.parametrize("on_data_loss", ["fail", "skip"])
def test_committed_below_log_start(kafka: KafkaTestCluster, store: SqliteCheckpointStore, on_data_loss: str) -> None:
    topic = kafka.new_topic(partitions=2, config={"retention.ms": "3600000"})
    fill(kafka, topic, {0: 10, 1: 10})
    feed = make_feed(topic, on_data_loss=on_data_loss)
    commit(kafka, feed.group, {(topic, 0): 2, (topic, 1): 4})
    assert kafka.adapter.delete_records({(topic, 0): 6}) == {(topic, 0): 6}
    if on_data_loss == "fail":
        with pytest.raises(DataLossError) as info:
            plan_feed(feed, kafka.adapter, store)
        message = str(info.value)
        assert f"{topic}[0] committed offset 2 is below the log start 6" in message
        assert "records [2, 6) were deleted unread" in message
        assert "retention.ms=3600000" in message
        assert f"{topic}[1]" not in message
        return
    plan = plan_feed(feed, kafka.adapter, store)
    assert by_partition(plan) == {0: (6, 10, "log_start"), 1: (4, 10, "committed")}
    (event,) = plan.events
    assert (event.kind, event.partition, event.details["lost_start"], event.details["lost_end"]) == (
        "data_loss",
        0,
        2,
        6,
    )
    assert event.details["retention_ms"] == 3_600_000


# -- start above the end after the topic is recreated -------------------------------------


def recreate(kafka: KafkaTestCluster, topic: str, partitions: int) -> None:
    kafka.adapter.delete_topic(topic)

    def gone() -> bool:
        try:
            kafka.adapter.partitions([topic])
        except TidemarkError:
            return True
        return False

    wait_for(gone, f"topic {topic} to be deleted")

    def back() -> bool:
        kafka.adapter.create_topic(topic, partitions)
        try:
            return len(kafka.adapter.partitions([topic])) == partitions
        except TidemarkError:
            return False

    wait_for(back, f"topic {topic} to be created again")


@pytest.mark.parametrize(
    ("source", "on_ahead"), [("checkpoint", "fail"), ("committed", "fail"), ("committed", "earliest")]
)
def test_start_above_end_after_topic_recreated(
    kafka: KafkaTestCluster, store: SqliteCheckpointStore, source: str, on_ahead: str
) -> None:
    topic = kafka.new_topic(partitions=1)
    fill(kafka, topic, {0: 20})
    feed = make_feed(topic, on_ahead=on_ahead)
    commit(kafka, feed.group, {(topic, 0): 20})
    store.put(feed.group, "plan-before", {(topic, 0): 20}, "run-before")
    recreate(kafka, topic, 1)
    # Kafka drops a deleted topic's committed offsets (asynchronously); Tidemark's checkpoint survives.
    wait_for(
        lambda: kafka.adapter.committed(feed.group, [(topic, 0)])[(topic, 0)].offset is None,
        "the group's offsets of the deleted topic to be dropped",
    )
    if source == "committed":
        # A stale client (kept its position across the recreate) commits the old offset again.
        wait_for(lambda: try_commit(kafka, feed.group, {(topic, 0): 20}), "the stale commit to be accepted")
    fill(kafka, topic, {0: 5})
    if on_ahead == "fail":
        with pytest.raises(OffsetAheadError) as info:
            plan_feed(feed, kafka.adapter, store)
        assert f"{topic}[0] {source} offset 20 is past the high watermark 5" in str(info.value)
        return
    plan = plan_feed(feed, kafka.adapter, store)
    assert by_partition(plan) == {0: (0, 5, "ahead_reset")}
    assert event_kinds(plan) == ["offset_ahead"]
    assert plan.events[0].details["was"] == 20


# -- an open transaction holds the LSO below the high watermark ---------------------------


@pytest.fixture
def open_transaction(kafka: KafkaTestCluster) -> Iterator[tuple[str, Producer]]:
    topic = kafka.new_topic(partitions=1)
    fill(kafka, topic, {0: 5})
    producer = Producer(kafka.connection.client_config(**{"transactional.id": f"tx-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"tx-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    try:
        yield topic, producer
    finally:
        producer.abort_transaction(30)


def test_open_transaction_holds_lso_below_hw(
    kafka: KafkaTestCluster, store: SqliteCheckpointStore, open_transaction: tuple[str, Producer]
) -> None:
    topic, producer = open_transaction
    committed = plan_feed(make_feed(topic, isolation="read_committed"), kafka.adapter, store)
    (p,) = committed.partitions
    assert (p.high_watermark, p.end_available, p.start, p.end) == (8, 5, 0, 5)
    uncommitted = plan_feed(make_feed(topic, isolation="read_uncommitted"), kafka.adapter, store)
    (u,) = uncommitted.partitions
    assert (u.high_watermark, u.end_available, u.end) == (8, 8, 8)

    # The end is frozen at plan time: finishing the transaction later does not move it.
    producer.commit_transaction(30)
    producer.begin_transaction()  # the fixture's abort then closes an empty transaction
    assert committed.partitions[0].end == 5
    # The coordinator writes the commit marker after EndTxn returns: wait for the LSO to pass it.
    wait_for(lambda: kafka.adapter.end_offsets([(topic, 0)], "read_committed")[(topic, 0)] == 9, "the commit marker")
    again = plan_feed(make_feed(topic, isolation="read_committed"), kafka.adapter, store)
    assert again.partitions[0].end == again.partitions[0].end_available == 9  # 5 + 3 + commit marker


# -- a timestamp window past the last record ----------------------------------------------


@pytest.mark.parametrize(
    ("start_s", "end_s", "expected", "which"),
    [
        pytest.param(100, 200, {0: (10, 10), 1: (4, 4)}, ["start", "start"], id="whole-window-past-end"),
        pytest.param(3, 100, {0: (3, 10), 1: (3, 4)}, ["end", "end"], id="window-end-past-end"),
        pytest.param(2, 5, {0: (2, 5), 1: (2, 4)}, ["end"], id="one-partition-ends-early"),
    ],
)
def test_backfill_window_past_last_record(
    kafka: KafkaTestCluster,
    store: SqliteCheckpointStore,
    start_s: int,
    end_s: int,
    expected: dict[int, tuple[int, int]],
    which: list[str],
) -> None:
    topic = kafka.new_topic(partitions=2)
    fill(kafka, topic, {0: 10, 1: 4})
    feed = make_feed(topic)
    commit(kafka, feed.group, {(topic, 0): 1, (topic, 1): 1})  # a backfill ignores committed offsets
    at = datetime.fromtimestamp(BASE_TS / 1000, UTC)
    window = Window(at + timedelta(seconds=start_s), at + timedelta(seconds=end_s))
    # offset_cut: Kafka's offsets-for-times rule; exact windows: test_time_windows.py
    plan = plan_feed(feed, kafka.adapter, store, RunRequest("backfill", window=window, window_mode="offset_cut"))
    assert {k: (s, e) for k, (s, e, _) in by_partition(plan).items()} == expected
    assert {p.reason for p in plan.partitions} == {"timestamp"}
    assert [e.details["which"] for e in plan.events if e.kind == "timestamp_past_end"] == which
    assert plan.commit is False and plan.window["end"] is not None
    assert all(-1 not in (p.start, p.end) for p in plan.partitions)


# -- a partition added to a topic ---------------------------------------------------------


@pytest.mark.parametrize(("on_new_partition", "start"), [("earliest", 0), ("latest", 7)])
def test_added_partition(
    kafka: KafkaTestCluster, store: SqliteCheckpointStore, on_new_partition: str, start: int
) -> None:
    topic = kafka.new_topic(partitions=2)
    fill(kafka, topic, {0: 4, 1: 4})
    feed = make_feed(topic, on_missing="fail", on_new_partition=on_new_partition)
    commit(kafka, feed.group, {(topic, 0): 4, (topic, 1): 4})
    kafka.adapter.add_partitions(topic, 3)
    # Brokers learn of the new partition one by one: produce with a client whose own metadata has it
    # (a new producer asking a broker that has not yet fails each record with "Unknown partition").
    producer = Producer(kafka.connection.client_config())
    wait_for(lambda: len(producer.list_topics(topic, timeout=10).topics[topic].partitions) == 3, "the third partition")
    failed: list[Any] = []
    for record in keyed_records(7, partition=2, base_ts_ms=BASE_TS, prefix="p2"):
        producer.produce(topic, record.value, record.key, partition=2, timestamp=record.timestamp_ms,
                         on_delivery=lambda err, _: failed.append(err) if err else None)  # fmt: skip
    assert producer.flush(30) == 0 and not failed, failed
    plan = plan_feed(feed, kafka.adapter, store)
    assert by_partition(plan) == {0: (4, 4, "committed"), 1: (4, 4, "committed"), 2: (start, 7, on_new_partition)}
    assert event_kinds(plan) == ["new_partition"]
    assert plan.events[0].partition == 2


# -- caps split a large backlog over several runs -----------------------------------------


def test_caps_split_backlog_over_runs(kafka: KafkaTestCluster, store: SqliteCheckpointStore) -> None:
    topic = kafka.new_topic(partitions=3)
    fill(kafka, topic, {0: 300, 1: 300, 2: 300})
    feed = make_feed(topic, max_records_per_run=400, max_records_per_partition=200, records_per_task=100)
    ranges: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
    totals = []
    leaders = {p.partition: p.leader for p in kafka.adapter.partitions([topic])}
    for _ in range(6):
        plan = plan_feed(feed, kafka.adapter, store)
        if plan.total_records == 0:
            break
        totals.append(plan.total_records)
        assert all(p.records <= 200 for p in plan.partitions)
        assert "capped" in event_kinds(plan) or plan.total_records < 400
        for task in plan.tasks:
            assert task.records <= 100
            assert {leaders[c.partition] for c in task.chunks} == {task.leader}
        for p in plan.partitions:
            if p.records:
                ranges[p.partition].append((p.start, p.end))
        # what a successful run does at its end: commit the plan's ends, then checkpoint
        commit(kafka, feed.group, plan.ends())
        store.put(feed.group, plan.plan_id, plan.ends(), "run-1")
    assert totals == [400, 400, 100]
    for spans in ranges.values():
        assert spans[0][0] == 0 and spans[-1][1] == 300
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


# -- replays -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"start_from": "shift_by", "shift_by": -3}, {0: (3, 10), 1: (3, 10)}, id="shift-back"),
        pytest.param(
            {"start_from": "timestamp", "start_seconds": 5, "end_at": "offset", "end_offset": 8},
            {0: (5, 8), 1: (5, 8)},
            id="timestamp-to-offset",
        ),
        pytest.param(
            {"start_from": "earliest", "end_at": "timestamp", "end_seconds": 4},
            {0: (0, 4), 1: (0, 4)},
            id="earliest-to-timestamp",
        ),
        pytest.param({"start_from": "committed"}, {0: (6, 10), 1: (6, 10)}, id="committed"),
    ],
)
def test_replay(
    kafka: KafkaTestCluster, store: SqliteCheckpointStore, spec: dict[str, Any], expected: dict[int, tuple[int, int]]
) -> None:

    topic = kafka.new_topic(partitions=2)
    fill(kafka, topic, {0: 10, 1: 10})
    feed = make_feed(topic)
    commit(kafka, feed.group, {(topic, 0): 6, (topic, 1): 6})
    at = datetime.fromtimestamp(BASE_TS / 1000, UTC)
    args = dict(spec)
    if "start_seconds" in args:
        args["start_timestamp"] = at + timedelta(seconds=args.pop("start_seconds"))
    if "end_seconds" in args:
        args["end_timestamp"] = at + timedelta(seconds=args.pop("end_seconds"))
    plan = plan_feed(
        feed, kafka.adapter, store, RunRequest("replay", replay=ReplaySpec(**args), window_mode="offset_cut")
    )
    assert {k: (s, e) for k, (s, e, _) in by_partition(plan).items()} == expected
    assert plan.mode == "replay" and plan.commit is False
    # the group's offsets are untouched by planning
    assert {c.offset for c in kafka.adapter.committed(feed.group, [(topic, 0), (topic, 1)]).values()} == {6}


# -- batching, retention warnings, saved plans, the CLI ------------------------------------


def test_requests_do_not_grow_with_partitions(kafka: KafkaTestCluster, store: SqliteCheckpointStore) -> None:
    small, large = kafka.new_topic(partitions=3), kafka.new_topic(partitions=60)
    counts = []
    for topic in (small, large):
        feed = make_feed(topic, on_missing="earliest")
        plan_feed(feed, kafka.adapter, store)  # warm-up: a new topic's leaders may still be settling (retries)
        before = kafka.adapter.requests
        plan = plan_feed(feed, kafka.adapter, store)
        counts.append(kafka.adapter.requests - before)
        assert len(plan.partitions) == len(kafka.adapter.partitions([topic]))
    assert counts[0] == counts[1] <= 7


def test_retention_warnings_from_real_configs(kafka: KafkaTestCluster, store: SqliteCheckpointStore) -> None:
    topic = kafka.new_topic(partitions=1, config={"retention.ms": "3600000"})
    snap = snapshot_feed(make_feed(topic, schedule="@monthly"), kafka.adapter, store)
    broker_ms = snap.retention.offsets_retention_ms
    assert broker_ms is not None and broker_ms > 0
    assert snap.retention.topic_retention_ms == {topic: 3_600_000}
    plan = plan_feed(make_feed(topic, schedule="@monthly"), kafka.adapter, store)
    warnings = [e for e in plan.events if e.kind == "retention_warning"]
    assert [w.topic for w in warnings] == ([None, topic] if broker_ms < 31 * 86_400_000 else [topic])
    hourly = plan_feed(make_feed(topic, schedule="@hourly"), kafka.adapter, store)
    assert "retention_warning" not in event_kinds(hourly)


def test_saved_plan_loads_to_the_same_ranges(
    kafka: KafkaTestCluster, store: SqliteCheckpointStore, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=3)
    fill(kafka, topic, {0: 5, 2: 9})
    feed = make_feed(topic)
    plan = plan_feed(feed, kafka.adapter, store)
    assert [p.partition for p in plan.partitions] == [0, 1, 2]  # the empty partition is in the plan
    plans = PlanStore(tmp_path)
    plans.save(plan)
    again = plan_feed(feed, kafka.adapter, store)
    assert again.plan_id == plan.plan_id  # nothing moved: same ranges, same id
    first, second = plans.load(feed.name, plan.plan_id), plans.load(feed.name, plan.plan_id)
    assert list(first.ranges()) == list(second.ranges()) == [(topic, 0, 0, 5), (topic, 1, 0, 0), (topic, 2, 0, 9)]


def test_cli_plan_and_status(
    kafka: KafkaTestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = kafka.new_topic(partitions=2)
    fill(kafka, topic, {0: 6, 1: 3})
    group = f"g-{uuid.uuid4().hex[:10]}"
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    (feeds / "clifeed.yaml").write_text(f"topics: [{topic}]\ngroup: {group}\nrecords_per_task: 4\n")
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TIDEMARK_BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    commit(kafka, group, {(topic, 0): 2})

    assert cli.main(["plan", "clifeed", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = Plan.from_dict(doc)
    assert list(plan.ranges()) == [(topic, 0, 2, 6), (topic, 1, 0, 3)]
    assert (tmp_path / "state" / "plans" / "clifeed" / f"{plan.plan_id}.json").exists()

    assert cli.main(["plan", "clifeed"]) == 0
    out = capsys.readouterr().out
    assert "partition" in out and "reason" in out and "events" in out
    assert f"{topic}[1]" in out and "new_partition" in out  # p1 has no offset, p0 has one
    assert "total: 7 records in 2 of 2 partitions" in out
    assert plan.plan_id in out

    assert cli.main(["status", "clifeed"]) == 0
    out = capsys.readouterr().out
    assert "lag" in out and "total lag 4" in out
    assert "1 partitions have no committed offset and no checkpoint" in out

    (feeds / "strict.yaml").write_text(f"topics: [{topic}]\ngroup: {group}-x\non_missing: fail\n")
    assert cli.main(["plan", "strict"]) == 2
    assert "on_missing is fail" in capsys.readouterr().err
