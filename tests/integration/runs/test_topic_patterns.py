"""A pattern feed (``topics: {pattern: ..., exclude: [...]}``) on the real cluster, through whole runs.

The feed's pattern matches ``<prefix>.orders.<anything>`` but excludes ``<prefix>.orders.dlq``.
Its first run reads the one matching topic; then a matching topic (three partitions) and a
non-matching one are created and filled, and the next run reads the new topic from the reset
policy (``on_missing: earliest``: offset 0), with a ``topic_added`` event in its report. The
feed's whole output must then equal an independent ``read_committed`` scan of every matching
topic, from offset 0 to the end: every record once, none of the excluded or non-matching
topics'. Deleting the new topic afterwards gives one ``topic_removed`` event, and the run
after that none, while the output keeps what was read from it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, Row, oracle
from tidemark.checkpoints.store import open_store
from tidemark.config.models import load_feed
from tidemark.kafka.admin import Record
from tidemark.planning.plan import read_plan
from tidemark.planning.requests import ReplaySpec, RunRequest
from tidemark.runs.gather import plan_feed
from tidemark.runs.pipeline import CommitOutcome

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def env(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    e = FaultEnv(kafka, spark, tmp_path, "topic-pattern", partitions=2)
    e.install(monkeypatch)
    return e


def fill(kafka: KafkaTestCluster, topic: str, count: int, partitions: int, first: int = 0) -> None:
    """``count`` records spread over the partitions, values unique across topics (``v-`` passes the feed's rule)."""
    kafka.produce(topic, [Record(value=f"v-{topic}-{i}".encode(), key=f"k{i}".encode(), partition=i % partitions)
                          for i in range(first, first + count)])  # fmt: skip


def scan_all(kafka: KafkaTestCluster, topics: dict[str, int]) -> Counter[Row]:
    """The read_committed scan of every partition of ``topics`` (name → partitions) from 0 to its end now."""
    tps = [(t, p) for t, n in topics.items() for p in range(n)]
    ends = kafka.adapter.end_offsets(tps, "read_committed")
    return oracle(kafka.connection, {tp: (0, ends[tp]) for tp in tps})


def gone_everywhere(kafka: KafkaTestCluster, topic: str) -> None:
    """Wait until no broker lists ``topic`` (deletion finishes asynchronously, broker by broker)."""
    brokers = kafka.adapter.admin.list_topics(timeout=10).brokers.values()
    clients = [AdminClient({"bootstrap.servers": f"{b.host}:{b.port}"}) for b in brokers]
    deadline = time.monotonic() + 60
    while any(topic in c.list_topics(timeout=10).topics for c in clients):
        assert time.monotonic() < deadline, f"{topic} was not deleted within 60 s"
        time.sleep(0.2)


def events(outcomes: list[CommitOutcome], kind: str) -> list[dict[str, Any]]:
    found = []
    for outcome in outcomes:
        found += [e for e in json.loads(Path(outcome.report_path).read_text())["events"] if e["kind"] == kind]
    return found


def test_a_pattern_feed_picks_up_a_topic_created_after_its_first_run(env: FaultEnv, kafka: KafkaTestCluster) -> None:
    prefix = f"pat{uuid.uuid4().hex[:8]}"
    eu, us, dlq, payments = (f"{prefix}.orders.eu", f"{prefix}.orders.us", f"{prefix}.orders.dlq",
                             f"{prefix}.payments")  # fmt: skip
    for topic in (eu, dlq):
        kafka.adapter.create_topic(topic, 2)
    fill(kafka, eu, 30, 2)
    fill(kafka, dlq, 10, 2)
    pattern = {"pattern": rf"{prefix}\.orders\..*", "exclude": [rf"{prefix}\.orders\.dlq"]}
    env.write_feed(topics=pattern, on_missing="earliest")

    first = env.run_until_idle(4)
    first_plan = read_plan(Path(first[0].report_path).with_name("plan.json"))
    assert first_plan.topics == (eu,)
    assert not events(first, "topic_added")  # the feed's first run: every topic starts by the reset policy anyway
    assert env.published() == scan_all(kafka, {eu: 2})

    # After the first run: a matching topic and a non-matching one appear, and the old topic grows.
    kafka.adapter.create_topic(us, 3)
    kafka.adapter.create_topic(payments, 2)
    fill(kafka, us, 25, 3)
    fill(kafka, payments, 10, 2)
    fill(kafka, eu, 10, 2, first=30)

    # A replay (dry run) plans the new topic too, but a topic's arrival is the scheduled runs' news: no event.
    feed = load_feed(env.feed)
    replay = plan_feed(feed, kafka.adapter, open_store(root=env.root),
                       RunRequest("replay", replay=ReplaySpec(start_from="earliest"), dry_run=True))  # fmt: skip
    assert replay.topics == (eu, us) and {p.topic for p in replay.partitions if p.records} == {eu, us}
    assert not [e for e in replay.events if e.kind in ("topic_added", "topic_removed")]

    second = env.run_until_idle(4)
    plan = read_plan(Path(second[0].report_path).with_name("plan.json"))
    assert plan.topics == (eu, us)
    new = {p.partition: (p.start, p.reason) for p in plan.partitions if p.topic == us}
    assert new == {0: (0, "earliest"), 1: (0, "earliest"), 2: (0, "earliest")}  # the reset policy, from offset 0
    assert {p.reason for p in plan.partitions if p.topic == eu} == {"committed"}
    # Partitions of both topics grouped per leader, as for a list feed: each task talks to one broker.
    leaders = {p.key: p.leader for p in plan.partitions}
    assert plan.tasks and all({leaders[(c.topic, c.partition)] for c in t.chunks} == {t.leader} for t in plan.tasks)
    assert {c.topic for t in plan.tasks for c in t.chunks} == {eu, us}
    added = events(second, "topic_added")
    assert [(e["topic"], e["source"], e["details"]["partitions"], e["details"]["policy"]) for e in added] == [
        (us, "plan", 3, "earliest")
    ]
    assert env.report_events("topic_added") == added
    # The whole output: every record of every matching topic once, none of the excluded or non-matching ones.
    expected = scan_all(kafka, {eu: 2, us: 3})
    assert sum(expected.values()) == 65
    assert env.published() == expected
    ends = kafka.adapter.end_offsets([(us, p) for p in range(3)], "read_committed")
    committed = kafka.adapter.committed(env.group, [(us, p) for p in range(3)])
    assert {tp: c.offset for tp, c in committed.items()} == ends

    # The new topic deleted: one topic_removed event naming it, then none; the output keeps what it read.
    read_from_us = Counter({row: n for row, n in expected.items() if row[0] == us})
    kafka.adapter.delete_topic(us)
    gone_everywhere(kafka, us)
    fill(kafka, eu, 4, 2, first=40)
    third = env.run_until_idle(4)
    assert read_plan(Path(third[0].report_path).with_name("plan.json")).topics == (eu,)
    removed = events(third, "topic_removed")
    assert [(e["topic"], e["details"]["reason"], e["details"]["last_run"]) for e in removed] == [
        (us, "missing", second[-1].run_id)
    ]
    assert not events(env.run_until_idle(4), "topic_removed")
    assert env.published() == scan_all(kafka, {eu: 2}) + read_from_us
