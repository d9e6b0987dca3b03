"""View benchmark: how long the Tidemark view of a 200-partition feed takes to render.

Creates a topic of ``--partitions`` partitions with a few records in each, commits the
group's offsets on half of them (so half the rows have lag in records and in time, which
costs a fetch per lagging partition), writes ``--runs`` real dry-run reports (so the chart
and the runs table have content), then requests the feed page ``--samples`` times through
the app (in-process, without Airflow's auth layer) and prints the median and the slowest.
Each request does what the page does in Airflow: one batched offsets snapshot, one
timestamp probe, the reports, the Jinja2 render. The target is under 2 s. Not a test: run
it with ``make bench-view`` against the local cluster (or ``TIDEMARK_BOOTSTRAP_SERVERS``).
Its topic is deleted at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import yaml

from tests.support.kafka import KafkaTestAdmin
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.kafka.admin import Record, produce

TARGET_S = 2.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.view", description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--runs", type=int, default=20, help="dry-run reports shown in the chart")
    args = parser.parse_args(argv)

    import os

    from confluent_kafka import Consumer, TopicPartition
    from fastapi.testclient import TestClient

    from tidemark.checkpoints.store import SqliteCheckpointStore
    from tidemark.config.models import load_feed
    from tidemark.runs.pipeline import run_feed
    from tidemark.runs.report import list_runs
    from tidemark.web.app import create_app

    connection = connection_from_env()
    adapter = KafkaTestAdmin(connection)
    topic = f"bench-view-{uuid.uuid4().hex[:8]}"
    group = f"bench-view-{uuid.uuid4().hex[:8]}"
    adapter.create_topic(topic, args.partitions, replication=1)
    try:
        stamp = int(time.time() * 1000) - 600_000
        produce(connection, topic, [Record(value=b"v", partition=i % args.partitions, timestamp_ms=stamp)
                                    for i in range(args.partitions * 4)])  # fmt: skip
        consumer = Consumer(connection.client_config(**{"group.id": group}))
        consumer.commit(offsets=[TopicPartition(topic, p, 1) for p in range(0, args.partitions, 2)], asynchronous=False)
        consumer.close()
        with tempfile.TemporaryDirectory(prefix="tidemark-bench-view-") as tmp:
            root = Path(tmp)
            (root / "feeds").mkdir()
            (root / "feeds" / "bench.yaml").write_text(yaml.safe_dump({"topics": [topic], "group": group}))
            os.environ["TIDEMARK_FEEDS_DIR"] = str(root / "feeds")
            os.environ["TIDEMARK_STATE_DIR"] = str(root / "state")
            feed = load_feed("bench")
            for _ in range(args.runs):
                run_feed("bench", connection, mode="replay", params={"start_from": "earliest", "dry_run": True})
            store = SqliteCheckpointStore(root / "state" / "checkpoints.sqlite")
            client = TestClient(create_app(feeds=lambda: {"bench": feed}, connection=lambda: connection,
                                           checkpoints=lambda: store, runs=lambda name: list_runs(name)))  # fmt: skip
            client.get("/feeds/bench")  # warm-up: imports, template compilation
            times = []
            for _ in range(args.samples):
                t0 = time.perf_counter()
                page = client.get("/feeds/bench")
                times.append(time.perf_counter() - t0)
                if page.status_code != 200 or page.text.count("<tr data-partition=") != args.partitions:
                    print(f"bench-view: the page is wrong (HTTP {page.status_code})", file=sys.stderr)
                    return 1
    finally:
        adapter.delete_topic(topic)
    median = statistics.median(times)
    print(
        f"feed view of {args.partitions} partitions ({args.partitions // 2} lagging, {args.runs} runs), "
        f"{args.samples} requests: median {median:.3f}s, slowest {max(times):.3f}s (target < {TARGET_S:.0f}s)"
    )
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
