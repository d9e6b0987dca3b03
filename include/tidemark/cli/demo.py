"""The demo behind ``make demo``: the whole pipeline on the embedded default.

It starts (or reuses) the local 3-broker cluster, creates the demo topic, produces JSON
order events (every hundredth one malformed, which the demo feed quarantines), and runs
the demo feed twice through the same code as ``tidemark run``, with more events produced
in between. For each run it prints the ranges, records, validation result, output path
and committed offsets, and checks that the second run starts exactly where the first
committed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

from tidemark.kafka.adapter import KafkaAdapter, Record, produce
from tidemark.kafka.connection import KafkaConnection

DEMO_FEED = "demo"
DEMO_TOPIC = "tidemark.demo.events"
DEMO_PARTITIONS = 6
BAD_EVERY = 100


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
    """Start the local cluster, produce demo events, and run the demo feed twice."""
    from tidemark.cli.run import summarize
    from tidemark.devtools.kafka.cluster import LocalCluster
    from tidemark.runs.pipeline import run_feed

    t0 = time.monotonic()
    state = LocalCluster().up()
    print(f"local Kafka: {len(state.nodes)} brokers at {state.bootstrap_servers} ({time.monotonic() - t0:.1f}s)")
    conn = KafkaConnection(state.bootstrap_servers)
    adapter = KafkaAdapter(conn)
    adapter.create_topic(DEMO_TOPIC, DEMO_PARTITIONS, replication=min(3, len(state.nodes)))

    ends: dict[tuple[str, int], int] = {}
    produced = 0
    for round_no, count in enumerate((records, max(records // 2, 1)), start=1):
        sent = produce(conn, DEMO_TOPIC, demo_events(count, start_id=produced, bad_every=BAD_EVERY))
        produced += sent
        print(f"\n== run {round_no}: produced {sent} demo events (every {BAD_EVERY}th one malformed) ==")
        print_offsets(adapter, DEMO_TOPIC)
        handle, job, outcome = run_feed(DEMO_FEED, conn, progress=_progress)
        print(summarize(handle, job, outcome))
        plan = handle.plan()
        if ends:
            starts = {p.key: p.start for p in plan.partitions}
            resumed = all(starts.get(tp) == end for tp, end in ends.items())
            print(f"run {round_no} started exactly where run {round_no - 1} committed: {'yes' if resumed else 'NO'}")
            if not resumed:
                return 1
        ends = plan.ends()
    print("\nnext: '.venv/bin/tidemark runs demo', '.venv/bin/tidemark status demo', or open a run's Data Docs")
    return 0


def _progress(message: str) -> None:
    print(f"  .. {message}", flush=True)
