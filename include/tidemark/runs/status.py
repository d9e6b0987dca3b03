"""A feed's offsets and lag, without planning a run.

One snapshot per call (the planner's batched gathering), turned into per-partition rows
of committed offset, checkpoint, log start, end and lag. The CLI's ``tidemark status``
and the Airflow plugin's page both render these rows. With ``lag_times`` the rows also
carry lag in time: the age of the oldest unread record, read from the record at the
group's position (Kafka keeps no offset-to-timestamp index, so this costs one small fetch).

:func:`shared_adapter` gives a long-lived process (the Airflow api-server's view) one Kafka
adapter per connection instead of one per request: a client is built, and bootstraps, once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tidemark.checkpoints.store import CheckpointStore
from tidemark.config.models import Feed
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.planning.resolve import retention_warnings
from tidemark.planning.topics import resolve_feed_topics
from tidemark.runs.gather import snapshot_feed

# The adapters shared_adapter built, by connection and timeout. Few: one per connection the process reads,
# and an edited connection replaces its predecessor (the oldest beyond SHARED_ADAPTERS_MAX is let go).
SHARED_ADAPTERS_MAX = 4
_shared: dict[tuple[str, tuple[tuple[str, str], ...], float], KafkaAdapter] = {}
_shared_lock = threading.Lock()


def shared_adapter(connection: KafkaConnection, timeout_s: float) -> KafkaAdapter:
    """This process's adapter for ``connection`` and ``timeout_s``, built on first use and then reused.

    Keyed by the connection's value, so a connection read afresh for each request (as the view
    reads Airflow's) finds the same adapter, and an edited one gets a new client. librdkafka's
    admin client is thread-safe; the adapter's counters are only statistics.
    """
    key = (connection.bootstrap_servers, tuple(sorted(connection.settings.items())), timeout_s)
    with _shared_lock:
        adapter = _shared.get(key)
        if adapter is None:
            adapter = _shared[key] = KafkaAdapter(connection, timeout_s=timeout_s)
            while len(_shared) > SHARED_ADAPTERS_MAX:
                del _shared[next(iter(_shared))]
        return adapter


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
    position_ts_ms: int | None = None  # timestamp of the next unread record (with lag_times)
    lag_ms: int | None = None  # how old that record is; 0 when nothing is unread

    @property
    def label(self) -> str:
        return f"{self.topic}[{self.partition}]"

    @property
    def position(self) -> int | None:
        return self.committed if self.committed is not None else self.checkpoint

    @property
    def offsets_expired(self) -> bool:
        """Kafka lost the group's offset but Tidemark's checkpoint remembers it."""
        return self.committed is None and self.checkpoint is not None

    @property
    def data_lost(self) -> bool:
        """Retention deleted records the group never read (its position is below the log start)."""
        return self.position is not None and self.position < self.log_start


@dataclass(frozen=True)
class FeedStatus:
    feed: str
    group: str
    isolation: str
    partitions: tuple[PartitionStatus, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)  # retention shorter than the schedule

    @property
    def total_lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    @property
    def unpositioned(self) -> int:
        return sum(p.lag is None for p in self.partitions)

    @property
    def max_lag_ms(self) -> int | None:
        known = [p.lag_ms for p in self.partitions if p.lag_ms is not None]
        return max(known) if known else None

    @property
    def trouble(self) -> tuple[str, ...]:
        """Why this feed needs a person: lost data, expired offsets, retention too short."""
        out = []
        lost = [p.label for p in self.partitions if p.data_lost]
        if lost:
            out.append(f"data lost: unread records deleted by retention on {', '.join(lost[:5])}"
                       + (f" and {len(lost) - 5} more" if len(lost) > 5 else ""))  # fmt: skip
        expired = [p.label for p in self.partitions if p.offsets_expired]
        if expired:
            out.append(f"group offsets expired on {len(expired)} partitions (the next run resumes from checkpoints)")
        out.extend(self.warnings)
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "total_lag": self.total_lag,
            "unpositioned": self.unpositioned,
            "max_lag_ms": self.max_lag_ms,
            "trouble": list(self.trouble),
        }


def feed_status(
    feed: Feed, adapter: KafkaAdapter, checkpoints: CheckpointStore, *, lag_times: bool = False
) -> FeedStatus:
    feed = resolve_feed_topics(feed, adapter.topic_names, adapter.connection.bootstrap_servers)  # a pattern's topics
    snap = snapshot_feed(feed, adapter, checkpoints)
    rows = []
    positions: dict[tuple[str, int], int] = {}
    for s in snap.partitions:
        end = s.end_for(feed.isolation)
        position = s.committed if s.committed is not None else s.checkpoint
        lag = None if position is None else max(end - position, 0)
        if lag_times and lag:
            assert position is not None
            positions[s.key] = max(position, s.log_start)  # below the log start: the oldest record left
        rows.append(PartitionStatus(s.topic, s.partition, s.leader, s.committed, s.checkpoint, s.log_start, end, lag))
    if lag_times:
        stamps = adapter.timestamps_at(positions, feed.isolation) if positions else {}
        now_ms = int(time.time() * 1000)
        timed = []
        for row in rows:
            ts = stamps.get((row.topic, row.partition))
            lag_ms = None if row.lag is None else (0 if row.lag == 0 else (None if ts is None else max(now_ms - ts, 0)))
            timed.append(PartitionStatus(**{**asdict(row), "position_ts_ms": ts, "lag_ms": lag_ms}))
        rows = timed
    warnings = tuple(e.message for e in retention_warnings(snap.retention))
    return FeedStatus(feed.name, feed.group, feed.isolation, tuple(rows), warnings)
