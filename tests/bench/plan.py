"""Planning benchmark: how long planning a large feed takes, and how many requests it sends.

Creates a feed of ``--partitions`` partitions (spread over ``--topics`` topics, so over
every broker of the cluster), puts a few records in each, commits offsets for most
partitions and checkpoints for some (so several resolution branches run), then plans the
feed ``--runs`` times with :func:`tidemark.runs.gather.plan_feed` and prints the median and
p99 planning time, the admin calls per plan, and the wire requests per plan as counted
by librdkafka's own statistics (``tx`` per broker). The target is a p99 under 1 s for
1,000 partitions over 3 brokers. Not a test: run it with ``make bench-plan`` or
``python -m tests.bench.plan`` against the local cluster (or any cluster named by
``TIDEMARK_BOOTSTRAP_SERVERS``). Its topics are deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.kafka import KafkaTestAdmin
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import Feed
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.kafka.admin import Record, produce
from tidemark.kafka.connection import KafkaConnection
from tidemark.runs.gather import plan_feed

TARGET_P99_S = 1.0
STATS_INTERVAL_MS = 100


class WireCounter:
    """Requests sent per broker, from librdkafka's statistics callback (``brokers.*.tx``)."""

    def __init__(self) -> None:
        self.latest: dict[str, int] = {}

    def on_stats(self, raw: str) -> None:
        doc = json.loads(raw)
        self.latest = {
            name: int(b.get("tx", 0)) for name, b in doc.get("brokers", {}).items() if int(b.get("nodeid", -1)) >= 0
        }

    def snapshot(self, adapter: KafkaTestAdmin) -> dict[str, int]:
        # Statistics arrive on poll(); wait two intervals so the numbers cover every request so far.
        deadline = time.monotonic() + 2 * STATS_INTERVAL_MS / 1000
        while time.monotonic() < deadline:
            adapter.admin.poll(0.05)
        return dict(self.latest)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))  # nearest rank
    return ordered[rank]


def setup(connection: KafkaConnection, adapter: KafkaTestAdmin, topics: int, partitions: int) -> Feed:
    run = uuid.uuid4().hex[:8]
    per_topic = [partitions // topics + (1 if i < partitions % topics else 0) for i in range(topics)]
    names = [f"bench-plan-{run}-{i}" for i in range(topics)]
    for name, count in zip(names, per_topic, strict=True):
        adapter.create_topic(name, count, config={"retention.ms": "-1"})
    now_ms = int(time.time() * 1000)
    for name, count in zip(names, per_topic, strict=True):
        produce(
            connection,
            name,
            (Record(value=b"x", partition=p, timestamp_ms=now_ms + i) for p in range(count) for i in range(5)),
        )
    return Feed(name=f"bench-plan-{run}", topics=tuple(names), group=f"bench-plan-{run}", schedule="@hourly")


def seed_offsets(adapter: KafkaTestAdmin, feed: Feed, store: SqliteCheckpointStore) -> None:
    """Committed offsets for ~80% of partitions, checkpoints for another ~10%, none for the rest."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    tps = [(i.topic, i.partition) for i in adapter.partitions(feed.topics)]
    committed = [TopicPartition(t, p, 2) for n, (t, p) in enumerate(tps) if n % 10 < 8]
    request = ConsumerGroupTopicPartitions(feed.group, committed)
    adapter.admin.alter_consumer_group_offsets([request], request_timeout=adapter.timeout_s)[feed.group].result(
        timeout=adapter.timeout_s
    )
    store.put(feed.group, "bench", {tp: 3 for n, tp in enumerate(tps) if n % 10 == 8}, "bench-run")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.plan", description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's topics")
    args = parser.parse_args(argv)

    connection = connection_from_env()
    counter = WireCounter()
    overrides: dict[str, Any] = {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": counter.on_stats}
    adapter = KafkaTestAdmin(connection, client_overrides=overrides)
    brokers = adapter.broker_ids()
    print(f"cluster: {len(brokers)} brokers {brokers} at {connection.bootstrap_servers}")
    started = time.perf_counter()
    feed = setup(connection, adapter, args.topics, args.partitions)
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-plan-") as state:
        store = SqliteCheckpointStore(Path(state) / "checkpoints.sqlite")
        try:
            seed_offsets(adapter, feed, store)
            plan = plan_feed(feed, adapter, store)  # warm-up: connections, metadata, settled leaders
            leaders = {p.leader for p in plan.partitions}
            print(
                f"feed: {len(plan.partitions)} partitions in {len(feed.topics)} topics, leaders {sorted(leaders)}; "
                f"setup {time.perf_counter() - started:.1f}s"
            )
            reasons: dict[str, int] = {}
            for p in plan.partitions:
                reasons[p.reason] = reasons.get(p.reason, 0) + 1
            print(f"plan: {plan.total_records} records, {len(plan.tasks)} tasks, {len(plan.events)} events, {reasons}")

            wire_before = counter.snapshot(adapter)
            calls_before = adapter.requests
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                plan_feed(feed, adapter, store)
                times.append(time.perf_counter() - t0)
            wire_after = counter.snapshot(adapter)
            calls = (adapter.requests - calls_before) / args.runs
            per_broker = {b: (wire_after.get(b, 0) - n) / args.runs for b, n in wire_before.items()}
        finally:
            if not args.keep:
                for topic in feed.topics:
                    adapter.delete_topic(topic)

    median, p99 = statistics.median(times), percentile(times, 99)
    wire = sum(per_broker.values())
    print(f"planning time over {args.runs} runs: median {median * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms")  # fmt: skip
    print(f"requests per plan: {calls:.0f} admin calls, {wire:.1f} wire requests "
          f"({', '.join(f'{b}: {n:.1f}' for b, n in sorted(per_broker.items()))})")  # fmt: skip
    ok = p99 < TARGET_P99_S
    print(f"target p99 < {TARGET_P99_S:.0f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
