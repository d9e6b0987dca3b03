"""A feed's offsets and lag, without planning a run.

One snapshot per call (the planner's batched gathering), turned into per-partition rows
of committed offset, checkpoint, log start, end and lag. The CLI's ``tidemark status``
and the Airflow plugin's page both render these rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tidemark.checkpoints import CheckpointStore
from tidemark.config import Feed
from tidemark.kafka_io import KafkaAdapter
from tidemark.planner import snapshot_feed


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    leader: int
    committed: int | None
    checkpoint: int | None
    log_start: int
    end: int
    lag: int | None  # None: no committed offset and no checkpoint yet

    @property
    def label(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True)
class FeedStatus:
    feed: str
    group: str
    isolation: str
    partitions: tuple[PartitionStatus, ...]

    @property
    def total_lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    @property
    def unpositioned(self) -> int:
        return sum(p.lag is None for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_lag": self.total_lag, "unpositioned": self.unpositioned}


def feed_status(feed: Feed, adapter: KafkaAdapter, checkpoints: CheckpointStore) -> FeedStatus:
    snap = snapshot_feed(feed, adapter, checkpoints)
    rows = []
    for s in snap.partitions:
        end = s.end_for(feed.isolation)
        position = s.committed if s.committed is not None else s.checkpoint
        lag = None if position is None else max(end - position, 0)
        rows.append(PartitionStatus(s.topic, s.partition, s.leader, s.committed, s.checkpoint, s.log_start, end, lag))
    return FeedStatus(feed.name, feed.group, feed.isolation, tuple(rows))
