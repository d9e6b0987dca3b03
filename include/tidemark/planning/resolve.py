"""The offset planner: which ``[start, end)`` each partition reads in one run, and why.

:func:`build_plan` is pure code over plain values: a :class:`PlanRequest` (what the caller
asks: the feed's policies, the mode and its bounds) and an :class:`Observed` (frozen
:class:`PartitionSnapshot` rows: committed offset, checkpoint, log start, high watermark,
last stable offset, timestamp lookups, leader; plus retention settings) go in, a
:class:`~tidemark.planning.plan.Plan` comes out. It resolves each partition's start exactly as
``docs/ARCHITECTURE.md`` and the design say (committed → checkpoint → reset policy, then
the data-loss and offset-ahead policies), freezes the end at the offsets captured now,
applies the per-run caps, splits the ranges into chunks and packs the chunks into Spark
tasks that each talk to one leader broker. The I/O half that gathers those values is
:mod:`tidemark.runs.gather`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from tidemark._types import Isolation
from tidemark._types import TopicPartition as TP
from tidemark.config.models import Feed, OnAhead, OnDataLoss, OnGroupMoved, OnMissing, OnNewPartition
from tidemark.errors import DataLossError, OffsetAheadError, PlanningError
from tidemark.planning.metadata import metadata_run_id, metadata_topic_id, writer
from tidemark.planning.plan import (
    Chunk,
    Event,
    EventKind,
    Mode,
    PartitionPlan,
    Plan,
    RecoveredPosition,
    StartReason,
    Task,
    compute_plan_id,
)
from tidemark.planning.requests import ReplaySpec, Window

CapLimit = Literal["max_records_per_partition", "max_records_per_run"]

RETENTION_MS = "retention.ms"
TIMESTAMP_TYPE = "message.timestamp.type"
OFFSETS_RETENTION_MINUTES = "offsets.retention.minutes"


# -- inputs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionSnapshot:
    """What Kafka and the checkpoint store said about one partition at planning time.

    ``ts_start_offset`` / ``ts_end_offset`` are the first offsets whose timestamp is at or
    after the reset timestamp (or a backfill window's start) and the window's end; ``None``
    means no record is at or after it. The gatherer looks them up whenever the mode or
    the reset policy needs them.
    """

    topic: str
    partition: int
    leader: int
    committed: int | None
    checkpoint: int | None
    log_start: int
    high_watermark: int
    last_stable: int
    ts_start_offset: int | None = None
    ts_end_offset: int | None = None
    ts_cut_end_offset: int | None = None  # exact windows: the unwidened cut at the window's end
    is_new: bool = False
    table: int | None = None  # the end the output table's history records (only asked when both above are None)
    committed_metadata: str = ""
    topic_id: str | None = None  # the topic's id now (None: unknown)
    checkpoint_topic_id: str | None = None  # the topic id recorded with the checkpoint (None: not recorded)
    shown: int | None = None  # the end of what the feed's output shows (the run ledger), on ``shown_topic_id``
    shown_topic_id: str | None = None

    @property
    def key(self) -> TP:
        return (self.topic, self.partition)

    @property
    def recorded_topic_id(self) -> str | None:
        """The topic id the position the planner would resume from was committed on, if recorded.

        The committed offset's metadata names it when Tidemark committed; an offset
        another client committed names none and is taken as the topic's (Kafka deletes a
        deleted topic's committed offsets, so a committed offset without an id was
        written on the topic that exists now). Without a committed offset, the
        checkpoint's id decides.
        """
        if self.committed is not None:
            return metadata_topic_id(self.committed_metadata)
        if self.checkpoint is not None:
            return self.checkpoint_topic_id
        return None

    def end_for(self, isolation: Isolation) -> int:
        """The end a reader can reach: the last stable offset under ``read_committed``."""
        return self.last_stable if isolation == "read_committed" else self.high_watermark


@dataclass(frozen=True)
class Policy:
    """The feed's resolution policies and limits, as plain values."""

    on_missing: OnMissing = "earliest"
    on_new_partition: OnNewPartition = "earliest"
    on_data_loss: OnDataLoss = "fail"
    on_ahead: OnAhead = "fail"
    on_group_moved: OnGroupMoved = "follow"
    max_records_per_partition: int | None = None
    max_records_per_run: int | None = None
    records_per_task: int = 1_000_000

    def __post_init__(self) -> None:
        if self.records_per_task < 1:
            raise PlanningError(f"records_per_task must be at least 1, got {self.records_per_task}")

    @classmethod
    def from_feed(cls, feed: Feed) -> Policy:
        return cls(
            on_missing=feed.on_missing,
            on_new_partition=feed.on_new_partition,
            on_data_loss=feed.on_data_loss,
            on_ahead=feed.on_ahead,
            on_group_moved=feed.on_group_moved,
            max_records_per_partition=feed.max_records_per_partition,
            max_records_per_run=feed.max_records_per_run,
            records_per_task=feed.records_per_task,
        )


@dataclass(frozen=True)
class RetentionInfo:
    """Retention settings the planner reports against (``None``: unknown; a negative value: unlimited)."""

    schedule_interval: timedelta | None = None
    offsets_retention_ms: int | None = None
    topic_retention_ms: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class TimeFilter:
    """An exact time window: the job keeps the records stamped in ``[start_ms, end_ms)``.

    Either bound may be open (``None``): a replay may start at a timestamp and end at an
    offset. The range's end was looked up at ``end_ms + max_skew_ms`` (not for topics in
    ``log_append_time``, whose timestamps follow offsets); the start needs no margin, as
    Kafka's offsets-for-times gives the earliest offset stamped at or after ``start_ms``,
    so no earlier record is stamped inside the window.
    """

    start_ms: int | None
    end_ms: int | None
    max_skew_ms: int
    log_append_time: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"mode": "exact", "start_ms": self.start_ms, "end_ms": self.end_ms, "max_skew_ms": self.max_skew_ms,
                "log_append_time": list(self.log_append_time)}  # fmt: skip


@dataclass(frozen=True)
class PlanRequest:
    """What the caller asks of one run: the feed's identity and policies, the mode and its bounds.

    ``start_overrides`` / ``end_overrides`` are offsets the caller resolved itself (reason
    ``requested``); ``commit=None`` takes the replay spec's choice, else commits scheduled
    runs only.
    """

    feed: str
    group: str
    policy: Policy
    created_at: datetime
    mode: Mode = "scheduled"
    commit: bool | None = None
    isolation: Isolation = "read_committed"
    window: Window | None = None
    replay: ReplaySpec | None = None
    time_filter: TimeFilter | None = None
    start_overrides: Mapping[TP, int] = field(default_factory=dict)
    end_overrides: Mapping[TP, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode == "backfill" and self.window is None:
            raise PlanningError("a backfill needs a time window (window start, optional end)")
        if self.mode == "replay" and self.replay is None and not self.start_overrides and not self.end_overrides:
            raise PlanningError("a replay needs a replay spec (where to start and end)")
        if self.window is not None and self.mode != "backfill":
            raise PlanningError("a time window is only used with mode='backfill'")
        if self.replay is not None and self.mode != "replay":
            raise PlanningError("a replay spec is only used with mode='replay'")

    def lookup_ms(self) -> tuple[int | None, int | None]:
        """The times the gatherer looks the ranges' start and end up at (a window's, a replay's), if any."""
        if self.window is not None:
            return epoch_ms(self.window.start), None if self.window.end is None else epoch_ms(self.window.end)
        if self.replay is not None:
            return replay_start_ms(self.replay, self.created_at), replay_end_ms(self.replay)
        return None, None


@dataclass(frozen=True)
class Observed:
    """What Kafka, the checkpoint store and the output said at planning time."""

    partitions: Sequence[PartitionSnapshot]
    retention: RetentionInfo = field(default_factory=RetentionInfo)
    recovered: RecoveredPosition | None = None  # the output's history, asked when offsets and checkpoints are gone
    # The run ledger knows runs of this feed: the group's position is no longer the feed's starting point.
    feed_has_runs: bool = False


# -- the pure planner --------------------------------------------------------------------


@dataclass(frozen=True)
class _Start:
    offset: int
    reason: StartReason


def _ev(kind: EventKind, message: str, snap: PartitionSnapshot, **details: Any) -> Event:
    return Event(kind=kind, message=message, topic=snap.topic, partition=snap.partition, details=details)


def _fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "unknown"
    if ms < 0:
        return f"{ms} (unlimited)"
    return f"{ms} ms ({timedelta(milliseconds=ms)})"


def _reset_start(
    snap: PartitionSnapshot, policy: Policy, end: int, events: list[Event], missing: list[str]
) -> _Start | None:
    """Start for a partition with neither a committed offset nor a checkpoint."""
    name = f"{snap.topic}[{snap.partition}]"
    if snap.is_new:
        offset = snap.log_start if policy.on_new_partition == "earliest" else end
        events.append(
            _ev(
                "new_partition",
                f"{name} is new (other partitions of the topic have offsets): starts at "
                f"{policy.on_new_partition} offset {offset}",
                snap,
                policy=policy.on_new_partition,
                offset=offset,
            )
        )
        return _Start(offset, policy.on_new_partition)
    if policy.on_missing == "fail":
        missing.append(name)
        return None
    if policy.on_missing == "timestamp":
        if snap.ts_start_offset is None:
            events.append(
                _ev(
                    "timestamp_past_end",
                    f"{name}: no record at or after the reset timestamp; starts at the end, offset {end}",
                    snap,
                    offset=end,
                )
            )
            offset = end
        else:
            offset = snap.ts_start_offset
    else:
        offset = snap.log_start if policy.on_missing == "earliest" else end
    events.append(
        _ev(
            "reset",
            f"{name} has no committed offset and no checkpoint: reset policy {policy.on_missing} starts at {offset}",
            snap,
            policy=policy.on_missing,
            offset=offset,
        )
    )
    return _Start(offset, policy.on_missing)


def _check_range(
    snap: PartitionSnapshot,
    start: _Start,
    policy: Policy,
    end: int,
    retention_ms: int | None,
    events: list[Event],
    lost: list[str],
    ahead: list[str],
) -> _Start:
    """Apply the data-loss and offset-ahead policies to a resolved start."""
    name = f"{snap.topic}[{snap.partition}]"
    if start.offset < snap.log_start:
        lost_range = (start.offset, snap.log_start)
        if policy.on_data_loss == "fail":
            lost.append(
                f"{name} {start.reason} offset {start.offset} is below the log start {snap.log_start}: "
                f"records [{lost_range[0]}, {lost_range[1]}) were deleted unread "
                f"({snap.log_start - start.offset} records; topic retention.ms={_fmt_ms(retention_ms)})"
            )
            return start
        events.append(
            _ev(
                "data_loss",
                f"{name}: records [{lost_range[0]}, {lost_range[1]}) were deleted before being read "
                f"(retention.ms={_fmt_ms(retention_ms)}); on_data_loss=skip starts at the log start {snap.log_start}",
                snap,
                lost_start=lost_range[0],
                lost_end=lost_range[1],
                lost_records=lost_range[1] - lost_range[0],
                retention_ms=retention_ms,
                from_reason=start.reason,
            )
        )
        return _Start(snap.log_start, "log_start")
    if start.offset > snap.high_watermark:
        if policy.on_ahead == "fail":
            ahead.append(
                f"{name} {start.reason} offset {start.offset} is past the high watermark {snap.high_watermark} "
                f"(log start {snap.log_start}): the topic was recreated or truncated"
            )
            return start
        offset = snap.log_start if policy.on_ahead == "earliest" else end
        events.append(
            _ev(
                "offset_ahead",
                f"{name}: {start.reason} offset {start.offset} is past the high watermark {snap.high_watermark} "
                f"(topic recreated or truncated); on_ahead={policy.on_ahead} starts at {offset}",
                snap,
                was=start.offset,
                high_watermark=snap.high_watermark,
                policy=policy.on_ahead,
                offset=offset,
            )
        )
        return _Start(offset, "ahead_reset")
    return start


def _cap_run(backlogs: Mapping[TP, int], limit: int) -> dict[TP, int]:
    """Share ``limit`` records over partitions fairly (water-filling), deterministically."""
    grant = dict.fromkeys(backlogs, 0)
    pending = sorted((tp for tp, b in backlogs.items() if b > 0), key=lambda tp: (backlogs[tp], tp))
    left = limit
    while pending and left > 0:
        share = left // len(pending)
        if share == 0:
            # Fewer records left than partitions: one more each, in key order, until none left.
            for tp in sorted(pending)[:left]:
                grant[tp] += 1
            break
        still = []
        for tp in pending:
            take = min(share, backlogs[tp] - grant[tp])
            grant[tp] += take
            left -= take
            if grant[tp] < backlogs[tp]:
                still.append(tp)
        pending = still
    return grant


def chunk_ranges(partitions: Iterable[PartitionPlan], records_per_task: int) -> tuple[Task, ...]:
    """Split ranges into chunks of at most ``records_per_task`` offsets and pack them per leader.

    Each task holds chunks of one leader broker only, so a Spark task fetches from one
    broker; within a leader, chunks are packed first-fit-decreasing into tasks of about
    ``records_per_task`` offsets. Empty ranges get no chunk.
    """
    by_leader: dict[int, list[Chunk]] = defaultdict(list)
    for p in sorted(partitions, key=lambda p: p.key):
        for lo in range(p.start, p.end, records_per_task):
            by_leader[p.leader].append(Chunk(p.topic, p.partition, lo, min(lo + records_per_task, p.end)))
    tasks: list[Task] = []
    for leader in sorted(by_leader):
        chunks = sorted(by_leader[leader], key=lambda c: (-(c.end - c.start), c.topic, c.partition, c.start))
        bins: list[list[Chunk]] = []
        room: list[int] = []
        for c in chunks:
            size = c.end - c.start
            for i, free in enumerate(room):
                if size <= free:
                    bins[i].append(c)
                    room[i] -= size
                    break
            else:
                bins.append([c])
                room.append(records_per_task - size)
        for b in bins:
            ordered = tuple(sorted(b, key=lambda c: (c.topic, c.partition, c.start)))
            tasks.append(Task(index=len(tasks), leader=leader, chunks=ordered))
    return tuple(tasks)


def retention_warnings(retention: RetentionInfo) -> list[Event]:
    """Warn when runs are further apart than Kafka keeps offsets or records."""
    interval = retention.schedule_interval
    if interval is None:
        return []
    interval_ms = int(interval.total_seconds() * 1000)
    events = []
    if retention.offsets_retention_ms is not None and 0 <= retention.offsets_retention_ms < interval_ms:
        events.append(
            Event(
                kind="retention_warning",
                message=(
                    f"the schedule's interval ({interval}) is longer than the brokers' offsets.retention.minutes "
                    f"({timedelta(milliseconds=retention.offsets_retention_ms)}): Kafka will delete the group's "
                    "offsets between runs and the planner will resume from Tidemark's checkpoints"
                ),
                details={"interval_ms": interval_ms, "offsets_retention_ms": retention.offsets_retention_ms},
            )
        )
    for topic in sorted(retention.topic_retention_ms):
        ms = retention.topic_retention_ms[topic]
        if ms is not None and 0 <= ms < interval_ms:
            events.append(
                Event(
                    kind="retention_warning",
                    message=(
                        f"the schedule's interval ({interval}) is longer than topic '{topic}' retention.ms "
                        f"({timedelta(milliseconds=ms)}): records may be deleted before a run reads them"
                    ),
                    topic=topic,
                    details={"interval_ms": interval_ms, "retention_ms": ms},
                )
            )
    return events


def mark_new_partitions(snapshots: Sequence[PartitionSnapshot]) -> tuple[PartitionSnapshot, ...]:
    """Flag partitions without offsets in topics whose other partitions have some."""
    known_topics = {s.topic for s in snapshots if s.committed is not None or s.checkpoint is not None
                    or s.table is not None}  # fmt: skip
    return tuple(
        replace(s, is_new=s.topic in known_topics and s.committed is None and s.checkpoint is None and s.table is None)
        for s in snapshots
    )


def recreated_topics(snapshots: Sequence[PartitionSnapshot]) -> dict[str, tuple[str, str]]:
    """Topics whose id differs from the one their positions were recorded on: topic → (old id, new id).

    Such a topic was deleted and recreated under the same name: its offsets name other
    records, so no partition of it resumes from a committed offset or a checkpoint.
    """
    found: dict[str, tuple[str, str]] = {}
    for snap in sorted(snapshots, key=lambda s: s.key):
        recorded = snap.recorded_topic_id
        if snap.topic_id and recorded and recorded != snap.topic_id and snap.topic not in found:
            found[snap.topic] = (recorded, snap.topic_id)
    return found


def _forget_positions(snap: PartitionSnapshot) -> PartitionSnapshot:
    """``snap`` with no position to resume from (its topic was recreated)."""
    return replace(snap, committed=None, checkpoint=None, table=None, is_new=False, committed_metadata="")


def _recreated_event(topic: str, ids: tuple[str, str], snapshots: Sequence[PartitionSnapshot], policy: Policy) -> Event:
    old, new = ids
    positions = {s.partition: s.committed if s.committed is not None else s.checkpoint
                 for s in snapshots if s.topic == topic}  # fmt: skip
    return Event(
        kind="topic_recreated",
        message=(
            f"topic '{topic}' was deleted and recreated (topic id {old} when its offsets were committed, {new} now): "
            f"the recorded positions ({', '.join(f'[{p}]={o}' for p, o in sorted(positions.items()))}) belong to "
            f"the old topic and are not resumed; on_missing={policy.on_missing} decides where the new topic starts"
        ),
        topic=topic,
        details={"old_topic_id": old, "new_topic_id": new, "policy": policy.on_missing,
                 "old_positions": {str(p): o for p, o in sorted(positions.items())}},
    )  # fmt: skip


def epoch_ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def replay_start_ms(spec: ReplaySpec, now: datetime) -> int | None:
    """The timestamp a replay's start is looked up at, if it needs one."""
    if spec.start_from == "timestamp" and spec.start_timestamp is not None:
        return epoch_ms(spec.start_timestamp)
    if spec.start_from == "by_duration" and spec.duration is not None:
        return epoch_ms(now - spec.duration)
    return None


def replay_end_ms(spec: ReplaySpec) -> int | None:
    return epoch_ms(spec.end_timestamp) if spec.end_at == "timestamp" and spec.end_timestamp is not None else None


def resolve_replay(
    spec: ReplaySpec, snapshots: Sequence[PartitionSnapshot], isolation: Isolation
) -> tuple[dict[TP, int], dict[TP, int], list[Event]]:
    """Turn a replay spec into per-partition start and end offsets (pure).

    ``committed`` leaves the start to the normal resolution (committed → checkpoint →
    reset policy). ``timestamp`` / ``by_duration`` use the snapshots' ``ts_start_offset``
    and ``end_at=timestamp`` their ``ts_end_offset`` (no record at/after → the end, with
    an event). ``shift_by`` moves from the committed offset (else the checkpoint) and is
    clamped to ``[log start, end]`` with a ``reset`` event when it overshoots.
    """
    starts: dict[TP, int] = {}
    ends: dict[TP, int] = {}
    events: list[Event] = []
    no_position: list[str] = []
    for snap in snapshots:
        name = f"{snap.topic}[{snap.partition}]"
        end = snap.end_for(isolation)
        how = spec.start_from
        if how == "earliest":
            starts[snap.key] = snap.log_start
        elif how == "latest":
            starts[snap.key] = end
        elif how in ("timestamp", "by_duration"):
            if snap.ts_start_offset is None:
                events.append(
                    _ev(
                        "timestamp_past_end",
                        f"{name}: no record at or after the replay's start time; it starts at the end, offset {end}",
                        snap,
                        which="start",
                        offset=end,
                    )
                )
            starts[snap.key] = end if snap.ts_start_offset is None else snap.ts_start_offset
        elif how == "offset":
            if spec.start_offset is None:
                raise PlanningError("a replay from an offset needs start_offset")
            starts[snap.key] = spec.start_offset
        elif how == "shift_by":
            base = snap.committed if snap.committed is not None else snap.checkpoint
            if base is None or spec.shift_by is None:
                no_position.append(name)
                continue
            target = base + spec.shift_by
            clamped = min(max(target, snap.log_start), end)
            if clamped != target:
                events.append(
                    _ev(
                        "reset",
                        f"{name}: shifting {base} by {spec.shift_by} gives {target}, outside the log "
                        f"[{snap.log_start}, {end}]; starts at {clamped}",
                        snap,
                        target=target,
                        offset=clamped,
                    )
                )
            starts[snap.key] = clamped
        if spec.end_at == "timestamp":
            if snap.ts_end_offset is None:
                events.append(
                    _ev(
                        "timestamp_past_end",
                        f"{name}: no record at or after the replay's end time; it ends at the end of the log, "
                        f"offset {end}",
                        snap,
                        which="end",
                        offset=end,
                    )
                )
            ends[snap.key] = end if snap.ts_end_offset is None else snap.ts_end_offset
        elif spec.end_at == "offset":
            if spec.end_offset is None:
                raise PlanningError("a replay ending at an offset needs end_offset")
            ends[snap.key] = spec.end_offset
    if no_position:
        raise PlanningError(
            f"shift_by moves from the committed offset (or the checkpoint), and there is none for "
            f"{', '.join(no_position)}; replay from earliest, a timestamp or an offset instead"
        )
    return starts, ends, events


def _replay_doc(spec: ReplaySpec) -> dict[str, Any]:
    doc: dict[str, Any] = {"start_from": spec.start_from, "end_at": spec.end_at}
    for key in ("start_timestamp", "end_timestamp"):
        value = getattr(spec, key)
        if value is not None:
            doc[key] = value.isoformat()
    for key in ("start_offset", "shift_by", "end_offset"):
        if getattr(spec, key) is not None:
            doc[key] = getattr(spec, key)
    if spec.duration is not None:
        doc["duration_s"] = spec.duration.total_seconds()
    return doc


@dataclass
class _Refusals:
    """Partitions the policies refuse, collected so one error names all of them."""

    lost: list[str] = field(default_factory=list)
    ahead: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)


def build_plan(request: PlanRequest, observed: Observed) -> Plan:
    """Resolve every partition's range and group the ranges into tasks.

    ``mode="scheduled"`` resolves the start from the committed offset, the checkpoint, the
    output table's history (``snap.table``, found in ``observed.recovered``: a
    ``position_from_table`` event) or the reset policy and reads to the end captured now,
    capped by the policy's limits. ``mode="backfill"`` reads ``[first offset at/after
    window.start, first offset at/after window.end)`` from the snapshots' timestamp lookups;
    where no record is at or after a time, the end of the log is used and a
    ``timestamp_past_end`` event says so. Caps apply to scheduled runs only: a capped
    backfill would silently miss part of its window. ``mode="replay"`` takes a
    :class:`~tidemark.planning.requests.ReplaySpec` (``request.replay``), resolved by
    :func:`resolve_replay`; ``start_overrides`` / ``end_overrides`` are offsets a caller
    resolved itself (reason ``requested``). The data-loss and ahead policies still apply.
    ``time_filter`` (exact windows, see :class:`TimeFilter`) is recorded in the plan's
    window as ``filter`` (with each partition's unwidened end cut) and is part of the plan id.
    Raises :class:`DataLossError`, :class:`OffsetAheadError` or :class:`PlanningError`
    naming every offending partition.
    """
    snapshots = observed.partitions
    keys = [s.key for s in snapshots]
    if len(set(keys)) != len(keys):
        raise PlanningError("a partition appears twice in the planner's input")
    recreated = recreated_topics(snapshots)
    starts, ends, events = _requested_bounds(request, snapshots, recreated)
    if request.mode == "scheduled":
        events.extend(retention_warnings(observed.retention))
    refused = _Refusals()
    resolved: list[tuple[PartitionSnapshot, _Start, int]] = []
    capped: set[TP] = set()
    for snap in sorted(snapshots, key=lambda s: s.key):
        end = snap.end_for(request.isolation)
        start = _resolve_start(snap, request, observed, recreated, starts, end, events, refused)
        if start is None:
            continue
        retention_ms = observed.retention.topic_retention_ms.get(snap.topic)
        start = _check_range(snap, start, request.policy, end, retention_ms, events, refused.lost, refused.ahead)
        stop, was_capped = _resolve_end(snap, start, request, ends, end, events)
        if was_capped:
            capped.add(snap.key)
        resolved.append((snap, start, stop))
    _refuse(request, refused, recreated)
    partitions = [_partition_plan(s, st, stop, request.isolation) for s, st, stop in resolved]
    if request.mode == "scheduled":
        partitions = _apply_caps(partitions, capped, request.policy, events)
    return _assemble(request, snapshots, tuple(partitions), events)


def _requested_bounds(
    request: PlanRequest, snapshots: Sequence[PartitionSnapshot], recreated: Mapping[str, tuple[str, str]]
) -> tuple[dict[TP, int], dict[TP, int], list[Event]]:
    """The starts and ends the request fixes itself (a replay spec, then the caller's overrides)."""
    starts: dict[TP, int] = {}
    ends: dict[TP, int] = {}
    events: list[Event] = []
    if request.replay is not None:
        fresh = [_forget_positions(s) if s.topic in recreated else s for s in snapshots]
        starts, ends, events = resolve_replay(request.replay, fresh, request.isolation)
    events.extend(_recreated_event(t, ids, snapshots, request.policy) for t, ids in sorted(recreated.items()))
    starts.update(request.start_overrides)
    ends.update(request.end_overrides)
    return starts, ends, events


def _resolve_start(
    snap: PartitionSnapshot,
    request: PlanRequest,
    observed: Observed,
    recreated: Mapping[str, tuple[str, str]],
    starts: Mapping[TP, int],
    end: int,
    events: list[Event],
    refused: _Refusals,
) -> _Start | None:
    """One partition's start before the guards: requested, window, committed, checkpoint, table or reset."""
    name = f"{snap.topic}[{snap.partition}]"
    policy, group, recovered = request.policy, request.group, observed.recovered
    if snap.key in starts:
        return _Start(starts[snap.key], "requested")
    if request.mode == "backfill":
        if snap.ts_start_offset is None:
            events.append(
                _ev(
                    "timestamp_past_end",
                    f"{name}: no record at or after the window start; the range starts and ends at {end}",
                    snap,
                    which="start",
                    offset=end,
                )
            )
        return _Start(end if snap.ts_start_offset is None else snap.ts_start_offset, "timestamp")
    if snap.topic in recreated:
        if policy.on_missing == "fail":
            refused.gone.append(name)
            return None
        return _reset_start(_forget_positions(snap), policy, end, events, refused.missing)
    if snap.committed is not None:
        start = _Start(snap.committed, "committed")
        return _against_shown(snap, request, start, end, events, refused, observed.feed_has_runs)
    if snap.checkpoint is not None:
        events.append(
            _ev(
                "group_offsets_expired",
                f"group '{group}' has no committed offset for {name} (expired or deleted); "
                f"resuming from Tidemark's checkpoint {snap.checkpoint}",
                snap,
                checkpoint=snap.checkpoint,
            )
        )
        return _Start(snap.checkpoint, "checkpoint")
    if snap.table is not None and request.mode == "scheduled":
        source = recovered.source if recovered is not None else "the output table's history"
        events.append(
            _ev(
                "position_from_table",
                f"group '{group}' has no committed offset and Tidemark has no checkpoint for {name}; resuming "
                f"at {snap.table}, the end {source} records",
                snap,
                offset=snap.table,
                **(dict(recovered.details) if recovered is not None else {}),
            )
        )
        return _Start(snap.table, "table")
    return _reset_start(snap, policy, end, events, refused.missing)


def _against_shown(
    snap: PartitionSnapshot,
    request: PlanRequest,
    start: _Start,
    end: int,
    events: list[Event],
    refused: _Refusals,
    feed_has_runs: bool,
) -> _Start:
    """A scheduled start from the group's offset, compared with the end of what the feed's output shows.

    The ledger's ``shown`` position is where the output ends; after the run ledger is settled
    the group is there too, unless another writer (a stray consumer, an operator's reset)
    moved it. Moved past it: ``[shown, committed)`` is in no output (a ``group_moved`` event
    naming it; ``on_group_moved: fail`` refuses). Moved behind it: starting there would show
    ``[committed, shown)`` twice, so the run starts at ``shown`` (a ``group_rewound`` event;
    ``fail`` refuses). A different topic id means a recreated topic, handled before this.
    Before the feed's first run (``feed_has_runs`` false: the ledger knows none) the group's
    position is the feed's starting point, as a reset policy's would be; after it, a position
    another client wrote while the output shows nothing of a partition names
    ``[log start, committed)`` the same way.
    """
    if request.mode != "scheduled" or start.offset == snap.shown:
        return start
    if snap.shown is not None and snap.shown_topic_id and snap.topic_id and snap.shown_topic_id != snap.topic_id:
        return start
    name = f"{snap.topic}[{snap.partition}]"
    if snap.shown is None:
        # The output shows nothing of this partition yet: a position another client wrote (an
        # adopted group, a stray consumer before the first run) leaves [log start, committed) out.
        if not feed_has_runs or metadata_run_id(snap.committed_metadata) is not None or start.offset <= snap.log_start:
            return start
        message = (f"{name}: the feed's output shows nothing of this partition yet and group '{request.group}' is "
                   f"at {start.offset}, written by {writer(snap.committed_metadata)}: [{snap.log_start}, "
                   f"{start.offset}) is in no output of this feed")  # fmt: skip
        if request.policy.on_group_moved == "fail":
            refused.moved.append(f"{name} group at {start.offset} (written by another client), output empty")
            return start
        events.append(_ev("group_moved", message, snap, committed=start.offset, shown=None, start=snap.log_start,
                          end=start.offset))  # fmt: skip
        return start
    if start.offset > snap.shown:
        message = (f"{name}: group '{request.group}' is at {start.offset} but the feed's output ends at "
                   f"{snap.shown}: another writer moved the group past [{snap.shown}, {start.offset}), which is in "
                   "no output")  # fmt: skip
        kind: EventKind = "group_moved"
        moved_to = start
    else:
        message = (f"{name}: group '{request.group}' is at {start.offset} but the feed's output already shows up "
                   f"to {snap.shown}: another writer moved the group back; the run starts at {snap.shown} so that "
                   f"[{start.offset}, {snap.shown}) is not shown twice (replay it into another output to read it "
                   "again)")  # fmt: skip
        kind = "group_rewound"
        moved_to = _Start(min(snap.shown, end), "shown")
    if request.policy.on_group_moved == "fail":
        refused.moved.append(f"{name} group at {start.offset}, output at {snap.shown}")
        return start
    events.append(_ev(kind, message, snap, committed=start.offset, shown=snap.shown,
                      start=min(start.offset, snap.shown), end=max(start.offset, snap.shown)))  # fmt: skip
    return moved_to


def _resolve_end(
    snap: PartitionSnapshot, start: _Start, request: PlanRequest, ends: Mapping[TP, int], end: int, events: list[Event]
) -> tuple[int, bool]:
    """One partition's end (never before its start), and whether the per-partition cap cut it."""
    window = request.window
    stop = end
    if snap.key in ends:
        stop = min(ends[snap.key], end)
    elif request.mode == "backfill" and window is not None and window.end is not None:
        if snap.ts_end_offset is None:
            if snap.ts_start_offset is not None:
                events.append(
                    _ev(
                        "timestamp_past_end",
                        f"{snap.topic}[{snap.partition}]: no record at or after the window end; the range ends at "
                        f"the end of the log, offset {end}",
                        snap,
                        which="end",
                        offset=end,
                    )
                )
        else:
            stop = min(snap.ts_end_offset, end)
    limit = request.policy.max_records_per_partition
    if request.mode == "scheduled" and limit is not None and stop > start.offset + limit:
        return start.offset + limit, True
    return max(stop, start.offset), False


def _refuse(request: PlanRequest, refused: _Refusals, recreated: Mapping[str, tuple[str, str]]) -> None:
    """Raise one error naming every partition a policy refused (data loss first, then ahead, gone, missing)."""
    who = f"feed '{request.feed}', group '{request.group}'"
    if refused.lost:
        raise DataLossError(
            f"{who}: unread records were deleted by retention and on_data_loss is "
            f"fail: {'; '.join(refused.lost)}. Set on_data_loss: skip to continue from the log start, or replay "
            "from another source"
        )
    if refused.ahead:
        raise OffsetAheadError(
            f"{who}: start offsets lie past the end of the log and on_ahead is fail: "
            f"{'; '.join(refused.ahead)}. Set on_ahead: earliest or latest, or reset the group's offsets"
        )
    if refused.gone:
        old = "; ".join(f"'{t}' was {o}, now {n}" for t, (o, n) in sorted(recreated.items()))
        raise PlanningError(
            f"{who}: the topic was deleted and recreated under the same name (topic "
            f"id {old}), so the committed offsets and checkpoints of {', '.join(refused.gone)} belong to the old "
            "topic, and on_missing is fail. Reset the group's offsets on the new topic (tidemark replay ... "
            "--commit, or kafka-consumer-groups --reset-offsets), or choose another on_missing"
        )
    if refused.moved:
        raise PlanningError(
            f"{who}: another writer moved the group away from where the feed's output ends "
            f"({'; '.join(refused.moved)}) and on_group_moved is fail. Decide, then either reset the group's offsets "
            "to the output's end (kafka-consumer-groups --reset-offsets), or set on_group_moved: follow for one run"
        )
    if refused.missing:
        raise PlanningError(
            f"{who} has no committed offset and no checkpoint for "
            f"{', '.join(refused.missing)} and on_missing is fail; commit a start position or choose another "
            "on_missing"
        )


def _partition_plan(s: PartitionSnapshot, start: _Start, stop: int, isolation: Isolation) -> PartitionPlan:
    return PartitionPlan(
        topic=s.topic,
        partition=s.partition,
        leader=s.leader,
        committed=s.committed,
        checkpoint=s.checkpoint,
        log_start=s.log_start,
        high_watermark=s.high_watermark,
        end_available=s.end_for(isolation),
        start=start.offset,
        end=stop,
        reason=start.reason,
        topic_id=s.topic_id,
    )


def _apply_caps(
    partitions: list[PartitionPlan], capped: set[TP], policy: Policy, events: list[Event]
) -> list[PartitionPlan]:
    """Report the per-partition caps already applied, then share the per-run cap over the partitions."""
    for p in partitions:
        if p.key in capped and policy.max_records_per_partition is not None:
            events.append(_capped(p, "max_records_per_partition", policy.max_records_per_partition))
    if policy.max_records_per_run is None or sum(p.records for p in partitions) <= policy.max_records_per_run:
        return partitions
    grant = _cap_run({p.key: p.records for p in partitions}, policy.max_records_per_run)
    out = []
    for p in partitions:
        if grant[p.key] < p.records:
            p = replace(p, end=p.start + grant[p.key])
            events.append(_capped(p, "max_records_per_run", policy.max_records_per_run))
        out.append(p)
    return out


def _assemble(
    request: PlanRequest,
    snapshots: Sequence[PartitionSnapshot],
    partitions: tuple[PartitionPlan, ...],
    events: list[Event],
) -> Plan:
    """The plan: its window document (with the exact filter's cuts), id, commit flag and tasks."""
    replay = request.replay
    window_doc = request.window.to_dict() if request.window is not None else _replay_doc(replay) if replay else {}
    filter_doc = None
    if request.time_filter is not None:
        cuts = {f"{s.topic}:{s.partition}": s.ts_cut_end_offset for s in snapshots}
        filter_doc = {**request.time_filter.to_dict(), "cut_ends": cuts}
        window_doc["filter"] = filter_doc
    commit = request.commit
    if commit is None and replay is not None:
        commit = replay.commit
    if commit is None:
        commit = request.mode == "scheduled"
    return Plan(
        plan_id=compute_plan_id(request.feed, request.group, request.mode, request.isolation, partitions, filter_doc),
        feed=request.feed,
        group=request.group,
        mode=request.mode,
        commit=commit,
        isolation=request.isolation,
        created_at=request.created_at.astimezone(UTC).isoformat(),
        partitions=partitions,
        tasks=chunk_ranges(partitions, request.policy.records_per_task),
        events=tuple(events),
        window=window_doc,
        topics=tuple(sorted({s.topic for s in snapshots})),
    )


def _capped(p: PartitionPlan, limit: CapLimit, value: int) -> Event:
    end = p.end
    return Event(
        kind="capped",
        message=(
            f"{p.topic}[{p.partition}]: {limit}={value} stops this run at {end}; "
            f"{p.end_available - end} records are left for the next runs"
        ),
        topic=p.topic,
        partition=p.partition,
        details={"limit": limit, "value": value, "end": end, "end_available": p.end_available},
    )
