"""Issue 15: exact timestamp windows on the real cluster, with CreateTime out of offset order.

Records are produced in offset order with timestamps that jitter by up to three minutes
(many producers, retries, clock skew). An exact backfill must publish exactly the records
stamped inside the window (checked against an independent scan of every record's
timestamp), count what it read in the margin and dropped, and say when the skew bound
looks too small; the offset-cut mode must still give Kafka's offsets-for-times ranges;
a LogAppendTime topic needs no margin.
"""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tidemark.kafka.admin import Record
from tidemark.runs.pipeline import RunHandle

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PER_PARTITION = 150
STEP_MS = 10_000
JITTER_MS = 180_000


@pytest.fixture
def env(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    e = FaultEnv(kafka, spark, tmp_path, "windows", partitions=2)
    e.install(monkeypatch)
    return e


def produce_jittered(env: FaultEnv, base_ms: int) -> None:
    rng = random.Random(15)
    records = [
        Record(value=f"v-{p}-{i}".encode(), partition=p,
               timestamp_ms=base_ms + i * STEP_MS + rng.randint(-JITTER_MS, JITTER_MS))
        for p in range(env.partitions) for i in range(PER_PARTITION)
    ]  # fmt: skip
    env.kafka.produce(env.topic, records)


def every_record(env: FaultEnv) -> list[tuple[int, int, int]]:
    """(partition, offset, timestamp ms) of every record, by an independent consumer."""
    consumer = Consumer(env.kafka.connection.client_config(**{"group.id": "scan", "enable.auto.commit": False}))
    out: list[tuple[int, int, int]] = []
    try:
        consumer.assign([TopicPartition(env.topic, p, 0) for p in range(env.partitions)])
        deadline = time.monotonic() + 60
        while len(out) < env.partitions * PER_PARTITION and time.monotonic() < deadline:
            for msg in consumer.consume(500, 1.0):
                if not msg.error():
                    out.append((msg.partition(), msg.offset(), msg.timestamp()[1]))
    finally:
        consumer.close()
    return sorted(out)


def published_positions(env: FaultEnv, handle: RunHandle) -> set[tuple[int, int]]:
    """Positions published by ``handle``'s run: a backfill publishes beside the feed's output, never into it."""
    output = handle.plan().output
    assert output is not None and Path(output) != env.output
    return {(p, o) for (_, p, o, _) in env.published(Path(output))}


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def test_exact_backfill_publishes_exactly_the_records_stamped_inside(env: FaultEnv) -> None:
    base = int(time.time() * 1000) - 3 * 3_600_000
    produce_jittered(env, base)
    start, end = base + 500_000, base + 1_100_000
    records = every_record(env)
    inside = {(p, o) for p, o, ts in records if start <= ts < end}

    handle, job, outcome = env.run("backfill", {"start_timestamp": iso(start), "end_timestamp": iso(end),
                                                "max_skew": "15m"})  # fmt: skip

    assert published_positions(env, handle) == inside
    report = json.loads(Path(outcome.report_path).read_text())
    window = report["window"]
    assert sum(w["kept"] for w in window) == len(inside) == job["records_published"]
    for w in window:
        assert w["read"] == w["kept"] + w["dropped"]
        assert w["read_in_margin"] > 0 and w["kept_in_margin"] > 0  # jitter put window records past the cut
        assert 0 < w["largest_skew_ms"] <= 2 * JITTER_MS
    assert not [e for e in report["events"] if e["kind"] == "timestamp_skew"]
    # The offset cut would have missed the records kept in the margin and published the dropped ones.
    filt = handle.plan().time_filter
    assert filt is not None and filt["max_skew_ms"] == 900_000 and filt["start_ms"] == start
    cut = {(p, o) for p, o, _ in records if o < filt["cut_ends"][f"{env.topic}:{p}"]}
    assert inside - cut and cut - inside


def test_a_skew_beyond_the_bound_is_an_event(env: FaultEnv) -> None:
    base = int(time.time() * 1000) - 3 * 3_600_000
    produce_jittered(env, base)
    _, _, outcome = env.run("backfill", {"start_timestamp": iso(base + 500_000),
                                         "end_timestamp": iso(base + 1_100_000), "max_skew": "1m"})  # fmt: skip
    report = json.loads(Path(outcome.report_path).read_text())
    skew = [e for e in report["events"] if e["kind"] == "timestamp_skew"]
    assert {e["partition"] for e in skew} == {0, 1}
    assert all(e["details"]["exceeded"] and e["details"]["largest_skew_ms"] > 60_000 for e in skew)
    assert "max_skew" in skew[0]["message"]


def test_offset_cut_mode_keeps_the_old_ranges(env: FaultEnv) -> None:
    base = int(time.time() * 1000) - 3 * 3_600_000
    produce_jittered(env, base)
    start, end = base + 500_000, base + 1_100_000
    adapter = env.kafka.adapter
    tps = env.tps()
    starts = adapter.offsets_for_timestamp(tps, start, "read_committed")
    ends = adapter.offsets_for_timestamp(tps, end, "read_committed")

    handle, _, _ = env.run("backfill", {"start_timestamp": iso(start), "end_timestamp": iso(end),
                                        "window_mode": "offset_cut"})  # fmt: skip

    plan = handle.plan()
    assert plan.time_filter is None
    assert {p.key: (p.start, p.end) for p in plan.partitions} == {tp: (starts[tp], ends[tp]) for tp in tps}
    expected = {(p, o) for (_, p), s in starts.items() for o in range(s, ends[(env.topic, p)])}
    assert published_positions(env, handle) == expected


def test_log_append_time_topic_is_read_with_no_margin(kafka: KafkaTestCluster, spark: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    env = FaultEnv(
        kafka, spark, tmp_path, "lat", partitions=1, topic_config={"message.timestamp.type": "LogAppendTime"}
    )
    env.install(monkeypatch)
    marks = []
    for _ in range(3):
        env.produce(5)
        time.sleep(1.2)
        marks.append(int(time.time() * 1000))
        time.sleep(0.3)
    handle, _, _ = env.run("backfill", {"start_timestamp": iso(marks[0]), "end_timestamp": iso(marks[1]),
                                        "max_skew": "10m"})  # fmt: skip
    (part,) = handle.plan().partitions
    assert (part.start, part.end) == (5, 10)  # no margin although max_skew is 10 minutes
    assert handle.plan().time_filter["log_append_time"] == [env.topic]  # type: ignore[index]
    assert published_positions(env, handle) == {(0, o) for o in range(5, 10)}
