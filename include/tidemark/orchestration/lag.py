"""When a lag-triggered feed runs: the pure rule, and the cheap Kafka look-ups it is fed with.

A feed's ``trigger:`` (:class:`tidemark.config.models.Trigger`) names thresholds: records
behind (``lag_records``) and the age of the oldest unread record (``oldest_unread_age``).
One check is a :class:`LagReading` taken by :class:`LagProbe` with offset look-ups only:
the group's committed offsets (one OffsetFetch), the partitions' ends under the feed's
isolation (one ListOffsets) and, for ``oldest_unread_age``, the first offset at or after
``now - age`` (one more ListOffsets): a partition whose committed position is below that
offset holds an unread record older than the age, so no record is ever fetched.
:func:`decide` turns a reading into "run now" or "wait, because ...": it waits while a run
is queued or running, for ``min_interval`` after the last firing, and, after a firing,
until the group's committed offsets move (the run committed) or :data:`RUN_START_GRACE_S`
passed without a run (a run that failed without committing is started again then). What
it needs to remember about the last firing is a :class:`Fired`, which the Airflow trigger
keeps in Airflow's database (the asset's state) and ``tidemark watch`` in memory: nothing
here holds state between checks. No Airflow import: the CLI uses this module too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tidemark._types import Isolation
from tidemark._types import TopicPartition as TP
from tidemark.config.models import Feed, OnMissing, TopicPattern
from tidemark.errors import KafkaUnavailableError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection, logged
from tidemark.planning.topics import matching_topics
from tidemark.storage import Location

# After a firing whose run has not moved the group's offsets, the next firing waits this long (or
# min_interval, if longer): the scheduler creates the run within seconds, and a run queued or running is
# seen as such; what is left is a run that ended without committing (failed, or its DAG paused).
RUN_START_GRACE_S = 300.0
# Partitions added to a feed's topics are seen within this long (a metadata request, not every check).
PARTITIONS_REFRESH_S = 300.0
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Thresholds:
    """The part of a feed's ``trigger:`` the rule reads, in plain numbers (the Airflow trigger's kwargs)."""

    lag_records: int | None
    oldest_unread_age_ms: int | None
    min_interval_s: float

    @classmethod
    def of(cls, feed: Feed) -> Thresholds:
        if feed.trigger is None:
            raise ValueError(f"feed '{feed.name}' has no trigger")
        t = feed.trigger
        return cls(t.lag_records, t.oldest_unread_age_ms, t.min_interval_s)


@dataclass(frozen=True)
class LagReading:
    """One check of a feed's lag: records behind, the partitions holding an unread record older than the age.

    ``positions``: each partition's committed offset (``-1``: none), as ``topic[partition]``;
    :func:`decide` compares them with the positions of the last firing to see whether a run committed.
    """

    at_ms: int
    records: int
    overdue: tuple[str, ...] = ()
    positions: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "lag_records": self.records, "overdue_partitions": list(self.overdue)}


@dataclass(frozen=True)
class Fired:
    """The last firing: when, and where the group's committed offsets were then."""

    at_ms: int
    positions: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "positions": dict(self.positions)}

    @classmethod
    def from_json(cls, doc: Any) -> Fired | None:
        """The stored firing, or ``None`` for nothing stored (or a shape this version does not know)."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("at_ms"), int):
            return None
        positions = doc.get("positions")
        if not isinstance(positions, Mapping):
            return None
        return cls(int(doc["at_ms"]), {str(k): int(v) for k, v in positions.items()})


@dataclass(frozen=True)
class Decision:
    fire: bool
    reason: str


def decide(rule: Thresholds, reading: LagReading, last: Fired | None, active_runs: int) -> Decision:
    """Whether the feed runs now, and why (or why not), from one reading. Pure: everything comes in.

    In order: a run queued or running waits for it (never two runs of one feed); a firing whose
    run has not committed yet (the group's offsets where they were then) waits, up to
    :data:`RUN_START_GRACE_S` or ``min_interval``; ``min_interval`` after any firing waits; then
    the thresholds: records behind ≥ ``lag_records``, or a partition holding an unread record
    older than ``oldest_unread_age``.
    """
    if active_runs > 0:
        return Decision(False, f"{active_runs} run(s) of the feed queued or running")
    since_s = None if last is None else (reading.at_ms - last.at_ms) / 1000
    if last is not None and since_s is not None:
        settle_s = max(RUN_START_GRACE_S, rule.min_interval_s)
        if dict(reading.positions) == dict(last.positions) and since_s < settle_s:
            return Decision(
                False,
                f"fired {since_s:.0f}s ago and the group's offsets have not moved since: waiting for that run "
                f"(up to {settle_s:.0f}s)",
            )
        if since_s < rule.min_interval_s:
            return Decision(False, f"fired {since_s:.0f}s ago; min_interval is {rule.min_interval_s:.0f}s")
    reasons = []
    if rule.lag_records is not None and reading.records >= rule.lag_records:
        reasons.append(f"lag {reading.records} records >= lag_records {rule.lag_records}")
    if rule.oldest_unread_age_ms is not None and reading.overdue:
        reasons.append(
            f"unread records older than {rule.oldest_unread_age_ms / 1000:.0f}s in {', '.join(reading.overdue)}"
        )
    if reasons:
        return Decision(True, "; ".join(reasons))
    return Decision(False, f"below the thresholds (lag {reading.records} records, no partition overdue)")


CAUSE_FILE = "trigger.json"


def record_cause(run_dir: str, cause: str, lag_events: Sequence[Mapping[str, Any]] = (), run_type: str = "") -> None:
    """Write why a feed run started beside the run (``trigger.json``): ``lag`` with the readings that fired it,
    ``schedule`` or ``manual``. The Airflow plan task and ``tidemark watch`` both write it."""
    doc = {"cause": cause, "run_type": run_type, "lag_events": [dict(e) for e in lag_events]}
    (Location.of(run_dir) / CAUSE_FILE).write_text(json.dumps(doc))


def _key(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


def _or_none(offset: int | None) -> int:
    return -1 if offset is None else offset


def reading_of(
    at_ms: int,
    committed: Mapping[TP, int | None],
    ends: Mapping[TP, int],
    *,
    fallback: Mapping[TP, int],
    first_young: Mapping[TP, int | None] | None = None,
) -> LagReading:
    """A reading from look-up results (pure): ``fallback`` is where a partition without a committed offset starts.

    ``first_young``: per partition, the first offset stamped at or after ``now - oldest_unread_age``
    (``None``: no such record): a partition is overdue when it has unread records and its position
    is below that offset (or every record is older).
    """
    records = 0
    overdue = []
    for tp, end in sorted(ends.items()):
        own = committed.get(tp)
        position = own if own is not None else fallback.get(tp, end)
        behind = max(end - position, 0)
        records += behind
        if first_young is not None and behind > 0:
            young = first_young.get(tp)
            if young is None or young > position:
                overdue.append(_key(tp))
    positions = {_key(tp): _or_none(committed.get(tp)) for tp in sorted(ends)}
    return LagReading(at_ms, records, tuple(overdue), positions)


class LagProbe:
    """Reads a feed's lag with offset look-ups only, keeping its two clients between checks.

    Blocking (confluent-kafka): the Airflow trigger calls :meth:`read` in a thread. The
    Consumer only asks for the group's offsets (OffsetFetch): it never subscribes, so it
    never joins the group and never takes partitions from the feed's runs.
    """

    def __init__(
        self,
        connection: KafkaConnection,
        topics: Sequence[str],
        group: str,
        isolation: Isolation = "read_committed",
        on_missing: OnMissing = "earliest",
        pattern: TopicPattern | None = None,
    ) -> None:
        self.topics = tuple(topics)
        # A pattern feed's topics are its matches, listed again with the partitions (a topic created later counts).
        self.pattern = pattern
        self.group = group
        self.isolation: Isolation = isolation
        self.on_missing = on_missing
        self._connection = connection
        self._adapter = KafkaAdapter(connection, timeout_s=PROBE_TIMEOUT_S)
        self._consumer: Consumer | None = None
        self._partitions: list[TP] = []
        self._partitions_at = float("-inf")

    @classmethod
    def for_feed(cls, feed: Feed, connection: KafkaConnection) -> LagProbe:
        return cls(connection, feed.topics, feed.group, feed.isolation, feed.on_missing, feed.topic_pattern)

    def _tps(self) -> list[TP]:
        if time.monotonic() - self._partitions_at >= PARTITIONS_REFRESH_S or not self._partitions:
            if self.pattern is not None:
                self.topics = matching_topics(self.pattern, self._adapter.topic_names())
            self._partitions = [(p.topic, p.partition) for p in self._adapter.partitions(self.topics)]
            self._partitions_at = time.monotonic()
        return self._partitions

    def _committed(self, tps: list[TP]) -> dict[TP, int | None]:
        if self._consumer is None:
            settings = {"group.id": self.group, "enable.auto.commit": False, "client.id": "tidemark-lag-trigger",
                        "socket.timeout.ms": int(PROBE_TIMEOUT_S * 1000)}  # fmt: skip
            config = self._connection.client_config(**settings)
            self._consumer = Consumer(logged(config))
        try:
            result = self._consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=PROBE_TIMEOUT_S)
        except KafkaException as exc:
            self.close()  # a fresh client next time: it looks the coordinator up again
            raise KafkaUnavailableError(f"OffsetFetch for group '{self.group}' failed: {exc.args[0]}") from exc
        out: dict[TP, int | None] = {}
        for tp in result:
            if tp.error is not None:
                raise KafkaUnavailableError(
                    f"OffsetFetch for group '{self.group}' on {tp.topic}[{tp.partition}]: {tp.error}"
                )
            out[(tp.topic, tp.partition)] = int(tp.offset) if tp.offset >= 0 else None
        return out

    def read(self, oldest_unread_age_ms: int | None = None, now_ms: int | None = None) -> LagReading:
        """One check: committed offsets, ends and (for an age threshold) the first young offsets."""
        at_ms = int(time.time() * 1000) if now_ms is None else now_ms
        tps = self._tps()
        committed = self._committed(tps)
        ends = self._adapter.end_offsets(tps, self.isolation)
        missing = [tp for tp in tps if committed.get(tp) is None]
        fallback: dict[TP, int] = {}
        if missing and self.on_missing != "latest":
            # Where a run would start without group offsets (timestamp: at most this far back): an upper bound.
            fallback = self._adapter.log_start_offsets(missing)
        first_young = None
        if oldest_unread_age_ms is not None:
            first_young = self._adapter.offsets_for_timestamp(tps, at_ms - oldest_unread_age_ms, self.isolation)
        return reading_of(at_ms, committed, ends, fallback=fallback, first_young=first_young)

    @property
    def requests(self) -> int:
        return self._adapter.requests

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
