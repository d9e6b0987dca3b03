"""A time window starting at the end of a busy topic: an empty (or short) range, never "topic recreated".

A producer thread writes to the topic throughout. The planner captures the end of the
log, then looks up the window's start by timestamp; records stamped after the start that
arrive in between lie past the captured end. A barrier on the end lookup holds the
planner there until such records exist (the window starts just after the end was
captured), so each plan meets the race instead of hoping for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, oracle
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import load_feed
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.planning.requests import RunRequest, Window
from tidemark.runs.gather import plan_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]

LEAD_S = 0.6  # the window starts this long after planning begins: after the end is captured
HOLD_S = 0.4  # the end lookup then waits this long past the window start while records arrive


@pytest.fixture
def env(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    e = FaultEnv(kafka, spark, tmp_path, "busy-window", partitions=2)
    e.install(monkeypatch)
    return e


@pytest.fixture
def busy(env: FaultEnv) -> Iterator[None]:
    """A producer writing a few records to every partition every 10 ms until the test ends."""
    stop = threading.Event()

    def produce() -> None:
        from confluent_kafka import Producer

        producer = Producer(env.kafka.connection.client_config(**{"linger.ms": 0}))
        n = 0
        while not stop.is_set():
            for p in range(env.partitions):
                producer.produce(env.topic, f"v-{n}-{p}-{uuid.uuid4().hex[:6]}".encode(), partition=p)
            producer.poll(0)
            n += 1
            time.sleep(0.01)
        assert producer.flush(30) == 0

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


class EndBarrier:
    """Holds the planner right after it captured the high watermark, until ``release_at``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release_at = 0.0
        self.captured: list[tuple[float, dict[tuple[str, int], int]]] = []
        real = KafkaAdapter.end_offsets

        def end_offsets(adapter: KafkaAdapter, tps: Any, isolation: str) -> Mapping[tuple[str, int], int]:
            found = real(adapter, tps, isolation)  # type: ignore[arg-type]
            if isolation == "read_uncommitted":  # the high watermark: the last of the captured ends
                self.captured.append((time.time(), dict(found)))
                time.sleep(max(0.0, self.release_at - time.time()))
            return found

        monkeypatch.setattr(KafkaAdapter, "end_offsets", end_offsets)

    def window_start(self) -> datetime:
        start = time.time() + LEAD_S
        self.release_at = start + HOLD_S
        return datetime.fromtimestamp(start, UTC)


def test_window_starting_at_the_end_of_a_busy_topic(
    env: FaultEnv, busy: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    barrier = EndBarrier(monkeypatch)
    store = SqliteCheckpointStore(tmp_path / "plans.sqlite")
    for on_ahead in ("fail", "earliest"):
        env.write_feed(on_ahead=on_ahead)
        feed = load_feed(env.feed)
        for _ in range(6):
            start = barrier.window_start()
            window = Window(start, start + timedelta(hours=1))
            plan = plan_feed(feed, env.kafka.adapter, store, RunRequest("backfill", window=window,
                                                                        window_mode="offset_cut"))  # fmt: skip
            at, _ = barrier.captured[-1]
            assert at < start.timestamp(), "the end was captured after the window start: the barrier came too late"
            assert "offset_ahead" not in {e.kind for e in plan.events}
            # Every record below the captured end was stamped before the window start: empty ranges.
            assert all(p.start == p.end == p.end_available and p.reason == "timestamp" for p in plan.partitions)

    # Whole backfill runs through the pipeline (on_ahead: earliest), their output checked against Kafka:
    # one starting past the captured end, one starting a moment before planning (a short range).
    for start in (barrier.window_start(), datetime.now(UTC) - timedelta(seconds=1)):
        handle, _, _ = env.run("backfill", {"start_timestamp": start.isoformat(),
                                            "end_timestamp": (start + timedelta(hours=1)).isoformat(),
                                            "window_mode": "offset_cut"})  # fmt: skip
        plan = handle.plan()
        assert all(p.start > 0 for p in plan.partitions), "the backfill read the log from its start"
        assert "offset_ahead" not in {e.kind for e in plan.events}
        output = plan.output
        assert output is not None
        expected = oracle(env.kafka.connection, {p.key: (p.start, p.end) for p in plan.partitions})
        assert env.published(Path(output)) == expected
    assert sum(expected.values()) > 0
