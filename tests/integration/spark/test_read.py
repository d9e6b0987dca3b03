"""The tidemark_kafka data source against the real cluster: exact ranges, gaps, failures."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.errors import AnalysisException

from tests.conftest import KafkaTestCluster, keyed_records
from tests.integration.read_helpers import consume_independently, plan_for
from tidemark.devtools.kafka.cluster import LocalCluster
from tidemark.errors import LocalKafkaError, ReadError
from tidemark.kafka.admin import Record
from tidemark.spark.source import (
    SCHEMA,
    SOURCE_NAME,
    DriverReadTooLarge,
    read_plan,
    read_plan_in_driver,
    read_task,
    register,
    tasks_of,
)
from tidemark.spark.stats import check_complete, range_stats

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Records stamped in 2023 (fixed, so statistics are exact) on topics that keep them.
KEEP = {"retention.ms": "-1"}
BASE_TS = 1_700_000_000_000


def _restart(cluster: LocalCluster, node_id: int) -> None:
    """Start the node again unless another session sharing the cluster already did."""
    if node_id in {n.node_id for n in cluster.running_nodes()}:
        return
    try:
        cluster.start_node(node_id)
    except LocalKafkaError:
        if node_id not in {n.node_id for n in cluster.running_nodes()}:
            raise


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (r.topic, r.partition, r.offset, None if r.key is None else bytes(r.key),
         None if r.value is None else bytes(r.value))
        for r in df.select("topic", "partition", "offset", "key", "value").collect()
    )  # fmt: skip


def test_reads_exactly_the_planned_ranges(kafka: KafkaTestCluster, spark: Any) -> None:
    topic = kafka.new_topic(partitions=4, config=KEEP, prefix="read-exact")
    for p in range(4):
        kafka.produce(topic, keyed_records(250 + 50 * p, partition=p, prefix=f"p{p}", base_ts_ms=BASE_TS))
    kafka.produce(topic, [Record(value=b"h", key=b"hk", partition=0, headers=(("a", b"1"), ("b", b"")))])
    # Sub-ranges that start and end inside each partition, split into small chunks.
    starts = {(topic, p): 10 * p for p in range(4)}
    ends = {(topic, 0): 251, (topic, 1): 290, (topic, 2): 333, (topic, 3): 399}
    plan = plan_for(kafka.adapter, [topic], starts=starts, ends=ends, chunk_records=70)

    df = read_plan(spark, plan, kafka.connection, batch_records=64)
    assert df.rdd.getNumPartitions() == len(plan.tasks)
    assert _rows(df) == consume_independently(kafka.connection, plan)
    assert df.count() == plan.total_records

    header_row = df.where("offset = 250 and partition = 0").collect()[0]
    assert [(h.key, bytes(h.value)) for h in header_row.headers] == [("a", b"1"), ("b", b"")]
    assert header_row.timestamp_type == 0  # CreateTime, Java's id
    assert {r.plan_id for r in df.select("plan_id").distinct().collect()} == {plan.plan_id}

    stats = {(s.topic, s.partition): s for s in range_stats(df, plan)}
    s1 = stats[(topic, 1)]
    assert (s1.records, s1.first_offset, s1.last_offset, s1.gaps) == (280, 10, 289, 0)
    assert s1.min_timestamp_ms == BASE_TS + 10 * 1000
    assert s1.max_timestamp_ms == BASE_TS + 289 * 1000
    assert s1.bytes == sum(len(f"p1-{i}") + len(f"v-{i}") for i in range(10, 290))
    assert check_complete(list(stats.values())) == []


def test_driver_read_yields_what_the_data_source_reads(
    kafka: KafkaTestCluster, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small plans are read by the driver (no Python workers): the same rows, columns and statistics."""
    topic = kafka.new_topic(partitions=3, config=KEEP, prefix="read-driver")
    for p in range(3):
        kafka.produce(topic, keyed_records(120 + 30 * p, partition=p, prefix=f"p{p}", base_ts_ms=BASE_TS))
    kafka.produce(topic, [Record(value=None, key=b"tomb", partition=1, headers=(("a", b"1"), ("b", b"")))])
    plan = plan_for(kafka.adapter, [topic], starts={(topic, 0): 7}, chunk_records=50)

    in_driver = read_plan_in_driver(spark, plan, kafka.connection, batch_records=64)
    through_source = read_plan(spark, plan, kafka.connection, batch_records=64)
    assert in_driver.schema == through_source.schema == SCHEMA
    assert sorted(in_driver.collect()) == sorted(through_source.collect())
    assert _rows(in_driver) == consume_independently(kafka.connection, plan)
    assert range_stats(in_driver, plan) == range_stats(through_source, plan)
    tomb = in_driver.where(f"partition = 1 and offset = {plan.partitions[1].end - 1}").collect()[0]
    assert tomb.value is None and [(h.key, bytes(h.value)) for h in tomb.headers] == [("a", b"1"), ("b", b"")]

    # Above LOCAL_RELATION_MAX_RECORDS the batches reach Spark as an RDD (decoded by the
    # write's tasks, not by the optimizer in the driver): the same rows, and the session's
    # setting is left as it was.
    key = "spark.sql.execution.arrow.localRelationThreshold"
    before = spark.conf.get(key)
    monkeypatch.setattr("tidemark.spark.source.LOCAL_RELATION_MAX_RECORDS", 100)
    as_rdd = read_plan_in_driver(spark, plan, kafka.connection, batch_records=64)
    assert "LocalRelation" in in_driver._jdf.queryExecution().analyzed().toString()
    assert "LocalRelation" not in as_rdd._jdf.queryExecution().analyzed().toString()
    assert sorted(as_rdd.collect()) == sorted(through_source.collect())
    assert spark.conf.get(key) == before

    # A plan whose records pass the byte budget is refused before it is all held.
    with pytest.raises(DriverReadTooLarge, match=rf"plan {plan.plan_id}: the first \d+ of its {plan.total_records}"):
        read_plan_in_driver(spark, plan, kafka.connection, batch_records=64, max_bytes=4096)

    # A short read fails in the driver as in an executor, naming the partition and offsets.
    kafka.adapter.delete_records({(topic, 2): 40})
    with pytest.raises(ReadError, match=rf"{topic}\[2\] offsets \[0, 180\).*offset 0 is no longer available"):
        read_plan_in_driver(spark, plan, kafka.connection)


def test_columns_the_plan_fixes_are_added_by_spark_not_sent_by_the_reader(kafka: KafkaTestCluster, spark: Any) -> None:
    """``plan_id`` (and ``topic`` for a one-topic plan) skip the Arrow batches; read_plan's rows stay the same."""
    one = kafka.new_topic(partitions=2, config=KEEP, prefix="read-const-a")
    two = kafka.new_topic(partitions=1, config=KEEP, prefix="read-const-b")
    for topic in (one, two):
        kafka.produce(topic, keyed_records(40, partition=0, prefix=topic[-4:], base_ts_ms=BASE_TS))
    kafka.produce(one, keyed_records(25, partition=1, prefix="one-p1", base_ts_ms=BASE_TS))

    register(spark)

    def scan(plan: Any, mode: str) -> Any:
        reader = spark.read.format(SOURCE_NAME).option("plan", plan.to_json(indent=None))
        for key, value in kafka.connection.client_config().items():
            reader = reader.option(f"kafka.{key}", str(value))
        return reader.option("constant.columns", mode).load()

    for topics, fixed in (([one], {"topic", "plan_id"}), ([one, two], {"plan_id"})):
        plan = plan_for(kafka.adapter, topics, chunk_records=30)
        omitted = scan(plan, "omit")
        assert [f.name for f in omitted.schema.fields] == [f.name for f in SCHEMA.fields if f.name not in fixed]
        assert omitted.count() == plan.total_records
        full = scan(plan, "keep")  # what a user reading the format by hand gets
        assert full.schema == SCHEMA
        df = read_plan(spark, plan, kafka.connection)
        assert df.schema == SCHEMA
        assert sorted(df.collect()) == sorted(full.collect())
        assert _rows(df) == consume_independently(kafka.connection, plan)
        assert {r.plan_id for r in df.select("plan_id").distinct().collect()} == {plan.plan_id}
        assert range_stats(df, plan) == range_stats(full, plan)

    # Spark wraps the source's ConfigError when it asks for the schema.
    with pytest.raises(AnalysisException, match=r"ConfigError:.*constant.columns must be 'keep' or 'omit'"):
        scan(plan, "drop")


def test_read_committed_skips_aborted_records(kafka: KafkaTestCluster, spark: Any) -> None:
    topic = kafka.new_topic(partitions=1, prefix="read-txn")
    producer = Producer(kafka.connection.client_config(**{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(30)
    for i, commit in enumerate([True, False, True, False, True]):
        producer.begin_transaction()
        for j in range(10):
            producer.produce(topic, value=f"{'ok' if commit else 'aborted'}-{i}-{j}".encode(), partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    # 50 records + 5 transaction markers; wait until the last marker is stable.
    deadline = time.monotonic() + 30
    while kafka.adapter.end_offsets([(topic, 0)], "read_committed")[(topic, 0)] < 55:
        assert time.monotonic() < deadline, "the last transaction marker never became stable"
        time.sleep(0.2)
    plan = plan_for(kafka.adapter, [topic], isolation="read_committed")
    df = read_plan(spark, plan, kafka.connection)
    values = sorted(bytes(r.value).decode() for r in df.collect())
    assert values == sorted(f"ok-{i}-{j}" for i in (0, 2, 4) for j in range(10))
    assert _rows(df) == consume_independently(kafka.connection, plan)
    (stats,) = range_stats(df, plan)
    # 20 aborted records and 5 markers are gaps.
    assert plan.partitions[0].end == 55
    assert (stats.records, stats.gaps) == (30, 25)

    uncommitted = plan_for(kafka.adapter, [topic], isolation="read_uncommitted")
    assert read_plan(spark, uncommitted, kafka.connection).count() == 50


def test_compacted_topic_gaps_are_counted(kafka: KafkaTestCluster, spark: Any) -> None:
    config = {
        **KEEP,
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.0001",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "0",
    }
    topic = kafka.new_topic(partitions=1, config=config, prefix="read-compact")
    keys = [f"key-{i}".encode() for i in range(20)]
    deadline = time.monotonic() + 120
    # Rewrite the same keys until the cleaner has removed some of the older copies.
    while True:
        kafka.produce(topic, [Record(value=b"v%d" % i, key=k, partition=0) for i, k in enumerate(keys)])
        time.sleep(1.0)
        plan = plan_for(kafka.adapter, [topic], isolation="read_uncommitted")
        expected = consume_independently(kafka.connection, plan, isolation="read_uncommitted")
        if len(expected) < plan.total_records:
            break
        assert time.monotonic() < deadline, "the log cleaner did not compact within 2 minutes"

    df = read_plan(spark, plan, kafka.connection)
    assert _rows(df) == expected
    (stats,) = range_stats(df, plan)
    assert stats.gaps == plan.total_records - len(expected) > 0
    assert check_complete([stats]) == []


def test_deleted_start_fails_naming_partition_and_offsets(kafka: KafkaTestCluster, spark: Any) -> None:
    topic = kafka.new_topic(partitions=2, config=KEEP, prefix="read-deleted")
    for p in range(2):
        kafka.produce(topic, keyed_records(100, partition=p, base_ts_ms=BASE_TS))
    plan = plan_for(kafka.adapter, [topic], isolation="read_uncommitted")
    kafka.adapter.delete_records({(topic, 1): 60})

    with pytest.raises(Exception, match=rf"{topic}\[1\] offsets \[0, 100\).*offset 0 is no longer available") as info:
        read_plan(spark, plan, kafka.connection).count()
    assert "log now starts at 60" in str(info.value)

    # The same failure outside Spark is a ReadError.
    (task,) = [t for t in tasks_of(plan) if any(r.partition == 1 for r in t.ranges)]
    with pytest.raises(ReadError, match=r"offset 0 is no longer available"):
        list(read_task(task, kafka.connection.client_config()))


def test_leader_stopped_mid_read_still_yields_the_planned_records(own_kafka: KafkaTestCluster) -> None:
    kafka = own_kafka  # a leader stopped here must not be one another worker's tests are using
    cluster = kafka.require_local()
    topic = kafka.new_topic(partitions=1, replication=3, config=KEEP, prefix="read-failover")
    kafka.produce(topic, keyed_records(30_000, partition=0, base_ts_ms=BASE_TS, step_ms=1), acks="all")
    plan = plan_for(kafka.adapter, [topic], isolation="read_committed")
    leader = plan.partitions[0].leader
    (task,) = tasks_of(plan)
    # Small fetches so that most of the range is still on the broker when the leader stops.
    config = kafka.connection.client_config(**{"max.partition.fetch.bytes": 4096,
                                               "queued.max.messages.kbytes": 64})  # fmt: skip
    batches = read_task(task, config, batch_records=500, stall_timeout_s=90)
    got = [next(batches)]
    cluster.stop_node(leader)
    try:
        got.extend(batches)
        new_leader = kafka.adapter.partitions([topic])[0].leader
    finally:
        _restart(cluster, leader)
    assert new_leader != leader
    offsets = [o for b in got for o in b.column("offset").to_pylist()]
    assert offsets == list(range(30_000))
    values = [v for b in got for v in b.column("value").to_pylist()]
    assert values == [f"v-{i}".encode() for i in range(30_000)]


def test_a_range_that_cannot_reach_its_end_fails_with_the_stall_error(kafka: KafkaTestCluster) -> None:
    """A planned end the log never reaches (20 records, end 50): no progress, then a ReadError naming where."""
    topic = kafka.new_topic(partitions=1, config=KEEP, prefix="read-stall")
    kafka.produce(topic, keyed_records(20, partition=0, base_ts_ms=BASE_TS))
    plan = plan_for(kafka.adapter, [topic], ends={(topic, 0): 50})
    (task,) = tasks_of(plan)
    got: list[int] = []

    def read_all() -> None:
        for batch in read_task(task, kafka.connection.client_config(), stall_timeout_s=2):
            got.extend(batch.column("offset").to_pylist())

    started = time.monotonic()
    with pytest.raises(ReadError) as err:
        read_all()
    assert time.monotonic() - started < 30
    assert got == list(range(20))  # everything there was, then the stall
    assert str(err.value) == (
        f"no progress for 2s before reaching the planned end of: {topic}[0] offsets [0, 50) at offset 20; "
        "the log now starts at 0 and ends at 20"
    )
