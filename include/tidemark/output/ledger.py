"""The table ledger: what an Iceberg table holds of a feed, kept in a table property, not in snapshot history.

Tidemark's guarantees on a table (a plan is committed once; the group's position can be
recovered from the table) used to read the snapshot summaries of the main branch. Every
Iceberg guide tells users to expire snapshots, and a compaction (Tidemark's, Spark's
``rewrite_data_files``, pyiceberg's overwrite) adds snapshots with no Tidemark summary, so
history is no place for them. The ledger is a JSON document in the table property
``tidemark.ledger.<feed>``, set in the **same** catalog transaction as the plan's
``add_files`` (:func:`tidemark.output.iceberg.commit_files`), so it changes exactly when the
data does and, like every table property, survives snapshot expiry, compaction, manifest
rewrites and orphan-file removal by any engine.

What it keeps, bounded whatever the number of plans (35,000 a year for a feed every 15
minutes):

1. per topic and topic id, per partition, the **end** of what the table holds (the
   maximum end of the plans committed on that topic id; a recreated topic's new id starts
   a new entry beside the old id's, which stays: a few entries per recreation);
2. the **recent** plans (at most :data:`RECENT_PLANS`, newest last): plan id, run id, record
   and quarantine counts, snapshot id, commit time. A retry, a zombie's promotion or a
   crashed commit task asks about its plan within hours; 200 plans are two days of a feed
   every 15 minutes and the snapshots of the plans before them usually still exist.

The run-once check needs no more: table positions only move forward (the commit protocol
shows a plan only at or past the output's end, ``runs.protocol.overlapping``), so a plan
none of whose ranges start below the ledger's ends is certainly not in the table, and a
plan with a range starting below them either is in it (found among the recent plans, or in
a snapshot still kept) or must never be committed (:func:`overlap`: it would put offsets in
the table twice, or behind its end). Sizes: about 130 bytes per recent plan plus 10 per
partition; 200 plans and 100 partitions are 27 KB, rewritten into each commit's metadata
file. A Hive metastore whose parameter values are capped at 4,000 characters cannot keep it.

A property outlives a snapshot rollback too, so the ledger is read only through
:func:`reconcile`, against the current snapshot's ancestry: a plan rolled back leaves it
with the ends it moved, and what cannot be placed is said so, never assumed held.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

LEDGER_PREFIX = "tidemark.ledger."  # + the feed's name: one property per feed writing to the table
LEDGER_VERSION = 1
RECENT_PLANS = 200


def ledger_key(feed: str) -> str:
    return f"{LEDGER_PREFIX}{feed}"


@dataclass(frozen=True)
class LedgerPlan:
    """One plan the ledger remembers by id."""

    plan_id: str
    run_id: str | None
    records: int
    quarantined: int
    snapshot_id: int | None
    committed_ms: int

    def to_list(self) -> list[Any]:
        return [self.plan_id, self.run_id, self.records, self.quarantined, self.snapshot_id, self.committed_ms]

    @classmethod
    def of(cls, row: Sequence[Any]) -> LedgerPlan:
        plan_id, run_id, records, quarantined, snapshot_id, committed_ms = row
        return cls(str(plan_id), run_id, int(records), int(quarantined), snapshot_id, int(committed_ms))


@dataclass(frozen=True)
class Ledger:
    """What a table holds of one feed (see the module docstring)."""

    feed: str
    group: str
    # topic -> the id of its newest committed plan ("" when the plan knew none)
    current: Mapping[str, str] = field(default_factory=dict)
    # topic -> topic id -> partition -> end of what the table holds
    ends: Mapping[str, Mapping[str, Mapping[int, int]]] = field(default_factory=dict)
    recent: tuple[LedgerPlan, ...] = ()
    plans: int = 0  # plans ever recorded (for reports)
    source: str = "ledger"  # "ledger", or "history" when rebuilt from an old table's snapshot summaries

    def find(self, plan_id: str) -> LedgerPlan | None:
        return next((p for p in reversed(self.recent) if p.plan_id == plan_id), None)

    def end(self, topic: str, partition: int, topic_id: str | None) -> int | None:
        """Where the table's records of ``topic[partition]`` on ``topic_id`` end (``None``: it holds none)."""
        ids = self.ends.get(topic, {})
        chosen = topic_id or self.current.get(topic, "")
        if chosen not in ids and not topic_id and len(ids) == 1:
            chosen = next(iter(ids))  # a plan without ids on a topic whose ends have one: the same topic
        return ids.get(chosen, {}).get(partition)

    def positions(self) -> dict[tuple[str, int], int]:
        """The ends on each topic's current id: where the group's position is when the table is the last word."""
        return {(t, p): end for t, tid in self.current.items() for p, end in self.ends.get(t, {}).get(tid, {}).items()}

    def with_plan(self, ranges: Iterable[Mapping[str, Any]], plan: LedgerPlan, group: str) -> Ledger:
        """The ledger after committing ``plan`` with ``ranges`` (the snapshot summary's ``tidemark.ranges``)."""
        current = dict(self.current)
        ends = {t: {tid: dict(parts) for tid, parts in ids.items()} for t, ids in self.ends.items()}
        for r in ranges:
            topic, partition, end = str(r["topic"]), int(r["partition"]), int(r["end"])
            tid = str(r.get("topic_id") or current.get(topic, ""))
            current[topic] = tid
            parts = ends.setdefault(topic, {}).setdefault(tid, {})
            parts[partition] = max(end, parts.get(partition, end))
        recent = (*(p for p in self.recent if p.plan_id != plan.plan_id), plan)[-RECENT_PLANS:]
        return replace(self, group=group, current=current, ends=ends, recent=recent, plans=self.plans + 1,
                       source="ledger")  # fmt: skip

    def to_json(self) -> str:
        doc = {
            "v": LEDGER_VERSION,
            "feed": self.feed,
            "group": self.group,
            "plans": self.plans,
            "current": dict(self.current),
            "ends": {
                t: {tid: {str(p): e for p, e in sorted(parts.items())} for tid, parts in ids.items()}
                for t, ids in self.ends.items()
            },
            "recent": [p.to_list() for p in self.recent],
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        doc = json.loads(text)
        if doc.get("v") != LEDGER_VERSION:
            raise ValueError(f"table ledger version {doc.get('v')!r}; this Tidemark reads version {LEDGER_VERSION}")
        return cls(
            feed=str(doc["feed"]),
            group=str(doc["group"]),
            current={str(t): str(tid) for t, tid in doc.get("current", {}).items()},
            ends={
                str(t): {str(tid): {int(p): int(e) for p, e in parts.items()} for tid, parts in ids.items()}
                for t, ids in doc.get("ends", {}).items()
            },
            recent=tuple(LedgerPlan.of(row) for row in doc.get("recent", [])),
            plans=int(doc.get("plans", 0)),
        )


def overlap(ledger: Ledger, ranges: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ranges with records that start below the table's end of their partition, as text (empty: none).

    Committing such a plan would put offsets into the table twice (or behind its end, where
    the commit protocol never shows anything): the table refuses it whatever the checkpoint
    store remembers.
    """
    found = []
    for r in ranges:
        start, end = int(r["start"]), int(r["end"])
        held = ledger.end(str(r["topic"]), int(r["partition"]), r.get("topic_id"))
        if end > start and held is not None and start < held:
            found.append(f"{r['topic']}[{r['partition']}] [{start}, {end}) with the table holding up to {held}")
    return found


@dataclass(frozen=True)
class SnapshotFacts:
    """What the ledger's check needs of one snapshot: when, whose plan (of the ledger's feed), and what it added."""

    snapshot_id: int
    timestamp_ms: int
    plan_id: str | None = None  # the ledger's feed's plan it committed (``tidemark.plan-id``, that feed's)
    ranges: tuple[Mapping[str, Any], ...] = ()  # that plan's ranges (``tidemark.ranges``)
    tidemark: bool = False  # written by Tidemark (any ``tidemark.*`` summary property: a plan, a maintenance pass)
    added_records: int = 0


@dataclass(frozen=True)
class Unplaced:
    """A partition whose end the ledger records but the table's current ancestry cannot confirm or place."""

    topic: str
    topic_id: str
    partition: int
    recorded: int  # the ledger's end, which counted a rolled-back plan of unknown ranges


@dataclass(frozen=True)
class Reconciled:
    """The ledger as the table's current snapshot's ancestry bears it out, and what disagreed (:func:`reconcile`)."""

    ledger: Ledger
    rolled_back: tuple[LedgerPlan, ...] = ()  # ledger plans whose snapshot is not in the current ancestry
    rolled_back_ranges: Mapping[str, tuple[Mapping[str, Any], ...] | None] = field(default_factory=dict)  # None: gone
    unplaced: tuple[Unplaced, ...] = ()
    foreign: tuple[SnapshotFacts, ...] = ()  # ancestry snapshots that added records, written by no Tidemark plan

    @property
    def agrees(self) -> bool:
        return not self.rolled_back


def reconcile(ledger: Ledger, ancestry: Sequence[SnapshotFacts], detached: Mapping[int, SnapshotFacts]) -> Reconciled:
    """``ledger`` with only what the current snapshot's ``ancestry`` (newest first, the snapshots still kept) holds.

    A recent plan whose snapshot is not in the ancestry was rolled back when its snapshot is
    still in the table's metadata (``detached``: kept snapshots off the ancestry), or when it
    was committed at or after the oldest kept ancestor (ancestors are consecutive: a plan
    committed since then on the current line would be one); one committed before that has
    merely had its snapshot expired and stands. Without a rolled-back plan the ledger is
    returned as it is. With one, each partition's end becomes what the placed plans hold: the
    ancestry's own plans' maximum end where it has one (exact: every placed plan since the
    oldest ancestor is in it, and older ones end below), else, when every rolled-back plan's
    ranges are known, the ledger's end for a partition none of them touched and the lowest
    start of theirs for one they did (plans are shown in order, so the table held up to
    there). A partition left is **unplaced**: it keeps the ledger's end (nothing below it
    can be committed again) and no recovery may start from it. Snapshots of the ancestry
    that added records and carry no ``tidemark.*`` property are named too; they move no end.
    """
    ids = {s.snapshot_id for s in ancestry}
    oldest = min((s.timestamp_ms for s in ancestry), default=None)
    foreign = tuple(s for s in ancestry if s.added_records > 0 and not s.tidemark)
    rolled = tuple(
        p for p in ledger.recent
        if p.snapshot_id is not None and p.snapshot_id not in ids
        and (p.snapshot_id in detached or oldest is None or p.committed_ms >= oldest)
    )  # fmt: skip
    if not rolled:
        return Reconciled(ledger, foreign=foreign)

    def tid_of(r: Mapping[str, Any]) -> str:
        return str(r.get("topic_id") or ledger.current.get(str(r["topic"]), ""))

    held: dict[tuple[str, str, int], int] = {}
    for s in ancestry:
        for r in s.ranges if s.plan_id is not None else ():
            k = (str(r["topic"]), tid_of(r), int(r["partition"]))
            held[k] = max(int(r["end"]), held.get(k, int(r["end"])))
    known: dict[str, tuple[Mapping[str, Any], ...] | None] = {}
    touched: dict[tuple[str, str, int], int] = {}
    for p in rolled:
        facts = detached.get(p.snapshot_id) if p.snapshot_id is not None else None
        known[p.plan_id] = None if facts is None else facts.ranges
        for r in () if facts is None else facts.ranges:
            if int(r["end"]) > int(r["start"]):
                k = (str(r["topic"]), tid_of(r), int(r["partition"]))
                touched[k] = min(int(r["start"]), touched.get(k, int(r["start"])))
    all_known = all(v is not None for v in known.values())
    ends: dict[str, dict[str, dict[int, int]]] = {}
    unplaced = []
    for topic, by_id in ledger.ends.items():
        for tid, parts in by_id.items():
            for part, end in parts.items():
                k = (topic, tid, part)
                if all_known and k not in touched:
                    now = end
                elif k in held:
                    now = held[k]
                elif all_known:
                    now = touched[k]
                else:
                    unplaced.append(Unplaced(topic, tid, part, end))
                    now = end
                ends.setdefault(topic, {}).setdefault(tid, {})[part] = now
    gone = {p.plan_id for p in rolled}
    fixed = replace(ledger, ends=ends, recent=tuple(p for p in ledger.recent if p.plan_id not in gone))
    return Reconciled(fixed, rolled, known, tuple(unplaced), foreign)
