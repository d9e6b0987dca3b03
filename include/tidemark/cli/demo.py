"""The demo behind ``make demo``: the whole pipeline on the embedded default.

It starts (or reuses) the local 3-broker cluster, creates the demo topic, produces JSON
order events (every hundredth one malformed, which the demo feed quarantines), and runs
the demo feed twice through the same code as ``tidemark run``, with more events produced
in between. For each run it prints the ranges, records, validation result, output path
and committed offsets, and checks that the second run starts exactly where the first
committed.

Then the Avro demo feed runs once, on a topic of its own: a local schema registry
(Apicurio, started while the JSON feed runs, stopped at the end), orders written by
confluent-kafka's ``AvroSerializer`` with schema v1 (every hundredth body corrupted after
a valid prefix, quarantined), then v2 (an added field with a default) registered and
written for the second half. The run resolves both to v2; its progress shows each
partition's ``schema_changed`` event. One run, not two: each costs a Spark job, and the JSON feed
already shows a run resuming where the last one committed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from tidemark.cli.output import step, table
from tidemark.cli.run import summarize
from tidemark.devtools import registry as local_registry
from tidemark.devtools.kafka.cluster import LocalCluster
from tidemark.errors import LocalServerError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.admin import KafkaAdmin, Record, produce
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import ENV_URL
from tidemark.runs.pipeline import run_feed

DEMO_FEED = "demo"
DEMO_TOPIC = "tidemark.demo.events"
DEMO_PARTITIONS = 6
BAD_EVERY = 100
AVRO_FEED = "demo_avro"
AVRO_TOPIC = "tidemark.demo.orders.avro"
ORDER_V1: dict[str, Any] = {
    "type": "record", "name": "Order", "namespace": "tidemark.demo",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}  # fmt: skip
# v2: an added field with a default, so records written with v1 resolve to it.
ORDER_V2: dict[str, Any] = {
    **ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "channel", "type": "string", "default": "web"}]
}  # fmt: skip


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


def avro_orders(
    registry_url: str, schema: dict[str, Any], count: int, start_id: int = 0, bad_every: int = 0
) -> Iterator[Record]:
    """Avro order events written with ``schema`` by confluent-kafka's serializer (registering it);
    every ``bad_every``-th one keeps its valid prefix before a body that does not decode."""
    # The Avro serializer pulls in the Avro libraries: loaded for the Avro demo feed only.
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(schema))
    context = SerializationContext(AVRO_TOPIC, MessageField.VALUE)
    now = dt.datetime.now(dt.UTC)
    with_channel = any(f["name"] == "channel" for f in schema["fields"])
    for i in range(start_id, start_id + count):
        customer = f"customer-{i % 17}"
        order = {"order_id": i, "customer": customer, "amount": Decimal(5 + (i % 40) * 2.5).quantize(Decimal("0.01")),
                 "placed_at": now - dt.timedelta(milliseconds=count - i)}  # fmt: skip
        if with_channel:
            order["channel"] = ("web", "app", "store")[i % 3]
        value = serializer(order, context)
        if bad_every and i % bad_every == bad_every - 1:
            value = value[:5] + b"\xff\xff\xff\xff"  # a registered id, a body that does not decode
        yield Record(value=value, key=customer.encode())


def print_offsets(adapter: KafkaAdapter, topic: str) -> None:
    parts = adapter.partitions([topic])
    tps = [(p.topic, p.partition) for p in parts]
    start = adapter.log_start_offsets(tps)
    end = adapter.end_offsets(tps, "read_uncommitted")
    rows = [(p.topic, p.partition, p.leader, start[(p.topic, p.partition)], end[(p.topic, p.partition)]) for p in parts]
    print(table(["topic", "partition", "leader", "log start", "high watermark"], rows))
    print(f"leaders on brokers {sorted({p.leader for p in parts})}; {sum(end.values()) - sum(start.values())} records")


def run_demo(records: int = 600) -> int:
    """Start the local cluster and a schema registry, produce demo events, and run each demo feed twice."""
    t0 = time.monotonic()
    state = LocalCluster().up()
    print(f"local Kafka: {len(state.nodes)} brokers at {state.bootstrap_servers} ({time.monotonic() - t0:.1f}s)")
    conn = KafkaConnection(state.bootstrap_servers)
    adapter = KafkaAdmin(conn)
    # The registry's JVM starts while the JSON feed runs; the Avro feed needs it only afterwards.
    started: dict[str, Any] = {}
    starter = threading.Thread(target=_start_registry, args=(local_registry, started), daemon=True)
    starter.start()
    try:
        adapter.create_topic(DEMO_TOPIC, DEMO_PARTITIONS, replication=min(3, len(state.nodes)))

        def json_round(round_no: int, count: int, start_id: int) -> int:
            sent = produce(conn, DEMO_TOPIC, demo_events(count, start_id=start_id, bad_every=BAD_EVERY))
            print(
                f"\n== {DEMO_FEED} run {round_no}: produced {sent} demo events (every {BAD_EVERY}th one malformed) =="
            )
            return sent

        if _runs(DEMO_FEED, DEMO_TOPIC, conn, adapter, (records, max(records // 2, 1)), json_round) != 0:
            return 1
        starter.join()
        if "error" in started:
            raise started["error"]
        registry = started["server"]
        print(f"\nschema registry: Apicurio at {registry.url} ({started['seconds']:.1f}s, in memory)")
        os.environ[ENV_URL] = registry.url  # the registry setting of the runs' jobs
        adapter.create_topic(AVRO_TOPIC, DEMO_PARTITIONS, replication=min(3, len(state.nodes)))

        def avro_round(round_no: int, count: int, start_id: int) -> int:
            half = count // 2
            sent = produce(conn, AVRO_TOPIC, avro_orders(registry.url, ORDER_V1, half, start_id, BAD_EVERY))
            sent += produce(conn, AVRO_TOPIC, avro_orders(registry.url, ORDER_V2, count - half, start_id + half))
            print(f"\n== {AVRO_FEED} run {round_no}: produced {sent} Avro orders with schema v1 (every {BAD_EVERY}th "
                  "body corrupted), the second half with schema v2 (registered then: an added field 'channel' with "
                  "a default) ==")  # fmt: skip
            return sent

        _runs(AVRO_FEED, AVRO_TOPIC, conn, adapter, (records,), avro_round)
    finally:
        starter.join()
        if "server" in started:
            started["server"].stop()
    print("\nnext: '.venv/bin/tidemark runs demo', '.venv/bin/tidemark status demo', or open a run's Data Docs")
    return 0


def _start_registry(local_registry: Any, into: dict[str, Any]) -> None:
    t0 = time.monotonic()
    try:
        into["server"] = local_registry.start()
    except (LocalServerError, OSError) as exc:  # handed to the main thread, which raises it
        into["error"] = exc
    into["seconds"] = time.monotonic() - t0


def _runs(
    feed: str, topic: str, conn: KafkaConnection, adapter: KafkaAdapter, counts: tuple[int, ...],
    produce_round: Callable[[int, int, int], int],
) -> int:  # fmt: skip
    """A run of ``feed`` per entry of ``counts``, that many events produced before each; 1 when a run does not
    resume where the one before committed."""
    ends: dict[tuple[str, int], int] = {}
    produced = 0
    for round_no, count in enumerate(counts, start=1):
        produced += produce_round(round_no, count, produced)
        print_offsets(adapter, topic)
        handle, job, outcome = run_feed(feed, conn, progress=step)
        print(summarize(handle, job, outcome))
        plan = handle.plan()
        if ends:
            starts = {p.key: p.start for p in plan.partitions}
            resumed = all(starts.get(tp) == end for tp, end in ends.items())
            print(f"run {round_no} started exactly where run {round_no - 1} committed: {'yes' if resumed else 'NO'}")
            if not resumed:
                return 1
        ends = plan.ends()
    return 0
