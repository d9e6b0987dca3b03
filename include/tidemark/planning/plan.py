"""The plan document: exactly which offsets one run reads, and why.

A plan is plain frozen data, serialised as versioned JSON. Its ``plan_id`` is a content
hash of what decides the output (feed, group, mode, isolation, every range and the id of
each range's topic), so the
same ranges always get the same id and publishing them twice can be recognised and made
a no-op. Creation time, the offsets the plan started from, events and the task grouping
are recorded but do not change the id. A plan id therefore names *what is read and
published*, not *when*: committing belongs to a run (see :mod:`tidemark.runs.commit`), and
each run keeps its own copy of its plan document.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tidemark._types import Isolation
from tidemark.errors import ConfigError
from tidemark.storage import Location

PLAN_VERSION = 1
PLAN_FILE = "plan.json"  # a run's own copy of its plan, in its run dir, written before any read

RequestMode = Literal["scheduled", "backfill", "replay"]  # what a trigger asks for (planning.requests)
# A re-drive's plan (:func:`redrive_plan`) claims dead letters, not ranges; it never commits the group.
Mode = Literal[RequestMode, "redrive"]
REDRIVE_PREFIX = "redrive-"  # a re-drive plan's id: redrive-<hash of its feed and letters>; no range plan's looks so
Letter = tuple[str, str, int, int]  # a dead letter a re-drive plan claims: (plan id, topic, partition, offset)
# Why a partition starts where it does.
StartReason = Literal[
    "committed",  # the group's committed offset
    "checkpoint",  # group offsets expired; resumed from Tidemark's checkpoint
    "earliest",  # no offsets: reset policy earliest (or a new partition)
    "latest",  # no offsets: reset policy latest
    "timestamp",  # no offsets: reset policy timestamp, or a backfill window's start
    "log_start",  # start was below the log start; data-loss policy skip
    "ahead_reset",  # start was past the end; ahead policy earliest/latest
    "requested",  # a replay named the start explicitly (offset, shift, ...)
    "table",  # no group offsets and no checkpoint: resumed from the output table's history
    "shown",  # the group was moved behind the output's end by another writer: resumed at the output's end
]
EventKind = Literal[
    "group_offsets_expired",  # Kafka deleted the group's offsets: resumed from the checkpoint, offsets committed back
    "reset",  # no offsets and no checkpoint: the feed's on_missing applied
    "new_partition",  # a partition added to a topic later: starts by on_new_partition
    "data_loss",  # retention deleted unread records; with on_data_loss: skip, the lost range is named
    "offset_ahead",  # the start lies past the log end (a truncated topic): on_ahead applied
    "timestamp_past_end",  # no record is stamped that late: the range ends at the end of the log
    "capped",  # max_records_per_partition or max_records_per_run cut the range: the next run reads the rest
    "retention_warning",  # the schedule is longer than the group offsets' or a topic's retention
    "timestamp_skew",  # an exact window's skew reached half its max_skew bound
    "position_from_table",  # no offsets and no checkpoint: an Iceberg feed resumed where its table's ledger ends
    "topic_recreated",  # the topic's id changed (deleted and recreated): its partitions start by on_missing
    "topic_added",  # a pattern feed: a topic newly matches; its partitions start by the reset policy (on_missing)
    "topic_removed",  # a pattern feed: a topic its last run read no longer exists or no longer matches
    "offsets_skipped",  # a committing backfill/replay started past the committed offset (allow_gap)
    "records_outside_window",  # a committing exact window's commit passed over records stamped outside it
    "publication_retracted",  # only in reports of versions that took refused runs' publications back
    "group_moved",  # another writer moved the group past the output's end: that range is in no output
    "group_rewound",  # another writer moved the group behind the output's end: the run starts at the output's end
    "commit_refused",  # a run's commit was refused: its staged publication was discarded, never shown
    "redrive",  # a re-drive's report: the dead letters it re-checked and what it published
    "not_shown",  # a committed run whose ranges the output already shows in part: kept out so nothing shows twice
    "permission_missing",  # an optional read (topic or broker configs) the principal may not do: skipped
    "gap",  # the job: offsets of a range that hold no record (markers, aborted or compacted away): counted
    "schema_changed",  # the job: a partition's records were written with more than one registry schema id
    "table_schema_evolved",  # the job: the Iceberg table's schema changed in the snapshot adding the plan
    "output_schema_evolved",  # the job: a Parquet output's schema gained or widened columns with the plan
    "schema_change_quarantined",  # the job: records of a writer the reader cannot resolve set aside (schema_change)
    "changes_applied",  # a keyed table's commit: changes written, deleted, superseded and skipped as stale
    "promotion_given_up",  # `tidemark abandon` of a run the output already shows: what its promotion left undone
    "table_ledger_mismatch",  # recovery from a table: its ledger names plans its current ancestry lacks (a rollback),
    # a partition's end cannot be placed, or a snapshot of the ancestry added records no plan wrote
]
# Where a run report found an event: the plan, the Spark job's result, or the commit step.
EventSource = Literal["plan", "job", "commit"]


@dataclass(frozen=True)
class Event:
    """Something a run met that a person should know of: in the plan, the job's result and the run report."""

    kind: EventKind
    message: str
    topic: str | None = None
    partition: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As ``plan.json`` holds it."""
        return asdict(self)

    def reported(self, source: EventSource) -> dict[str, Any]:
        """As a run report lists it: the event and where it was found."""
        return {"source": source, **self.to_dict()}


@dataclass(frozen=True)
class PartitionPlan:
    """One partition's range ``[start, end)`` with the offsets it was derived from."""

    topic: str
    partition: int
    leader: int
    committed: int | None
    checkpoint: int | None
    log_start: int
    high_watermark: int
    end_available: int  # high watermark, or last stable offset under read_committed
    start: int
    end: int
    reason: StartReason
    # The id of the topic the range belongs to (None: unknown, e.g. a plan made before ids were recorded).
    topic_id: str | None = None

    @property
    def records(self) -> int:
        return self.end - self.start

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class Chunk:
    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class Task:
    """One Spark input partition: chunks whose partitions share a leader broker."""

    index: int
    leader: int
    chunks: tuple[Chunk, ...]

    @property
    def records(self) -> int:
        return sum(c.end - c.start for c in self.chunks)


@dataclass(frozen=True)
class Plan:
    plan_id: str
    feed: str
    group: str
    mode: Mode
    commit: bool
    isolation: Isolation
    created_at: str
    partitions: tuple[PartitionPlan, ...]
    tasks: tuple[Task, ...]
    events: tuple[Event, ...] = ()
    window: Mapping[str, Any] = field(default_factory=dict)
    version: int = PLAN_VERSION
    output: str | None = None  # where this plan publishes (None: the feed's output); not part of the id
    # The reader schema of each registry-format part ("key", "value") the feed does not pin, as the registry's
    # latest when planned ({"subject", "version", "id"}): every attempt of the plan decodes with it. Not in the id.
    readers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The topics the plan reads (every partition of each is in ``partitions``): a pattern feed's matches when
    # planned, so its retries and its commit never depend on a later listing. Not in the id.
    topics: tuple[str, ...] = ()
    # What a re-drive's plan claims in place of ranges: the dead letters it publishes (its id is their hash).
    letters: tuple[Letter, ...] = ()

    @property
    def total_records(self) -> int:
        """The records the plan publishes: its ranges' offsets, or a re-drive's dead letters."""
        return sum(p.records for p in self.partitions) + len(self.letters)

    def ranges(self) -> Iterator[tuple[str, int, int, int]]:
        for p in self.partitions:
            yield (p.topic, p.partition, p.start, p.end)

    def ends(self) -> dict[tuple[str, int], int]:
        return {p.key: p.end for p in self.partitions}

    @property
    def time_filter(self) -> Mapping[str, Any] | None:
        """The exact time window the job keeps records of, if any (``window["filter"]``)."""
        found = self.window.get("filter")
        return found if isinstance(found, Mapping) and found.get("mode") == "exact" else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Plan:
        if doc.get("version") != PLAN_VERSION:
            raise ConfigError(f"plan version {doc.get('version')!r} is not supported (expected {PLAN_VERSION})")
        plan = cls(
            plan_id=doc["plan_id"],
            feed=doc["feed"],
            group=doc["group"],
            mode=doc["mode"],
            commit=bool(doc["commit"]),
            isolation=doc["isolation"],
            created_at=doc["created_at"],
            partitions=tuple(PartitionPlan(**p) for p in doc["partitions"]),
            tasks=tuple(
                Task(index=t["index"], leader=t["leader"], chunks=tuple(Chunk(**c) for c in t["chunks"]))
                for t in doc["tasks"]
            ),
            events=tuple(Event(**e) for e in doc.get("events", ())),
            window=doc.get("window", {}),
            version=doc["version"],
            output=doc.get("output"),
            readers=doc.get("readers", {}),
            topics=tuple(doc.get("topics", ())),
            letters=tuple((str(p), str(t), int(n), int(o)) for p, t, n, o in doc.get("letters", ())),
        )
        expected = (
            redrive_plan_id(plan.feed, plan.letters) if plan.mode == "redrive"
            else compute_plan_id(plan.feed, plan.group, plan.mode, plan.isolation, plan.partitions, plan.time_filter)
        )  # fmt: skip
        if plan.plan_id != expected:
            raise ConfigError(f"plan {plan.plan_id} does not match its content (hash {expected}); it was edited")
        return plan

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))


def compute_plan_id(
    feed: str,
    group: str,
    mode: Mode,
    isolation: Isolation,
    partitions: tuple[PartitionPlan, ...],
    time_filter: Mapping[str, Any] | None = None,
) -> str:
    """The content hash naming what is read and published.

    An exact time window changes what is published from the same ranges, so its bounds
    are part of the content; plans without one hash exactly as before. So are the topic
    ids: the same offsets of a topic deleted and recreated under the same name are other
    records, and its first run must not match a plan the old topic published.
    """
    content: dict[str, Any] = {
        "version": PLAN_VERSION,
        "feed": feed,
        "group": group,
        "mode": mode,
        "isolation": isolation,
        "ranges": sorted((p.topic, p.partition, p.start, p.end) for p in partitions),
    }
    if time_filter is not None:
        content["time_filter"] = [time_filter.get("start_ms"), time_filter.get("end_ms")]
    topic_ids = sorted({(p.topic, p.topic_id) for p in partitions if p.topic_id})
    if topic_ids:
        content["topic_ids"] = topic_ids
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return digest[:20]


def redrive_plan_id(feed: str, letters: Iterable[Letter]) -> str:
    """A re-drive plan's id: a hash of the feed and its sorted dead letters (the same letters, the same plan)."""
    text = json.dumps([feed, sorted(letters)], separators=(",", ":"))
    return REDRIVE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


def redrive_plan(feed: str, group: str, isolation: Isolation, letters: Iterable[Letter], created_at: str) -> Plan:
    """The plan of a re-drive of ``letters``: it claims them (no range), publishes into the feed's output and
    commits no group; the commit protocol settles it as any plan (:mod:`tidemark.runs.protocol`)."""
    claimed = tuple(sorted(letters))
    return Plan(plan_id=redrive_plan_id(feed, claimed), feed=feed, group=group, mode="redrive", commit=False,
                isolation=isolation, created_at=created_at, partitions=(), tasks=(), letters=claimed)  # fmt: skip


def read_plan(path: Path | Location | str) -> Plan:
    """The plan saved at ``path`` (a local path or an object-store location), its content hash checked."""
    return Plan.from_json(Location.of(path).read_text())


def write_plan(plan: Plan, path: Path | Location) -> Path | Location:
    """Write ``plan`` to ``path`` (a local path or an object-store location) whole: never half a plan."""
    Location.of(path).write_text(plan.to_json())
    return path


def plan_lines(plan: Plan, *, dry_run: bool = False) -> list[str]:
    """What a run's log says of its plan: the counts and each event; a dry run's adds the ranges as a table."""
    lines = [
        f"planned {plan.plan_id}: {plan.total_records} records in {sum(1 for p in plan.partitions if p.records)} of "
        f"{len(plan.partitions)} partitions, {len(plan.tasks)} Spark tasks, {len(plan.events)} events",
        *(f"event {event.kind}: {event.message}" for event in plan.events),
    ]
    if dry_run:
        lines.append(f"dry run: nothing is read, published or committed. The plan ({plan.total_records} records):")
        lines += plan_table(plan)
    return lines


def plan_table(plan: Plan) -> list[str]:
    """The plan's ranges as aligned text lines (a dry run's task log)."""
    rows = [("partition", "committed", "start", "end", "records", "reason")]
    rows += [(f"{p.topic}[{p.partition}]", "-" if p.committed is None else str(p.committed), str(p.start),
              str(p.end), str(p.records), p.reason) for p in plan.partitions]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


class PlanStore:
    """Plans previewed by ``tidemark plan``, saved as ``<state>/plans/<feed>/<plan_id>.json``.

    A run does not use this store: it keeps its own copy of its plan in its run dir,
    because the same plan id can be planned again later from other committed offsets,
    with other events (see "Plans, runs and commits" in ``docs/ARCHITECTURE.md``).
    """

    def __init__(self, root: Path | Location) -> None:
        self.root = Location.of(root)

    def path(self, feed: str, plan_id: str) -> Location:
        return self.root / "plans" / feed / f"{plan_id}.json"

    def save(self, plan: Plan) -> Location:
        path = self.path(plan.feed, plan.plan_id)
        write_plan(plan, path)
        return path

    def load(self, feed: str, plan_id: str) -> Plan:
        path = self.path(feed, plan_id)
        if not path.exists():
            raise ConfigError(f"no saved plan {plan_id} for feed '{feed}' under {path.parent}")
        return Plan.from_json(path.read_text())


@dataclass(frozen=True)
class RecoveredPosition:
    """A group's position as an output's history records it (the newest publication of the group)."""

    ends: Mapping[tuple[str, int], int]
    source: str  # for the event: where it was found (table, snapshot, plan)
    details: Mapping[str, Any] = field(default_factory=dict)
    topic_ids: Mapping[str, str] = field(default_factory=dict)  # topic -> the id its ends were recorded on
    events: tuple[Event, ...] = ()  # what the output found against its own records (the plan carries them)
