"""The lag trigger's look-ups on the real cluster: records behind, overdue partitions, no group offsets."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark.config.models import Feed
from tidemark.orchestration import lag
from tidemark.orchestration.lag import LagProbe


def test_the_probe_reads_lag_and_old_unread_records_with_offsets_only(kafka: KafkaTestCluster) -> None:
    topic = kafka.new_topic(partitions=3, prefix="probe")
    group = f"g-probe-{uuid.uuid4().hex[:8]}"
    now_ms = int(time.time() * 1000)
    # Partition 0: 10 records stamped 2 hours ago; partition 1: 6 records stamped now; partition 2: empty.
    kafka.produce(topic, keyed_records(10, partition=0, base_ts_ms=now_ms - 7_200_000))
    kafka.produce(topic, keyed_records(6, partition=1, base_ts_ms=now_ms))
    probe = LagProbe(kafka.connection, [topic], group)
    try:
        fresh = probe.read(oldest_unread_age_ms=600_000)
        # No group offsets: counted from the log start (on_missing: earliest).
        assert fresh.records == 16 and fresh.overdue == (f"{topic}[0]",)
        assert dict(fresh.positions) == {f"{topic}[0]": -1, f"{topic}[1]": -1, f"{topic}[2]": -1}

        # The group reads partition 0 up to 8: 2 old records left there, still overdue.
        assert kafka.adapter.alter_committed(group, {(topic, 0): (8, ""), (topic, 1): (6, "")}) == {
            (topic, 0): None, (topic, 1): None,
        }  # fmt: skip
        partly = probe.read(oldest_unread_age_ms=600_000)
        assert partly.records == 2 and partly.overdue == (f"{topic}[0]",)
        assert partly.positions[f"{topic}[0]"] == 8 and partly.positions != fresh.positions

        # Caught up: nothing behind, nothing overdue.
        kafka.adapter.alter_committed(group, {(topic, 0): (10, ""), (topic, 2): (0, "")})
        done = probe.read(oldest_unread_age_ms=600_000)
        assert (done.records, done.overdue) == (0, ())
        # Each check: an OffsetFetch plus two ListOffsets (ends, by timestamp); partitions are described once, and
        # the log start is asked only for partitions without group offsets.
        before = probe.requests
        probe.read(oldest_unread_age_ms=600_000)
        assert probe.requests - before == 2  # the adapter's ListOffsets; the OffsetFetch is the probe's own consumer
    finally:
        probe.close()


def test_a_latest_feed_without_group_offsets_has_no_lag(kafka: KafkaTestCluster) -> None:
    topic = kafka.new_topic(partitions=1, prefix="probe")
    kafka.produce(topic, keyed_records(5, partition=0))
    probe = LagProbe(kafka.connection, [topic], f"g-{uuid.uuid4().hex[:8]}", on_missing="latest")
    try:
        assert probe.read().records == 0
    finally:
        probe.close()


def test_a_pattern_feeds_probe_counts_every_matching_topic_and_one_created_later(
    kafka: KafkaTestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"probepat{uuid.uuid4().hex[:8]}"
    eu, dlq, us, other = (f"{prefix}.orders.eu", f"{prefix}.orders.dlq", f"{prefix}.orders.us", f"{prefix}.other")
    for topic in (eu, dlq, other):
        kafka.adapter.create_topic(topic, 1)
        kafka.produce(topic, keyed_records(4, partition=0))
    feed = Feed(name="orders", group=f"g-{uuid.uuid4().hex[:8]}", trigger={"lag_records": 1},
                topics={"pattern": rf"{prefix}\.orders\..*", "exclude": [rf"{prefix}\.orders\.dlq"]})  # fmt: skip
    probe = LagProbe.for_feed(feed, kafka.connection)
    try:
        first = probe.read()
        assert (first.records, sorted(first.positions)) == (4, [f"{eu}[0]"])  # not the excluded or other topic
        kafka.adapter.create_topic(us, 2)
        kafka.produce(us, keyed_records(6, partition=1))
        monkeypatch.setattr(lag, "PARTITIONS_REFRESH_S", 0.0)  # the next check lists the topics again
        later = probe.read()
        assert (later.records, sorted(later.positions)) == (10, [f"{eu}[0]", f"{us}[0]", f"{us}[1]"])
    finally:
        probe.close()


def test_the_probe_reads_under_the_feeds_isolation_and_stamps_the_reading_with_the_given_time(
    kafka: KafkaTestCluster,
) -> None:
    """An open transaction's records count as lag under read_uncommitted only (the ends and the timestamp look-up
    both under the feed's isolation); a reading made at a given time carries that time."""
    from confluent_kafka import Producer

    topic = kafka.new_topic(partitions=1, prefix="probeiso")
    kafka.produce(topic, keyed_records(2, partition=0))
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"open-{i}".encode(), partition=0)
    producer.flush(30)
    group = f"g-{uuid.uuid4().hex[:8]}"
    kafka.adapter.alter_committed(group, {(topic, 0): (2, "")})
    committed = LagProbe(kafka.connection, [topic], group, isolation="read_committed")
    uncommitted = LagProbe(kafka.connection, [topic], group, isolation="read_uncommitted")
    try:
        now_ms = int(time.time() * 1000)
        seen = committed.read(oldest_unread_age_ms=3_600_000, now_ms=now_ms)
        assert (seen.at_ms, seen.records, seen.overdue) == (now_ms, 0, ())
        # The open transaction's records are young: none overdue at an hour, all at a negative age (every one older).
        raw = uncommitted.read(oldest_unread_age_ms=3_600_000, now_ms=now_ms + 1)
        assert (raw.at_ms, raw.records, raw.overdue) == (now_ms + 1, 3, ())
        assert uncommitted.read(oldest_unread_age_ms=-3_600_000).overdue == (f"{topic}[0]",)
    finally:
        committed.close()
        uncommitted.close()
        producer.abort_transaction(30)
