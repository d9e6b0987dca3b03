"""Gathering a feed's planning inputs from Kafka, the checkpoint store and the output, then planning.

The I/O half of the planner: :func:`snapshot_feed` gathers the values
:func:`~tidemark.planning.resolve.build_plan` needs with a fixed number of batched, timed
admin calls (the count grows with brokers, never with partitions), and :func:`plan_feed`
joins the two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import CheckpointStore
from tidemark.config.models import Feed
from tidemark.errors import AuthorizationError, ConfigError, KafkaUnavailableError, PlanningError
from tidemark.kafka.adapter import Committed, KafkaAdapter, PartitionInfo
from tidemark.output.base import Publisher
from tidemark.planning.committing import committing_request
from tidemark.planning.plan import Event, Plan, RecoveredPosition
from tidemark.planning.requests import RunRequest
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
    build_plan,
    mark_new_partitions,
    recreated_topics,
)
from tidemark.planning.topics import resolve_feed_topics, topic_events

SCHEDULED = RunRequest()  # the request of a scheduled run: no parameters


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
    shown_runs: Mapping[TP, str] = field(default_factory=dict)  # the run ledger's run id per partition shown


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

    Kafka is asked twice, each time in one run of batched calls: where the group is
    (:func:`_ask_positions`), then, once the positions say which timestamp lookups are
    needed, the logs' offsets and the configs (:func:`_ask_offsets`, whose order matters).
    Between the two, the checkpoint store's positions are read, and ``recover`` (the
    output's :meth:`~tidemark.output.base.Publisher.positions`) is asked only when some
    partition has neither a committed offset nor a checkpoint. Timestamp lookups run only
    where needed: the reset timestamp for partitions with no offsets at all
    (``reset_timestamp_ms``), the window bounds for every partition (backfill).
    """
    before = adapter.requests
    infos, group_operations, committed = _ask_positions(adapter, feed)
    tps = [(i.topic, i.partition) for i in infos]
    saved, shown = checkpoints.get(feed.group, tps), checkpoints.shown(feed.name)
    positions = [  # the offsets come later; the positions decide which lookups are needed
        PartitionSnapshot(
            topic=i.topic, partition=i.partition, leader=i.leader, log_start=0, high_watermark=0, last_stable=0,
            committed=None if (c := committed.get((i.topic, i.partition))) is None else c.offset,
            committed_metadata="" if c is None else c.metadata,
            checkpoint=None if (cp := saved.get((i.topic, i.partition))) is None else cp.offset,
            checkpoint_topic_id=None if cp is None else cp.topic_id, topic_id=i.topic_id or None,
            shown=None if (sh := shown.get((i.topic, i.partition))) is None else sh.position,
            shown_topic_id=None if sh is None else sh.topic_id,
        )
        for i in infos
    ]  # fmt: skip
    bare = {s.key for s in positions if s.committed is None and s.checkpoint is None}
    recovered = recover() if recover is not None and bare else None
    # A recreated topic's positions belong to the old topic: its partitions start like bare ones.
    recreated = recreated_topics(positions)
    if window_start_ms is not None:
        starts_at: tuple[list[TP], int] | None = (tps, window_start_ms)
    elif reset_timestamp_ms is not None:
        starts_at = ([s.key for s in positions if s.topic in recreated or s.key in bare], reset_timestamp_ms)
    else:
        starts_at = None
    leaders = sorted({i.leader for i in infos if i.leader >= 0})
    found = _ask_offsets(adapter, feed, tps, leaders[0] if leaders else None, starts_at, window_end_ms, end_skew_ms)
    snaps = [found.snapshot(known, feed.isolation, recovered) for known in positions]
    retention = RetentionInfo(
        schedule_interval=feed.interval,
        offsets_retention_ms=_to_ms(found.broker_cfg.get(OFFSETS_RETENTION_MINUTES), 60_000),
        topic_retention_ms={t: _to_ms(found.topic_cfg.get(t, {}).get(RETENTION_MS)) for t in feed.topics},
    )
    log_append = tuple(t for t in feed.topics if found.topic_cfg.get(t, {}).get(TIMESTAMP_TYPE) == "LogAppendTime")
    notices = (*found.notices, *(recovered.events if recovered is not None else ()))  # the output's own findings
    return FeedSnapshot(
        mark_new_partitions(snaps), retention, adapter.requests - before, log_append, recovered,
        group_operations, notices, {tp: s.run_id for tp, s in shown.items()},
    )  # fmt: skip


def _ask_positions(
    adapter: KafkaAdapter, feed: Feed
) -> tuple[list[PartitionInfo], frozenset[str] | None, dict[TP, Committed]]:
    """The feed's partitions, what the principal may do with the group, and the group's committed offsets.

    The group's operations are asked before OffsetFetch, which without Describe on the group
    only times out: they name the missing ACL. Any other failure leaves them unknown; the
    OffsetFetch that follows retries and reports it as before.
    """
    try:
        infos = adapter.partitions(feed.topics)
        try:
            group_operations = adapter.group_operations(feed.group)
        except KafkaUnavailableError:
            group_operations = None
    except AuthorizationError as exc:
        raise AuthorizationError(f"{exc} (nothing was read or committed)") from exc
    return infos, group_operations, adapter.committed(feed.group, [(i.topic, i.partition) for i in infos])


@dataclass(frozen=True)
class _Offsets:
    """What Kafka said of the logs at one moment: offsets, timestamp lookups and the configs that may be read."""

    log_start: Mapping[TP, int]
    stable: Mapping[TP, int] | None  # the last stable offsets (read_committed feeds)
    hw: Mapping[TP, int]
    ts_start: Mapping[TP, int | None]
    ts_end: Mapping[TP, int | None]
    ts_cut: Mapping[TP, int | None]
    topic_cfg: Mapping[str, Mapping[str, str]]
    broker_cfg: Mapping[str, str]
    notices: tuple[Event, ...]

    def snapshot(
        self, known: PartitionSnapshot, isolation: str, recovered: RecoveredPosition | None
    ) -> PartitionSnapshot:
        """``known`` (its positions) with these offsets; every timestamp answer is seen from the frozen log."""
        tp = known.key
        high = self.hw[tp]
        last_stable = high if self.stable is None else min(self.stable[tp], high)
        end = last_stable if isolation == "read_committed" else high
        return replace(
            known,
            log_start=self.log_start[tp],
            high_watermark=high,
            last_stable=last_stable,
            ts_start_offset=_within(self.ts_start.get(tp), end),
            ts_end_offset=_within(self.ts_end.get(tp), end),
            ts_cut_end_offset=_within(self.ts_cut.get(tp), end),
            table=_recovered_end(recovered, tp, known.topic_id or ""),
        )


def _ask_offsets(
    adapter: KafkaAdapter,
    feed: Feed,
    tps: list[TP],
    broker: int | None,
    starts_at: tuple[list[TP], int] | None,
    window_end_ms: int | None,
    end_skew_ms: int,
) -> _Offsets:
    """The logs' offsets, the start lookups (``starts_at``: partitions and time), the configs, the end lookups.

    The order matters: the last stable offset is listed before the high watermark, so the
    captured LSO never exceeds the captured HW, and the log start before both; timestamps
    are looked up after the ends, and an answer past the captured end counts as "no record
    at or after it" (:func:`_within`), so every offset in the snapshot lies in the frozen
    log. With ``end_skew_ms`` (exact windows) the end is looked up that much later on topics
    stamped with CreateTime, and the unwidened cut is kept as ``ts_cut_end_offset``.

    The configs are optional: without DescribeConfigs on a topic its retention is unknown (no
    warning) and its timestamps are taken as CreateTime (exact windows keep their margin);
    without it on the cluster, the group offsets' retention is unknown. Each skipped read is
    a ``permission_missing`` event.
    """
    readable = [t for t in feed.topics if _may(adapter.topic_operations.get(t), "DESCRIBE_CONFIGS")]
    log_start = adapter.log_start_offsets(tps)
    stable = adapter.end_offsets(tps, "read_committed") if feed.isolation == "read_committed" else None
    hw = adapter.end_offsets(tps, "read_uncommitted")
    ts_start = adapter.offsets_for_timestamp(starts_at[0], starts_at[1], feed.isolation) if starts_at else {}
    during = "reading its retention.ms and timestamp type"
    notices = [
        Event("permission_missing", f"{adapter.denied('topic', t, 'DescribeConfigs', during)}; no retention warning "
              "for it", topic=t)
        for t in sorted(set(feed.topics) - set(readable))
    ]  # fmt: skip
    names = [RETENTION_MS, TIMESTAMP_TYPE]
    try:
        topic_cfg, broker_cfg = adapter.topic_and_broker_configs(readable, names, broker, [OFFSETS_RETENTION_MINUTES])
    except AuthorizationError as exc:
        if broker is None:
            raise
        notices.append(Event("permission_missing", f"{exc}; no warning about the group offsets' retention"))
        topic_cfg, broker_cfg = adapter.topic_and_broker_configs(readable, names, None, [])
    ts_cut = adapter.offsets_for_timestamp(tps, window_end_ms, feed.isolation) if window_end_ms is not None else {}
    ts_end = dict(ts_cut)
    widened = [tp for tp in tps if topic_cfg.get(tp[0], {}).get(TIMESTAMP_TYPE) != "LogAppendTime"]
    if window_end_ms is not None and end_skew_ms and widened:
        ts_end.update(adapter.offsets_for_timestamp(widened, window_end_ms + end_skew_ms, feed.isolation))
    return _Offsets(log_start, stable, hw, ts_start, ts_end, ts_cut, topic_cfg, broker_cfg, tuple(notices))


def _may(operations: frozenset[str] | None, operation: str) -> bool:
    return operations is None or operation in operations or "ALL" in operations


def _choose(
    feed: Feed, snapshots: Sequence[PartitionSnapshot], topics: Sequence[str] | None, partitions: Sequence[int] | None
) -> tuple[PartitionSnapshot, ...]:
    """The partitions a replay or backfill asked for; unknown topics or partitions are refused by name."""
    if not topics and not partitions:
        return tuple(snapshots)
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
    request: RunRequest = SCHEDULED,
    *,
    output: Publisher | None = None,
    now: datetime | None = None,
) -> Plan:
    """Gather the feed's offsets and plan one run of ``request`` (see :func:`build_plan` for the rules).

    The plan is then admitted (:func:`_admit`): the principal's permissions checked, and a
    backfill or replay that commits checked as the feed's next run
    (:func:`~tidemark.planning.committing.committing_request`).

    The planner's :class:`PlanRequest` is built from ``request`` first, so a request it
    refuses (a backfill without a window, ...) is refused before any Kafka call. Bounds
    given as timestamps follow the request's ``window_mode`` and ``max_skew`` (default: the
    feed's ``time_windows``): exact windows widen the end by the skew and filter by
    timestamp in the job (:class:`TimeFilter`).

    ``output`` is the feed's own output (:func:`~tidemark.output.publisher_for`): where a
    scheduled run's partitions with neither committed offsets nor checkpoints recover their
    position, and where a committing backfill or replay finds the output's end when the run
    ledger shows none. Without it, the plan is made from Kafka and the checkpoint store alone.
    """
    feed = resolve_feed_topics(feed, adapter.topic_names, adapter.connection.bootstrap_servers)  # a pattern's topics
    asked = PlanRequest(
        feed=feed.name, group=feed.group, policy=Policy.from_feed(feed), created_at=now or datetime.now(UTC),
        mode=request.mode, commit=request.commit, isolation=feed.isolation, window=request.window,
        replay=request.replay,
    )  # fmt: skip
    start_ms, end_ms = asked.lookup_ms()
    exact = (request.window_mode or feed.time_windows.mode) == "exact" and (start_ms, end_ms) != (None, None)
    skew = request.max_skew
    skew_ms = feed.time_windows.max_skew_ms if skew is None else int(skew.total_seconds() * 1000)
    if skew_ms < 0:
        raise PlanningError(f"feed '{feed.name}': the timestamp skew bound must not be negative, got {skew}")
    snap = snapshot_feed(
        feed,
        adapter,
        checkpoints,
        # a replay from "committed" falls back to the feed's reset policy, timestamp included
        reset_timestamp_ms=feed.reset_timestamp_ms if start_ms is None else None,
        window_start_ms=start_ms,
        window_end_ms=end_ms,
        end_skew_ms=skew_ms if exact else 0,
        recover=(lambda: output.positions(feed)) if output is not None and request.mode == "scheduled" else None,
    )
    if exact:
        asked = replace(asked, time_filter=TimeFilter(start_ms, end_ms, skew_ms, snap.log_append_time))
    chosen = _choose(feed, snap.partitions, request.topics, request.partitions)
    plan = build_plan(asked, Observed(chosen, snap.retention, snap.recovered, checkpoints.feed_has_runs(feed.name)))
    return _admit(plan, request, feed, adapter, snap, output)


def _admit(
    plan: Plan, request: RunRequest, feed: Feed, adapter: KafkaAdapter, snap: FeedSnapshot, output: Publisher | None
) -> Plan:
    """``plan`` as the run may take it, with the snapshot's notices; refused before anything happens when its
    principal could not read its ranges or commit its ends. A committing backfill or replay is checked as the
    feed's next run against where the feed's output ends: the run ledger's shown positions, else (asked only
    when the ledger shows nothing of the feed's partitions) the output's recorded position."""
    after = " (nothing was read or committed)"
    for topic in sorted({p.topic for p in plan.partitions if p.end > p.start}):
        if not _may(adapter.topic_operations.get(topic), "READ"):
            raise adapter.denied("topic", topic, "Read", f"reading plan {plan.plan_id}'s ranges", after)
    if plan.commit and not _may(snap.group_operations, "READ"):
        raise adapter.denied("group", feed.group, "Read", f"committing plan {plan.plan_id}'s ends", after)
    # A scheduled run reports the topics a pattern feed newly matches or no longer reads (a backfill or replay
    # reads what it was asked for: they are not its news).
    scheduled = request.mode == "scheduled"
    notices = (*topic_events(feed, snap.partitions, snap.shown_runs), *snap.notices) if scheduled else snap.notices
    plan = replace(plan, events=(*plan.events, *notices)) if notices else plan
    if not plan.commit or request.mode == "scheduled" or request.dry_run:  # a dry run commits nothing
        return plan
    ends = {s.key: s.shown for s in snap.partitions if s.shown is not None}
    if not ends and output is not None:
        recovered = output.positions(feed)
        ends = dict(recovered.ends) if recovered is not None else {}
    return committing_request(feed, plan, request, ends)
