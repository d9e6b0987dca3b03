"""The demo behind ``make demo``: the embedded cluster with demo data.

It starts (or reuses) the local 3-broker cluster, creates the demo topic, produces demo
events and prints each partition's leader and offsets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

from tidemark.connection import KafkaConnection
from tidemark.kafka_io import KafkaAdapter, Record, produce

DEMO_TOPIC = "tidemark.demo.events"
DEMO_PARTITIONS = 6


def demo_events(count: int, start_id: int = 0, bad_every: int = 0) -> Iterator[Record]:
    """JSON order events keyed by customer; every ``bad_every``-th one is malformed."""
    now_ms = int(time.time() * 1000)
    for i in range(start_id, start_id + count):
        customer = f"customer-{i % 17}"
        if bad_every and i % bad_every == bad_every - 1:
            value = b'{"order_id": "broken'  # truncated JSON: a bad record the feed must catch
        else:
            value = json.dumps({"order_id": i, "customer": customer, "amount": round(5 + (i % 40) * 2.5, 2)}).encode()
        yield Record(value=value, key=customer.encode(), timestamp_ms=now_ms - (count - i))


def print_offsets(adapter: KafkaAdapter, topic: str) -> None:
    from tidemark.cli import table

    parts = adapter.partitions([topic])
    tps = [(p.topic, p.partition) for p in parts]
    start = adapter.log_start_offsets(tps)
    end = adapter.end_offsets(tps, "read_uncommitted")
    rows = [(p.topic, p.partition, p.leader, start[(p.topic, p.partition)], end[(p.topic, p.partition)]) for p in parts]
    print(table(["topic", "partition", "leader", "log start", "high watermark"], rows))
    print(f"leaders on brokers {sorted({p.leader for p in parts})}; {sum(end.values()) - sum(start.values())} records")


def run_demo(records: int = 600) -> int:
    from tidemark.kafka_local.cluster import LocalCluster

    t0 = time.monotonic()
    state = LocalCluster().up()
    print(f"local Kafka: {len(state.nodes)} brokers at {state.bootstrap_servers} ({time.monotonic() - t0:.1f}s)")
    conn = KafkaConnection(state.bootstrap_servers)
    adapter = KafkaAdapter(conn)
    adapter.create_topic(DEMO_TOPIC, DEMO_PARTITIONS, replication=min(3, len(state.nodes)))
    sent = produce(conn, DEMO_TOPIC, demo_events(records))
    print(f"produced {sent} demo events to {DEMO_TOPIC}")
    print_offsets(adapter, DEMO_TOPIC)
    return 0
