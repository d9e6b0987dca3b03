"""Gathering a feed's planning inputs from Kafka, the checkpoint store and the output, then planning.

The I/O half of the planner: :func:`snapshot_feed` gathers the values
:func:`~tidemark.planning.resolve.build_plan` needs with a fixed number of batched, timed
admin calls (the count grows with brokers, never with partitions), and :func:`plan_feed`
joins the two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import CheckpointStore
from tidemark.config.models import Feed, WindowMode
from tidemark.errors import AuthorizationError, ConfigError, KafkaUnavailableError, PlanningError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.output import publisher_for
from tidemark.planning.plan import Event, Mode, Plan, RecoveredPosition
from tidemark.planning.resolve import (
    OFFSETS_RETENTION_MINUTES,
    RETENTION_MS,
    TIMESTAMP_TYPE,
    Observed,
    PartitionSnapshot,
    PlanRequest,
    Policy,
    RetentionInfo,
    TimeFilter,
    Window,
    build_plan,
    epoch_ms,
    mark_new_partitions,
    recreated_topics,
    replay_end_ms,
    replay_start_ms,
)

if TYPE_CHECKING:
    from tidemark.planning.requests import ReplaySpec


@dataclass(frozen=True)
class FeedSnapshot:
    """Everything the planner needs, as gathered from Kafka and the checkpoint store."""

    partitions: tuple[PartitionSnapshot, ...]
    retention: RetentionInfo
    requests: int  # admin calls issued (each fans out to at most one request per broker)
    log_append_time: tuple[str, ...] = ()  # topics stamped by the broker (message.timestamp.type)
    recovered: RecoveredPosition | None = None  # asked of the output when offsets and checkpoints are gone
    # What the principal may do with the group (None: the brokers did not say) and optional reads it may not do.
    group_operations: frozenset[str] | None = None
    notices: tuple[Event, ...] = ()


def _to_ms(value: str | None, scale: int = 1) -> int | None:
    if value is None or value == "":
        return None
    number = int(value)
    return -1 if number < 0 else number * scale


def _within(found: int | None, end: int) -> int | None:
    """A timestamp lookup's answer as seen from the log frozen at ``end``.

    Timestamps are looked up after the end was captured; on a busy topic the first record
    at or after the time may have arrived since, past ``end``. In the frozen log no record
    is at or after that time, which is what ``None`` says (an empty range at the end, never
    a start "past the end of the log" taken for a recreated topic).
    """
    return None if found is not None and found > end else found


def _recovered_end(recovered: RecoveredPosition | None, tp: tuple[str, int], topic_id: str) -> int | None:
    """The output's recorded end of ``tp``, unless it was recorded on another topic id (a recreated topic)."""
    if recovered is None:
        return None
    recorded = recovered.topic_ids.get(tp[0])
    if recorded and topic_id and recorded != topic_id:
        return None
    return recovered.ends.get(tp)


def snapshot_feed(
    feed: Feed,
    adapter: KafkaAdapter,
    checkpoints: CheckpointStore,
    *,
    reset_timestamp_ms: int | None = None,
    window_start_ms: int | None = None,
    window_end_ms: int | None = None,
    end_skew_ms: int = 0,
    recover: Callable[[], RecoveredPosition | None] | None = None,
) -> FeedSnapshot:
    """Gather offsets for every partition of the feed's topics with batched admin calls.

    The order matters: the last stable offset is listed before the high watermark, so the
    captured LSO never exceeds the captured HW, and the log start before both; timestamps
    are looked up after the ends, and an answer past the captured end counts as "no record
    at or after it" (:func:`_within`), so every offset in the snapshot lies in the frozen
    log. Timestamp lookups run only where needed: the reset timestamp for partitions with no offsets at
    all (``reset_timestamp_ms``), the window bounds for every partition (backfill).
    With ``end_skew_ms`` (exact windows) the end is looked up that much later on topics
    stamped with CreateTime, and the unwidened cut is kept as ``ts_cut_end_offset``.
    ``recover`` (the output's :meth:`~tidemark.output.base.Publisher.positions`) is asked only
    when some partition has neither a committed offset nor a checkpoint.
    """
    before = adapter.requests
    try:
        infos = adapter.partitions(feed.topics)
        group_operations = _group_operations(adapter, feed.group)
    except AuthorizationError as exc:
        raise AuthorizationError(f"{exc} (nothing was read or committed)") from exc
    tps = [(i.topic, i.partition) for i in infos]
    committed = adapter.committed(feed.group, tps)
    saved = checkpoints.get(feed.group, tps)
    shown = checkpoints.shown(feed.name)
    positions = []  # the offsets come later; the positions decide which lookups are needed
    for info in infos:
        c, cp = committed.get((info.topic, info.partition)), saved.get((info.topic, info.partition))
        positions.append(
            PartitionSnapshot(
                topic=info.topic, partition=info.partition, leader=info.leader, log_start=0, high_watermark=0,
                last_stable=0, committed=None if c is None else c.offset,
                committed_metadata="" if c is None else c.metadata, checkpoint=None if cp is None else cp.offset,
                checkpoint_topic_id=None if cp is None else cp.topic_id,
                topic_id=info.topic_id or None,
                shown=None if (sh := shown.get((info.topic, info.partition))) is None else sh.position,
                shown_topic_id=None if sh is None else sh.topic_id,
            )
        )  # fmt: skip
    bare_tps = [s.key for s in positions if s.committed is None and s.checkpoint is None]
    recovered = recover() if recover is not None and bare_tps else None
    # A recreated topic's positions belong to the old topic: its partitions start like bare ones.
    recreated = recreated_topics(positions)
    reset_tps = [s.key for s in positions if s.topic in recreated or s.key in set(bare_tps)]
    log_start = adapter.log_start_offsets(tps)
    stable = adapter.end_offsets(tps, "read_committed") if feed.isolation == "read_committed" else None
    hw = adapter.end_offsets(tps, "read_uncommitted")
    ts_start: dict[TP, int | None] = {}
    if window_start_ms is not None:
        ts_start = adapter.offsets_for_timestamp(tps, window_start_ms, feed.isolation)
    elif reset_timestamp_ms is not None:
        ts_start = adapter.offsets_for_timestamp(reset_tps, reset_timestamp_ms, feed.isolation)
    leaders = sorted({i.leader for i in infos if i.leader >= 0})
    topic_cfg, broker_cfg, notices = _configs(adapter, feed, leaders[0] if leaders else None)
    ts_end: dict[TP, int | None] = {}
    ts_cut: dict[TP, int | None] = {}
    if window_end_ms is not None:
        ts_cut = adapter.offsets_for_timestamp(tps, window_end_ms, feed.isolation)
        widened = [tp for tp in tps if topic_cfg.get(tp[0], {}).get(TIMESTAMP_TYPE) != "LogAppendTime"]
        ts_end = dict(ts_cut)
        if end_skew_ms and widened:
            ts_end.update(adapter.offsets_for_timestamp(widened, window_end_ms + end_skew_ms, feed.isolation))
    snaps = []
    for known in positions:
        tp = known.key
        high = hw[tp]
        last_stable = high if stable is None else min(stable[tp], high)
        end = last_stable if feed.isolation == "read_committed" else high
        snaps.append(
            replace(
                known,
                log_start=log_start[tp],
                high_watermark=high,
                last_stable=last_stable,
                ts_start_offset=_within(ts_start.get(tp), end),
                ts_end_offset=_within(ts_end.get(tp), end),
                ts_cut_end_offset=_within(ts_cut.get(tp), end),
                table=_recovered_end(recovered, tp, known.topic_id or ""),
            )
        )
    retention = RetentionInfo(
        schedule_interval=feed.interval,
        offsets_retention_ms=_to_ms(broker_cfg.get(OFFSETS_RETENTION_MINUTES), 60_000),
        topic_retention_ms={t: _to_ms(topic_cfg.get(t, {}).get(RETENTION_MS)) for t in feed.topics},
    )
    log_append = tuple(t for t in feed.topics if topic_cfg.get(t, {}).get(TIMESTAMP_TYPE) == "LogAppendTime")
    return FeedSnapshot(
        mark_new_partitions(snaps), retention, adapter.requests - before, log_append, recovered,
        group_operations, notices,
    )  # fmt: skip


def _group_operations(adapter: KafkaAdapter, group: str) -> frozenset[str] | None:
    """Asked before OffsetFetch, which without Describe on the group only times out: this names the missing ACL.

    Any other failure leaves the operations unknown; the OffsetFetch that follows retries and reports it as before.
    """
    try:
        return adapter.group_operations(group)
    except KafkaUnavailableError:
        return None


def _configs(
    adapter: KafkaAdapter, feed: Feed, broker: int | None
) -> tuple[dict[str, dict[str, str]], dict[str, str], tuple[Event, ...]]:
    """Topic and broker configs for retention warnings and timestamp types, as far as the principal may read them.

    Both are optional: without DescribeConfigs on a topic its retention is unknown (no warning) and
    its timestamps are taken as CreateTime (exact windows keep their margin); without it on the
    cluster, the group offsets' retention is unknown. Each skipped read is a ``permission_missing`` event.
    """
    notices: list[Event] = []
    readable = [t for t in feed.topics if _may(adapter.topic_operations.get(t), "DESCRIBE_CONFIGS")]
    for topic in sorted(set(feed.topics) - set(readable)):
        error = adapter.denied("topic", topic, "DescribeConfigs", "reading its retention.ms and timestamp type")
        notices.append(Event("permission_missing", f"{error}; no retention warning for it", topic=topic))
    names = [RETENTION_MS, TIMESTAMP_TYPE]
    try:
        topic_cfg, broker_cfg = adapter.topic_and_broker_configs(readable, names, broker, [OFFSETS_RETENTION_MINUTES])
    except AuthorizationError as exc:
        if broker is None:
            raise
        notices.append(Event("permission_missing", f"{exc}; no warning about the group offsets' retention"))
        topic_cfg, broker_cfg = adapter.topic_and_broker_configs(readable, names, None, [])
    return topic_cfg, broker_cfg, tuple(notices)


def _may(operations: frozenset[str] | None, operation: str) -> bool:
    return operations is None or operation in operations or "ALL" in operations


def require_permissions(adapter: KafkaAdapter, feed: Feed, snap: FeedSnapshot, plan: Plan) -> None:
    """Refuse a plan whose principal could not read its ranges or commit its ends, before anything happens."""
    after = " (nothing was read or committed)"
    for topic in sorted({p.topic for p in plan.partitions if p.end > p.start}):
        if not _may(adapter.topic_operations.get(topic), "READ"):
            raise adapter.denied("topic", topic, "Read", f"reading plan {plan.plan_id}'s ranges", after)
    if plan.commit and not _may(snap.group_operations, "READ"):
        raise adapter.denied("group", feed.group, "Read", f"committing plan {plan.plan_id}'s ends", after)


def _choose(
    feed: Feed, snapshots: Sequence[PartitionSnapshot], topics: Sequence[str] | None, partitions: Sequence[int] | None
) -> tuple[PartitionSnapshot, ...]:
    """The partitions a replay or backfill asked for; unknown topics or partitions are refused by name."""
    if topics and (unknown := sorted(set(topics) - set(feed.topics))):
        raise ConfigError(
            f"parameter 'topics': {', '.join(unknown)} is not a topic of feed '{feed.name}' "
            f"(its topics: {', '.join(feed.topics)})"
        )
    wanted_topics = set(topics or feed.topics)
    pool = [s for s in snapshots if s.topic in wanted_topics]
    if partitions:
        present = {s.partition for s in pool}
        if missing := sorted(set(partitions) - present):
            raise ConfigError(
                f"parameter 'partitions': {', '.join(map(str, missing))} not found in "
                f"{', '.join(sorted(wanted_topics))} (partitions there: {', '.join(map(str, sorted(present)))})"
            )
        pool = [s for s in pool if s.partition in set(partitions)]
    return tuple(pool)


def plan_feed(
    feed: Feed,
    adapter: KafkaAdapter,
    checkpoints: CheckpointStore,
    *,
    mode: Mode = "scheduled",
    commit: bool | None = None,
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    now: datetime | None = None,
    replay: ReplaySpec | None = None,
    window_mode: WindowMode | None = None,
    max_skew: timedelta | None = None,
    topics: Sequence[str] | None = None,
    partitions: Sequence[int] | None = None,
) -> Plan:
    """Gather the feed's offsets and plan one run (see :func:`build_plan` for the rules).

    ``mode="backfill"`` needs ``window_start`` (``window_end`` optional); ``mode="replay"``
    needs ``replay``, a :class:`~tidemark.planning.requests.ReplaySpec`. Bounds given as timestamps
    follow ``window_mode`` and ``max_skew`` (default: the feed's ``time_windows``): exact
    windows widen the end by the skew and filter by timestamp in the job (:class:`TimeFilter`).
    """
    now = now or datetime.now(UTC)
    window: Window | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    if (window_start is not None or window_end is not None) and mode != "backfill":
        raise PlanningError("a time window is only used with mode='backfill'")
    if replay is not None and mode != "replay":
        raise PlanningError("a replay spec is only used with mode='replay'")
    if mode == "backfill":
        if window_start is None:
            raise PlanningError(f"feed '{feed.name}': a backfill needs window_start")
        window = Window(window_start, window_end)
        start_ms, end_ms = epoch_ms(window.start), None if window.end is None else epoch_ms(window.end)
    elif mode == "replay":
        if replay is None:
            raise PlanningError(f"feed '{feed.name}': a replay needs a replay spec")
        start_ms, end_ms = replay_start_ms(replay, now), replay_end_ms(replay)
    exact = (window_mode or feed.time_windows.mode) == "exact" and (start_ms is not None or end_ms is not None)
    skew_ms = feed.time_windows.max_skew_ms if max_skew is None else int(max_skew.total_seconds() * 1000)
    if skew_ms < 0:
        raise PlanningError(f"feed '{feed.name}': the timestamp skew bound must not be negative, got {max_skew}")
    snap = snapshot_feed(
        feed,
        adapter,
        checkpoints,
        # a replay from "committed" falls back to the feed's reset policy, timestamp included
        reset_timestamp_ms=feed.reset_timestamp_ms if start_ms is None else None,
        window_start_ms=start_ms,
        window_end_ms=end_ms,
        end_skew_ms=skew_ms if exact else 0,
        recover=(lambda: publisher_for(feed).positions(feed)) if mode == "scheduled" else None,
    )
    time_filter = TimeFilter(start_ms, end_ms, skew_ms, snap.log_append_time) if exact else None
    chosen = _choose(feed, snap.partitions, topics, partitions) if (topics or partitions) else snap.partitions
    request = PlanRequest(
        feed=feed.name,
        group=feed.group,
        policy=Policy.from_feed(feed),
        created_at=now,
        mode=mode,
        commit=commit,
        isolation=feed.isolation,
        window=window,
        replay=replay,
        time_filter=time_filter,
    )
    plan = build_plan(request, Observed(chosen, snap.retention, snap.recovered, checkpoints.feed_has_runs(feed.name)))
    require_permissions(adapter, feed, snap, plan)
    return replace(plan, events=(*plan.events, *snap.notices)) if snap.notices else plan
