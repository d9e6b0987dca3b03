"""The commit protocol, driven through every interleaving of its actors with a crash at every step.

The model drives the real protocol code (:func:`tidemark.runs.protocol.settle`,
:func:`~tidemark.runs.protocol.settle_open_runs`, :func:`tidemark.runs.commit.commit_plan`,
the guard's :func:`~tidemark.job.guard.moved_since_planning` and the pure planner
:func:`tidemark.planning.resolve.build_plan`) with an in-memory consumer group, checkpoint
store and output, as pure logic may. Its actors, on one feed with two partitions:

- two scheduled runs ``A`` and ``B`` and a committing run ``R`` over other ranges (capped, as
  a committing replay of the next records is), each in two steps: *plan* (settle the
  ledger's open runs, produce two records per partition, plan, record ``planned``, and
  stage the publication, as the job does) and *commit* (``settle`` under the lock);
- a foreign writer ``F`` (a stray consumer or an operator) that commits the group
  two records further than it is, in one step.

Every interleaving of those seven steps is run once without a crash, which records every
point each actor passes where a process can die (before and after each write to the group,
the store and the output); then the history is run again for each point with the actor
crashing there (its later steps are skipped: the process is gone). After each step the
output is checked (no offset shown twice; every shown plan's commit landed or the group is
past it); after the history two more scheduled runs finish whatever was left, and then the
feed must have made progress (the group and the output at the end of the log), and every
offset below the group's position must be in the output or named by an event.

Steps also run *inside* one another: each step is a greenlet, and every call into the group,
the store or the output is a place where the scheduler may switch to another actor. The
group's commit lock is real there (:meth:`MemStore.commit_lock`): an actor that asks for it
while another holds it waits, and the scheduler runs the holder until it lets go, so no
interleaving inside a locked section happens, as with the real lock; wherever the code does
not hold the lock, anything may come in between. The commit step takes the lock around
``settle`` as ``tidemark.runs.finish.finish_run`` does; the plan step's
``settle_open_runs`` takes it itself. One more check then holds: a Tidemark commit's
compare-and-set is atomic (no other Tidemark actor wrote the group between its read of the
group and its write), which is what the lock is for.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from greenlet import greenlet

from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import OPEN_STATES, Checkpoint, LedgerRun, RunState, Shown
from tidemark.config.models import Feed
from tidemark.errors import CommitError, GroupInUseError, OffsetsMovedError, TidemarkError
from tidemark.kafka.adapter import Committed, GroupInfo, PartitionInfo
from tidemark.output.base import Manifest
from tidemark.output.deadletters import RedriveRecord, is_redrive, redriven_in
from tidemark.planning.metadata import metadata_run_id
from tidemark.planning.plan import PLAN_FILE, Event, Letter, Plan, redrive_plan, write_plan
from tidemark.planning.resolve import Observed, PartitionSnapshot, PlanRequest, Policy, build_plan
from tidemark.runs.protocol import Settled, abandon, settle, settle_before_planning, settle_open_runs

FEED, GROUP, TOPIC = "model", "model-group", "t"
TPS: tuple[TP, ...] = ((TOPIC, 0), (TOPIC, 1))
TOPIC_ID = "topic-id-1"
# The dead letters of a plan shown before every history (its records are no offsets of the model's log).
LETTERS: tuple[Letter, ...] = tuple(("p0", "dlq-topic", 0, o) for o in range(3))


class Crash(BaseException):
    """The acting process dies here (a BaseException: nothing tidies up after it)."""


@dataclass
class World:
    """The group, the store and the output one history shares, and the crash it is told to make."""

    end: dict[TP, int] = field(default_factory=lambda: dict.fromkeys(TPS, 0))  # the log's end per partition
    group: dict[TP, Committed] = field(default_factory=dict)
    landed: set[str] = field(default_factory=set)  # runs whose Kafka commit went through
    checkpoints: dict[TP, Checkpoint] = field(default_factory=dict)
    committed_runs: set[str] = field(default_factory=set)
    ledger: dict[str, LedgerRun] = field(default_factory=dict)
    shown_at: dict[TP, Shown] = field(default_factory=dict)
    pending: dict[tuple[str, str], Plan] = field(default_factory=dict)  # (plan id, run id) -> plan
    visible: dict[str, Plan] = field(default_factory=dict)  # plan id -> plan, as readers see the output
    records: dict[str, str] = field(default_factory=dict)  # run id -> a re-drive's record (the run ledger's)
    named: set[tuple[TP, int]] = field(default_factory=set)  # offsets an event names as not published
    actor: str = ""
    crash_at: tuple[str, int] | None = None  # (actor, n): crash at that actor's n-th crash point
    interrupt: bool = False  # the crash is an interrupt (SIGINT: KeyboardInterrupt, every handler runs), not a kill
    passed: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    scheduler: Scheduler | None = None  # set while two steps run inside one another
    lock_holder: str | None = None  # the actor holding the group's commit lock
    group_writes: int = 0  # Tidemark's writes of the group so far
    group_writer: str = ""  # the actor of the last one
    read_at: dict[str, int] = field(default_factory=dict)  # actor -> group_writes when it last read the group
    trace: list[str] = field(default_factory=list)  # actor:operation, in the order they happened

    def touch(self, what: str) -> None:
        """The acting process calls the group, the store or the output: another actor may run first."""
        if self.scheduler is not None:
            self.scheduler.pause()
        self.trace.append(f"{self.actor}:{what}")

    def point(self) -> None:
        """A place where the acting process may die."""
        n = self.passed.get(self.actor, 0)
        self.passed[self.actor] = n + 1
        if self.crash_at == (self.actor, n):
            if self.interrupt:
                raise KeyboardInterrupt(f"{self.actor} interrupted at its point {n}")
            raise Crash(f"{self.actor} crashed at its point {n}")


class MemKafka:
    """The consumer group as the protocol sees it through :class:`~tidemark.kafka.adapter.KafkaAdapter`."""

    def __init__(self, world: World) -> None:
        self.w = world

    def committed(self, group: str, tps: Iterable[TP]) -> dict[TP, Committed]:
        self.w.touch("group.read")
        self.w.read_at[self.w.actor] = self.w.group_writes
        return {tp: self.w.group.get(tp, Committed(None, "")) for tp in tps}

    def partitions(self, topics: Iterable[str]) -> list[PartitionInfo]:
        self.w.touch("partitions")
        return [PartitionInfo(t, p, 1, (1,), TOPIC_ID) for t, p in TPS if t in topics]

    def describe_group(self, group: str) -> GroupInfo:
        self.w.touch("describe_group")
        return GroupInfo(group, "empty", (), 1)

    def topic_and_broker_configs(self, *_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}

    def alter_committed(self, group: str, offsets: Mapping[TP, tuple[int, str]]) -> dict[TP, Any]:
        self.w.touch("group.write")
        if self.w.read_at.get(self.w.actor) != self.w.group_writes:
            self.w.violations.append(
                f"{self.w.actor}'s commit is no compare-and-set: {self.w.group_writer} wrote the group between its "
                "read of the group and its write"
            )
        self.w.group_writes += 1
        self.w.group_writer = self.w.actor
        self.w.point()
        for tp, (offset, metadata) in offsets.items():
            self.w.group[tp] = Committed(offset, metadata)
        self.w.landed.update(filter(None, (metadata_run_id(m) for _, m in offsets.values())))
        self.w.point()
        return dict.fromkeys(offsets)


class MemStore:
    """The checkpoint store's protocol in memory; every write is a crash point after it lands."""

    def __init__(self, world: World) -> None:
        self.w = world

    def get(self, group: str, tps: Iterable[TP]) -> dict[TP, Checkpoint]:
        self.w.touch("checkpoints.read")
        return {tp: self.w.checkpoints[tp] for tp in tps if tp in self.w.checkpoints}

    def put(self, group: str, plan_id: str, offsets: Mapping[TP, int], run_id: str,
            topic_ids: Mapping[str, str] | None = None) -> None:  # fmt: skip
        self.w.touch("checkpoints.write")
        for tp, offset in offsets.items():
            self.w.checkpoints[tp] = Checkpoint(offset, plan_id, "now", (topic_ids or {}).get(tp[0]))
        self.w.committed_runs.add(run_id)
        self.w.point()

    def run_committed(self, group: str, run_id: str) -> bool:
        self.w.touch("checkpoints.run_committed")
        return run_id in self.w.committed_runs

    def commit_lock(self, group: str, timeout_s: float = 120.0) -> AbstractContextManager[None]:
        """The group's lock: an actor asking while another holds it waits (the scheduler runs others meanwhile);
        a crash releases it, as a dead holder's session or file lock is released."""

        @contextmanager
        def held() -> Iterator[None]:
            me = self.w.actor
            self.w.touch("lock.ask")
            while self.w.lock_holder is not None:
                if self.w.lock_holder == me or self.w.scheduler is None:
                    raise AssertionError(
                        f"{me} asks for the commit lock {self.w.lock_holder} holds, with no one to wait for"
                    )
                self.w.scheduler.wait_for_lock()
            self.w.lock_holder = me
            self.w.trace.append(f"{me}:lock.held")
            try:
                yield
            finally:
                self.w.lock_holder = None
                self.w.trace.append(f"{me}:lock.released")

        return held()

    def set_run(self, group: str, run_id: str, *, feed: str, plan_id: str, state: RunState, run_dir: str,
                detail: str | None = None) -> None:  # fmt: skip
        self.w.touch("ledger.write")
        self.w.ledger[run_id] = LedgerRun(group, run_id, feed, plan_id, state, run_dir, "now", detail)
        self.w.point()

    def run(self, group: str, run_id: str) -> LedgerRun | None:
        self.w.touch("ledger.read")
        return self.w.ledger.get(run_id)

    def feed_has_runs(self, feed: str) -> bool:
        return bool(self.w.ledger)

    def open_runs(self, feed: str) -> list[LedgerRun]:
        self.w.touch("ledger.open_runs")
        return sorted((r for r in self.w.ledger.values() if r.state in OPEN_STATES), key=lambda r: r.run_id)

    def feed_runs(self, feed: str, states: tuple[RunState, ...]) -> list[LedgerRun]:
        self.w.touch("ledger.feed_runs")
        return sorted((r for r in self.w.ledger.values() if r.feed == feed and r.state in states),
                      key=lambda r: r.run_id)  # fmt: skip

    def plan_redrive(self, group: str, run_id: str, *, feed: str, plan_id: str, run_dir: str, record: str) -> None:
        """The re-drive's record and its ``planned`` row in one transaction: one crash point after both."""
        self.w.touch("ledger.write")
        self.w.records.setdefault(run_id, record)
        self.w.ledger.setdefault(run_id, LedgerRun(group, run_id, feed, plan_id, "planned", run_dir, "now", None))
        self.w.point()

    def redrive_records(self, group: str, feed: str) -> dict[str, str]:
        self.w.touch("ledger.redrive_records")
        return {k: v for k, v in self.w.records.items() if k in self.w.ledger and self.w.ledger[k].feed == feed}

    def shown(self, feed: str) -> dict[TP, Shown]:
        self.w.touch("shown.read")
        return dict(self.w.shown_at)

    def advance_shown(self, feed: str, run_id: str, ends: Mapping[TP, int], topic_ids: Mapping[str, str]) -> None:
        self.w.touch("shown.write")
        for tp, end in ends.items():
            old = self.w.shown_at.get(tp)
            self.w.shown_at[tp] = Shown(end if old is None else max(old.position, end), topic_ids.get(tp[0]), run_id)
        self.w.point()


def _manifest(plan: Plan) -> Manifest:
    return Manifest(plan.plan_id, plan.feed, plan.group, "mem", "now", plan.total_records, 0, (), ())


class MemOutput:
    """The feed's output: pending publications per run, and what readers see."""

    kind = "memory"

    def __init__(self, world: World) -> None:
        self.w = world

    def describe(self) -> str:
        return "memory"

    def published(self, plan_id: str) -> Manifest | None:
        self.w.touch("output.published")
        plan = self.w.visible.get(plan_id)
        return None if plan is None else _manifest(plan)

    def staged(self, plan_id: str, run_id: str) -> Manifest | None:
        self.w.touch("output.staged")
        plan = self.w.pending.get((plan_id, run_id))
        return None if plan is None else _manifest(plan)

    def promote(self, plan_id: str, run_id: str) -> Manifest:
        self.w.touch("output.promote")
        if plan_id in self.w.visible:
            self.w.pending.pop((plan_id, run_id), None)
            return _manifest(self.w.visible[plan_id])
        plan = self.w.pending.pop((plan_id, run_id))
        past = all(self.w.group.get(p.key, Committed(None, "")).offset or p.end <= 0 for p in plan.partitions)
        if plan.commit and run_id not in self.w.landed and not past:
            self.w.violations.append(f"plan {plan_id} of run {run_id} shown though its commit never landed")
        self.w.visible[plan_id] = plan
        self.w.point()
        return _manifest(plan)

    def discard(self, plan_id: str, run_id: str) -> Manifest | None:
        self.w.touch("output.discard")
        plan = self.w.pending.pop((plan_id, run_id), None)
        if plan is not None:
            self.w.point()
        return None if plan is None else _manifest(plan)


@dataclass
class Run:
    """One run's process state between its two steps."""

    name: str
    cap: int | None  # a re-drive's: how many of the letters it lists it leaves (so two re-drives overlap in part)
    plan: Plan | None = None
    run_id: str = ""
    dead: bool = False
    redrive: bool = False


class Model:
    def __init__(self, world: World, locked: bool = True) -> None:
        self.w = world
        self.locked = locked  # the commit step holds the group's lock around settle
        self.kafka, self.store, self.output = MemKafka(world), MemStore(world), MemOutput(world)
        self.clock = itertools.count()
        self.plans: dict[str, Plan] = {}  # run id -> the run's plan (its run dir's copy)

    def _note(self, events: Iterable[Event]) -> None:
        """Offsets the events name as in no output (the rule allows them below the group's position)."""
        for event in events:
            details, kind = event.details, event.kind
            if kind == "group_moved" and "start" in details:
                tp = (str(event.topic), int(event.partition))  # type: ignore[arg-type]
                self.w.named.update((tp, o) for o in range(int(details["start"]), int(details["end"])))
            if kind in ("not_shown", "commit_refused"):
                for r in details.get("ranges", ()):
                    tp = (r["topic"], r["partition"])
                    self.w.named.update((tp, o) for o in range(r["start"], r["end"]))

    def plan_step(self, run: Run) -> None:
        self.w.actor = run.name
        for settled in settle_open_runs(FEED, self._load, store=self.store, kafka=self.kafka, group=GROUP):  # type: ignore[arg-type]
            self._note(settled.events)
        for tp in TPS:
            self.w.end[tp] += 2
        shown = self.store.shown(FEED)
        snaps = []
        for tp in TPS:
            group, cp, sh = self.w.group.get(tp), self.w.checkpoints.get(tp), shown.get(tp)
            snaps.append(PartitionSnapshot(
                topic=tp[0], partition=tp[1], leader=1, log_start=0, high_watermark=self.w.end[tp],
                last_stable=self.w.end[tp], topic_id=TOPIC_ID,
                committed=None if group is None else group.offset,
                committed_metadata="" if group is None else group.metadata,
                checkpoint=None if cp is None else cp.offset, checkpoint_topic_id=None if cp is None else cp.topic_id,
                shown=None if sh is None else sh.position, shown_topic_id=None if sh is None else sh.topic_id,
            ))  # fmt: skip
        policy = Policy(on_missing="earliest", max_records_per_run=run.cap)
        request = PlanRequest(FEED, GROUP, policy, datetime(2026, 11, 26, tzinfo=UTC), commit=True)
        plan = build_plan(request, Observed(snaps, feed_has_runs=bool(self.w.ledger)))
        self._note(plan.events)
        run.run_id = run_id = f"{next(self.clock):04d}-{run.name}"
        run.plan = self.plans[run_id] = plan
        self.store.set_run(GROUP, run_id, feed=FEED, plan_id=plan.plan_id, state="planned", run_dir=run_id)
        if plan.total_records:
            self.w.point()  # the job dies before staging
            self.w.pending[(plan.plan_id, run_id)] = plan

    def redrive_plan_step(self, run: Run) -> None:
        """A re-drive's plan step, as ``tidemark.runs.redrive.redrive_feed`` takes it: the feed's open re-drives
        settled first (the protocol's ``settle_open_runs``, re-drive rows only), the dead letters listed (less those
        shown re-drives took: ``redriven_in``), its plan (``redrive_plan``) recorded with its record in one
        transaction, then staged. Its commit step is any run's (``settle`` under the lock)."""
        self.w.actor = run.name
        settle_open_runs(FEED, self._load, store=self.store, kafka=None, group=GROUP, which=is_redrive)  # type: ignore[arg-type]
        taken = redriven_in(FEED, GROUP, self.store, self.output).taken  # type: ignore[arg-type]
        listed = [k for k in LETTERS if k not in taken][run.cap or 0 :]
        plan = redrive_plan(FEED, GROUP, "read_committed", listed, "now")
        run.run_id = run_id = f"{next(self.clock):04d}-{run.name}"
        run.plan = self.plans[run_id] = plan
        record = RedriveRecord(plan.plan_id, run_id, FEED, plan.letters)
        self.store.plan_redrive(GROUP, run_id, feed=FEED, plan_id=plan.plan_id, run_dir=run_id,
                                record=record.to_json())  # fmt: skip
        if plan.letters:
            self.w.point()  # the staging dies before it staged
            self.w.pending[(plan.plan_id, run_id)] = plan

    def _load(self, row: LedgerRun) -> tuple[Plan, Any] | None:
        plan = self.plans.get(row.run_id)
        return None if plan is None else (plan, self.output)

    def commit_step(self, run: Run) -> None:
        self.w.actor = run.name
        assert run.plan is not None
        plan, run_id = run.plan, run.run_id
        try:
            with self.store.commit_lock(GROUP) if self.locked else nullcontext():  # as finish_run holds it
                settled = settle(plan, run_id, run_id, publisher=self.output, store=self.store, kafka=self.kafka)  # type: ignore[arg-type]
        except (OffsetsMovedError, GroupInUseError):
            return  # refused: discarded, never shown
        except CommitError:
            if self.w.scheduler is None:
                raise
            return  # F inside the commit, between its write and its read-back: the run fails, left to the next settle
        self._note(settled.events)

    def foreign_step(self, back: bool = False) -> None:
        """A stray consumer commits the group two records further, or an operator resets it two records back
        (nothing of Tidemark's in the metadata).

        Before the feed has any run (only possible inside its first plan step, after the records were produced),
        the group's offsets are where the feed starts, as a group that existed before the feed: the records they
        pass over were never the feed's, and are not expected in its output."""
        for tp in TPS:
            now = self.w.group.get(tp, Committed(None, "")).offset or 0
            moved = max(now - 2, 0) if back else min(now + 2, self.w.end[tp])
            if not self.w.ledger:
                self.w.named.update((tp, o) for o in range(now, moved))
            self.w.group[tp] = Committed(moved, "")

    def check_letters(self) -> None:
        """Every dead letter is listed once or re-driven once: in no shown publication and listed (not taken by a
        re-drive the output shows), or in exactly one shown publication and not listed."""
        taken = redriven_in(FEED, GROUP, self.store, self.output).taken  # type: ignore[arg-type]
        shown = Counter(k for plan in self.w.visible.values() for k in plan.letters)
        for letter in LETTERS:
            listed = letter not in taken
            if shown[letter] > 1 or listed == (shown[letter] == 1):
                self.w.violations.append(f"dead letter {letter}: listed {listed}, shown {shown[letter]} times")

    def check_output(self) -> None:
        self.check_letters()
        seen: dict[tuple[TP, int], str] = {}
        for plan_id, plan in self.w.visible.items():
            for p in plan.partitions:
                for offset in range(p.start, p.end):
                    if (p.key, offset) in seen:
                        self.w.violations.append(f"{p.key}@{offset} shown by {seen[(p.key, offset)]} and {plan_id}")
                    seen[(p.key, offset)] = plan_id


def _steps() -> list[str]:
    return ["A.plan", "A.commit", "B.plan", "B.commit", "R.plan", "R.commit", "F"]


def interleavings() -> Iterator[tuple[str, ...]]:
    """Every order of the seven steps in which each run plans before it commits."""
    steps = _steps()
    for order in itertools.permutations(steps):
        if all(order.index(f"{r}.plan") < order.index(f"{r}.commit") for r in "ABR"):
            yield order


class Scheduler:
    """Two steps of two actors, one inside the other: ``first`` runs until its ``at``-th call into the world
    (:meth:`World.touch`), then ``second`` runs; ``first`` goes on only while ``second`` waits for the commit
    lock (which ``first`` holds), and after ``second`` is done."""

    def __init__(self, world: World, at: int) -> None:
        self.w, self.at = world, at
        self.main = greenlet.getcurrent()
        self.names: dict[greenlet, str] = {}
        self.first = ""
        self.touches = 0  # first's calls so far
        self.fired = False  # second has started
        self.waiting: set[str] = set()

    def pause(self) -> None:
        """In an actor's greenlet: back to the scheduler, which picks who goes on."""
        me = greenlet.getcurrent()
        if me not in self.names:
            return  # a step run on its own
        if self.names[me] == self.first and not self.fired:
            self.touches += 1
            if self.touches < self.at:
                return
            self.fired = True
        self.main.switch()

    def wait_for_lock(self) -> None:
        me = self.names[greenlet.getcurrent()]
        self.waiting.add(me)
        self.main.switch()
        self.waiting.discard(me)

    def _enter(self, g: greenlet) -> None:
        self.w.actor = self.names[g]
        g.switch()

    def run(self, first: tuple[str, Any], second: tuple[str, Any]) -> None:
        g1, g2 = greenlet(first[1]), greenlet(second[1])
        self.names = {g1: first[0], g2: second[0]}
        self.first = first[0]
        self._enter(g1)  # until its at-th call or its end
        while not (g1.dead and g2.dead):
            blocked = second[0] in self.waiting and self.w.lock_holder not in (None, second[0])
            if not g2.dead and (not blocked or g1.dead):
                if blocked:
                    raise AssertionError(f"{second[0]} waits for a lock {self.w.lock_holder} holds, and it is gone")
                self._enter(g2)
            else:
                self._enter(g1)


def run_history(
    order: tuple[str, ...],
    crash_at: tuple[str, int] | None,
    back: bool = False,
    inside: tuple[int, int] | None = None,
    interrupt: bool = False,
) -> World:
    """``order``'s steps one after another; with ``inside=(i, at)``, step ``i + 1`` starts at step ``i``'s
    ``at``-th call into the world (:class:`Scheduler`); ``world.scheduler.fired`` says whether it got there.
    ``interrupt``: the crash is an interrupt (``KeyboardInterrupt``), not a kill."""
    world = World(crash_at=crash_at, interrupt=interrupt)
    model = Model(world)
    runs = {"A": Run("A", None), "B": Run("B", None), "R": Run("R", 1),
            "D": Run("D", None, redrive=True), "E": Run("E", 1, redrive=True)}  # fmt: skip

    def do(step: str) -> None:
        if step == "F":
            model.foreign_step(back)
            return
        name, what = step.split(".")
        run = runs[name]
        if run.dead:
            return
        try:
            if what == "plan":
                model.redrive_plan_step(run) if run.redrive else model.plan_step(run)
            else:
                model.commit_step(run)
        except (Crash, KeyboardInterrupt):
            run.dead = True
        except TidemarkError as exc:
            # Only inside another step: F between a settle's commit and its read-back fails that process (a plan
            # step's settle_open_runs says StuckRunError); the next run settles it. Never in sequential histories.
            if world.scheduler is None or not isinstance(exc.__cause__ or exc, CommitError):
                raise
            run.dead = True

    index = 0
    while index < len(order):
        step = order[index]
        if inside is not None and inside[0] == index:
            world.scheduler = Scheduler(world, inside[1])
            nxt = order[index + 1]
            world.scheduler.run((step.split(".")[0], partial(do, step)), (nxt.split(".")[0], partial(do, nxt)))
            index += 1
        else:
            world.actor = step.split(".")[0]
            do(step)
        index += 1
        model.check_output()
    # Two more scheduled runs finish whatever the history left, then the feed must be whole.
    world.crash_at = None
    scheduler, world.scheduler = world.scheduler, None
    for name in ("N1", "N2"):
        run = Run(name, None)
        model.plan_step(run)
        model.commit_step(run)
        model.check_output()
    for tp in TPS:
        group_at = world.group[tp].offset
        shown_at = world.shown_at.get(tp)
        if group_at != world.end[tp] or shown_at is None or shown_at.position != world.end[tp]:
            world.violations.append(f"{tp}: no progress: log end {world.end[tp]}, group {group_at}, shown {shown_at}")
        visible = {o for plan in world.visible.values() for p in plan.partitions if p.key == tp
                   for o in range(p.start, p.end)}  # fmt: skip
        missing = [o for o in range(group_at or 0) if o not in visible and (tp, o) not in world.named]
        if missing:
            world.violations.append(f"{tp}: offsets {missing} below the group's position are in no output and no event")
    world.scheduler = scheduler
    return world


def test_every_interleaving_with_a_crash_at_every_step_keeps_the_output_right() -> None:
    """Every order without a crash; with a crash at every point: every order under ``make model``
    (``TIDEMARK_MODEL_ALL=1``, 630 orders, about 18,000 histories, 2 minutes), every fourth in ``make test``."""
    orders = list(interleavings())
    full = os.environ.get("TIDEMARK_MODEL_ALL") == "1"
    stride = 1 if full else 4
    histories = 0
    failures: list[str] = []
    for index, order in enumerate(orders):
        # The foreign writer moves the group forward (a stray consumer) or back (an operator's reset):
        # both under make model, alternately in make test.
        for back in (False, True) if full else (bool(index // stride % 2),):
            way = "back" if back else "forward"
            clean = run_history(order, None, back)
            histories += 1
            failures += [f"{order}, F {way}, no crash: {v}" for v in clean.violations]
            if index % stride:
                continue
            for actor, points in clean.passed.items():
                if actor not in "ABR":
                    continue
                for n in range(points):
                    world = run_history(order, (actor, n), back)
                    histories += 1
                    failures += [f"{order}, F {way}, {actor} crashed at point {n}: {v}" for v in world.violations]
    print(f"commit protocol model: {len(orders)} interleavings ({len(orders[::stride])} with a crash at every "
          f"point), the foreign writer {'both ways' if full else 'alternately'} forward and back, "
          f"{histories} histories checked")  # fmt: skip
    assert not failures, f"{len(failures)} of {histories} histories broke the rule, e.g.:\n" + "\n".join(failures[:15])
    assert histories > 5 * len(orders)  # crashes were really injected at many points


def test_the_model_sees_a_refused_run_and_a_foreign_move() -> None:
    """The model is not vacuous: a history where F moves the group between A's plan and commit refuses A."""
    world = run_history(("A.plan", "F", "A.commit", "B.plan", "B.commit", "R.plan", "R.commit"), None)
    states = sorted(r.state for r in world.ledger.values())
    assert "abandoned" in states
    assert world.named, "the foreign move's skipped range is named by an event"
    assert not world.violations


@pytest.mark.parametrize("point", range(12))
def test_a_crash_after_the_kafka_commit_then_a_foreign_move_loses_nothing(point: int) -> None:
    """Item 1 of the issue in the model: the Kafka commit lands, the run dies, a stray consumer moves the group."""
    world = run_history(("A.plan", "A.commit", "F", "B.plan", "B.commit", "R.plan", "R.commit"), ("A", point))
    assert not world.violations


def test_an_operator_resetting_the_group_to_a_racing_runs_basis_shows_nothing_twice() -> None:
    """The ABA case the planner cannot see: A and B plan from the same offsets, A commits and is shown, an
    operator resets the group to exactly those offsets, B's compare-and-set then succeeds. The output's own
    check keeps B out (a ``not_shown`` event names B's ranges) instead of showing A's records twice."""
    world = World()
    model = Model(world)
    first, a, b = Run("N0", None), Run("A", None), Run("B", None)
    model.plan_step(first)
    model.commit_step(first)  # the group and the output at 2
    basis = dict(world.group)
    model.plan_step(a)  # [2, 4)
    assert a.plan is not None
    staged_a = world.pending.pop((a.plan.plan_id, a.run_id))  # A's job is still running while B plans
    model.plan_step(b)  # [2, 6): planned later, more data
    world.pending[(a.plan.plan_id, a.run_id)] = staged_a
    assert b.plan is not None and a.plan.plan_id != b.plan.plan_id
    assert [p.start for p in b.plan.partitions] == [2, 2]
    model.commit_step(a)
    world.group.update(basis)  # the operator's reset, metadata and all
    model.commit_step(b)
    model.check_output()
    assert not world.violations
    assert world.ledger[b.run_id].state == "abandoned"
    assert b.plan.plan_id not in world.visible
    assert {(tp, o) for tp in TPS for o in (4, 5)} <= world.named  # B's ranges past the output's end are named


def test_a_committed_run_that_cannot_be_shown_stops_the_feed_with_the_command_that_clears_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A committed run whose promotion keeps failing (a table whose schema another writer changed) is an alert:
    the next plan refuses, naming the run, its ranges and ``tidemark abandon``; once abandoned, the feed goes on
    and the ranges are named by an event, never silently left out."""
    from tidemark.errors import PublishError, StuckRunError
    from tidemark.runs.protocol import abandon

    world = World()
    model = Model(world)
    stuck = Run("A", None)
    model.plan_step(stuck)
    assert stuck.plan is not None

    def refuse(plan_id: str, run_id: str) -> Manifest:
        raise PublishError("the table's schema changed incompatibly")

    monkeypatch.setattr(model.output, "promote", refuse)
    with pytest.raises(PublishError):
        model.commit_step(stuck)
    assert world.ledger[stuck.run_id].state == "committed" and world.group[TPS[0]].offset == 2
    with pytest.raises(StuckRunError, match=rf"run {stuck.run_id} .*tidemark abandon model {stuck.run_id}.*\[0, 2\)"):
        model.plan_step(Run("B", None))
    settled = abandon(stuck.plan, stuck.run_id, stuck.run_id, publisher=model.output, store=model.store,  # type: ignore[arg-type]
                      reason="schema fixed by hand")  # fmt: skip
    model._note(settled.events)
    monkeypatch.undo()
    nxt = Run("C", None)
    model.plan_step(nxt)
    model.commit_step(nxt)
    model.check_output()
    assert not world.violations
    assert world.ledger[stuck.run_id].state == "abandoned"
    assert {(tp, o) for tp in TPS for o in (0, 1)} <= world.named


def _inside_everywhere(order: tuple[str, ...], back: bool = False) -> Iterator[tuple[int, int, World]]:
    """(i, at, world) for step ``i + 1`` of ``order`` started at every call step ``i`` makes (other actors' steps)."""
    for i in range(len(order) - 1):
        if order[i].split(".")[0] == order[i + 1].split(".")[0]:
            continue  # one process: its steps follow each other
        at = 1
        while True:
            world = run_history(order, None, back, inside=(i, at))
            assert world.scheduler is not None
            if not world.scheduler.fired:
                break  # step i made fewer calls: the steps ran one after the other
            yield i, at, world
            at += 1


def test_a_step_started_inside_another_at_every_call_keeps_the_output_right() -> None:
    """Each step started inside the one before it, at every call that one makes into the group, the store or the
    output (where the lock lets it: inside a locked section it waits); every order under ``make model``, every
    21st in ``make test``. The commit lock keeps every Tidemark commit a compare-and-set."""
    orders = list(interleavings())
    stride = 1 if os.environ.get("TIDEMARK_MODEL_ALL") == "1" else 21
    histories, failures = 0, []
    for index, order in enumerate(orders[::stride]):
        for i, at, world in _inside_everywhere(order, back=bool(index % 2)):
            histories += 1
            failures += [f"{order}, {order[i + 1]} inside {order[i]} at its call {at}: {v}" for v in world.violations]
    print(f"commit protocol model: {len(orders[::stride])} orders, each step inside the one before at every call: "
          f"{histories} histories")  # fmt: skip
    assert not failures, f"{len(failures)} of {histories} histories broke the rule, e.g.:\n" + "\n".join(failures[:15])
    assert histories > 20 * len(orders[::stride])


ABC = ("A.plan", "B.plan", "A.commit", "B.commit", "R.plan", "R.commit", "F")


def test_a_plan_step_settles_a_staged_run_under_the_lock_while_its_own_commit_waits() -> None:
    """B's plan step settles A's staged run (``settle_open_runs``); A's own commit step, started at every call B's
    step makes, waits for the lock while B holds it, and finds A settled. Settling outside the lock (a read of the
    group, then another commit, then the write) would make A's commit no compare-and-set."""
    seen = 0
    for _, at, world in _inside_everywhere(ABC[:4]):
        seen += 1
        assert not world.violations, f"A.commit inside B.plan at B's call {at}: {world.violations}"
        held = [t for t in world.trace if t.endswith((":lock.held", ":lock.released"))]
        assert all(a.split(":")[0] == b.split(":")[0] for a, b in zip(held[::2], held[1::2], strict=True)), held
    assert seen > 10


def test_the_lock_is_real_no_other_actor_acts_inside_a_locked_section() -> None:
    """Whatever step starts inside another, the other actor does nothing between one actor's taking the lock and
    its letting go but ask for the lock (and wait)."""
    for i, at, world in _inside_everywhere(ABC):
        inside = None
        for entry in world.trace:
            actor, what = entry.split(":", 1)
            if what == "lock.held":
                inside = actor
            elif what == "lock.released":
                inside = None
            elif inside is not None and actor != inside:
                assert what == "lock.ask", (
                    f"{ABC[i + 1]} inside {ABC[i]} at call {at}: {actor} did {what} while {inside} held the lock"
                )


def test_without_the_commit_steps_lock_two_commits_race_and_the_model_sees_it() -> None:
    """The model is not vacuous about the lock: A and B plan from the same offsets (A's job still staging when B
    plans); with the commit step's lock taken away, B's commit started inside A's, between A's read of the group and
    its write, is seen as a commit that is no compare-and-set. With the lock, never."""
    found = []
    for locked in (True, False):
        at = 1
        while True:
            world = World()
            model = Model(world, locked=locked)
            runs = {"A": Run("A", None), "B": Run("B", None)}
            world.actor = "A"
            model.plan_step(runs["A"])
            staged = dict(world.pending)
            world.pending.clear()  # A's job is still staging while B plans: B does not settle A first
            world.actor = "B"
            model.plan_step(runs["B"])
            world.pending.update(staged)
            world.scheduler = Scheduler(world, at)
            world.scheduler.run(
                ("A", partial(model.commit_step, runs["A"])), ("B", partial(model.commit_step, runs["B"]))
            )
            if not world.scheduler.fired:
                break
            if any("no compare-and-set" in v for v in world.violations):
                found.append((locked, at))
            at += 1
    assert found and all(not locked for locked, _ in found), found


REDRIVE_STEPS = ("A.plan", "A.commit", "D.plan", "D.commit", "E.plan", "E.commit")


def redrive_interleavings() -> Iterator[tuple[str, ...]]:
    """Every order of a scheduled run's and two re-drives' steps in which each plans before it commits."""
    for order in itertools.permutations(REDRIVE_STEPS):
        if all(order.index(f"{r}.plan") < order.index(f"{r}.commit") for r in "ADE"):
            yield order


def test_two_redrives_and_a_run_with_a_crash_or_an_interrupt_at_every_step_keep_every_letter_once() -> None:
    """A scheduled run ``A`` and two re-drives (``D`` takes every listed dead letter, ``E`` all but the first, so
    they overlap) in every order, with a kill and an interrupt at every point of each actor: after every step each
    dead letter is listed once or re-driven once, and every offset below the group is shown once or named by an
    event (the history's end: two scheduled runs settle what was left, re-drives included). Every order under
    ``make model``, every ninth in ``make test``."""
    orders = list(redrive_interleavings())
    stride = 1 if os.environ.get("TIDEMARK_MODEL_ALL") == "1" else 9
    histories, failures = 0, []
    for index, order in enumerate(orders):
        clean = run_history(order, None)
        histories += 1
        failures += [f"{order}, no crash: {v}" for v in clean.violations]
        if index % stride:
            continue
        for actor, points in clean.passed.items():
            for n in range(points) if actor in "ADE" else ():
                for interrupt in (False, True):
                    world = run_history(order, (actor, n), interrupt=interrupt)
                    histories += 1
                    how = "interrupted" if interrupt else "killed"
                    failures += [f"{order}, {actor} {how} at point {n}: {v}" for v in world.violations]
    print(f"commit protocol model with re-drives: {len(orders)} orders, {histories} histories")
    assert not failures, f"{len(failures)} of {histories} histories broke the rule, e.g.:\n" + "\n".join(failures[:15])
    assert histories > 4 * len(orders)


def test_the_model_sees_two_overlapping_redrives_and_shows_each_letter_once() -> None:
    """Not vacuous: E chooses while D's staging is still running (so E's settling leaves D alone), both overlap;
    D shows first, E is given up by the clash rule and its staged copy discarded: each letter shown once."""
    world = World()
    model = Model(world)
    d, e = Run("D", None, redrive=True), Run("E", 1, redrive=True)
    world.actor = "D"
    model.redrive_plan_step(d)
    staged = dict(world.pending)
    world.pending.clear()  # D's job is still staging while E chooses
    world.actor = "E"
    model.redrive_plan_step(e)
    world.pending.update(staged)
    assert d.plan is not None and e.plan is not None and set(e.plan.letters) < set(d.plan.letters)
    for run in (d, e):
        world.actor = run.name
        model.commit_step(run)
        model.check_output()
    assert (world.ledger[d.run_id].state, world.ledger[e.run_id].state) == ("shown", "abandoned")
    assert not any(run_id == e.run_id for _, run_id in world.pending)
    assert sorted(k for plan in world.visible.values() for k in plan.letters) == sorted(LETTERS)
    assert not world.violations


def test_a_redrive_that_died_after_staging_is_shown_by_the_feeds_next_run() -> None:
    """D stages and dies before its commit step; the feed's next scheduled run settles it as any open run."""
    world = run_history(("D.plan", "A.plan", "A.commit"), None)
    [row] = [r for r in world.ledger.values() if r.run_id.endswith("-D")]
    assert row.state == "shown"
    assert sorted(k for plan in world.visible.values() for k in plan.letters) == sorted(LETTERS)
    assert not world.violations


def test_a_redrive_that_died_before_staging_is_given_up_once_another_showed_its_letters() -> None:
    """D records its plan and dies before staging; E shows some of D's letters; the feed's next run gives D up (it
    can never show) instead of leaving it open for good, and the letters stay once each."""
    world = run_history(("D.plan", "E.plan", "E.commit", "A.plan", "A.commit"), ("D", 1))
    by_actor = {r.run_id.split("-")[1]: r for r in world.ledger.values()}
    assert (by_actor["D"].state, by_actor["E"].state) == ("abandoned", "shown")
    assert "published by re-drive" in str(by_actor["D"].detail)
    assert not world.violations


class Recorded(MemStore):
    """The model's store, with each ledger write kept in order (the protocol's order of writes is its rule), and
    keyed as the real store is: runs and locks by group, open runs and shown positions by feed (the model's one)."""

    def __init__(self, world: World, log: list[tuple[Any, ...]]) -> None:
        super().__init__(world)
        self.log = log
        self.locked: list[str] = []

    def run(self, group: str, run_id: str) -> LedgerRun | None:
        return super().run(group, run_id) if group == GROUP else None

    def open_runs(self, feed: str) -> list[LedgerRun]:
        return super().open_runs(feed) if feed == FEED else []

    def shown(self, feed: str) -> dict[TP, Shown]:
        return super().shown(feed) if feed == FEED else {}

    def advance_shown(self, feed: str, run_id: str, ends: Mapping[TP, int], topic_ids: Mapping[str, str]) -> None:
        if feed == FEED:
            super().advance_shown(feed, run_id, ends, topic_ids)

    def commit_lock(self, group: str, timeout_s: float = 120.0) -> AbstractContextManager[None]:
        self.locked.append(group)
        return super().commit_lock(group, timeout_s)

    def set_run(self, group: str, run_id: str, *, feed: str, plan_id: str, state: RunState, run_dir: str,
                detail: str | None = None) -> None:  # fmt: skip
        self.log.append(("set_run", group, run_id, feed, plan_id, state, run_dir, detail))
        super().set_run(group, run_id, feed=feed, plan_id=plan_id, state=state, run_dir=run_dir, detail=detail)


class RecordedOutput(MemOutput):
    """The model's output, with discards and staging clean-ups kept in order, and a manifest naming its run."""

    def __init__(self, world: World, log: list[tuple[Any, ...]], shown_by: str | None = None) -> None:
        super().__init__(world)
        self.log, self.shown_by = log, shown_by

    def published(self, plan_id: str) -> Manifest | None:
        found = super().published(plan_id)
        if found is None or self.shown_by is None:
            return found
        return replace(found, quarantined=3, extra={"run_id": self.shown_by})

    def discard(self, plan_id: str, run_id: str) -> Manifest | None:
        self.log.append(("discard", plan_id, run_id))
        return super().discard(plan_id, run_id)

    def clear_staging(self, run_id: str, *, dead_only: bool = False) -> None:
        self.log.append(("clear_staging", run_id, dead_only))


def _planned(shown_by: str | None = None) -> tuple[World, Model, Run, list[tuple[Any, ...]]]:
    """One run planned and staged (its job done), its store and output recording what the protocol does."""
    world, log = World(), list[tuple[Any, ...]]()
    model = Model(world)
    model.store, model.output = Recorded(world, log), RecordedOutput(world, log, shown_by)
    run = Run("A", None)
    model.plan_step(run)
    log.clear()
    model.store.locked.clear()  # type: ignore[attr-defined]
    return world, model, run, log


def _ranges_of(plan: Plan) -> list[dict[str, Any]]:
    return [{"topic": p.topic, "partition": p.partition, "start": p.start, "end": p.end} for p in plan.partitions]


def test_an_operator_abandoning_a_staged_run_records_discarding_then_discards_then_abandoned() -> None:
    """``abandon``: ``discarding`` first (an interrupted discard stays owed), the run's own pending publication
    discarded, then ``abandoned``; the detail names the operator's reason (cut at 1,000 characters) and a
    ``not_shown`` event names every range with records."""
    world, model, run, log = _planned()
    assert run.plan is not None
    plan, reason = run.plan, "r" * 1100
    settled = abandon(plan, run.run_id, "dir-A", publisher=model.output, store=model.store, reason=reason)  # type: ignore[arg-type]
    detail = f"abandoned by an operator: {reason}"[:1000]
    assert len(detail) == 1000
    assert log == [
        ("set_run", GROUP, run.run_id, FEED, plan.plan_id, "discarding", "dir-A", detail),
        ("discard", plan.plan_id, run.run_id),
        ("set_run", GROUP, run.run_id, FEED, plan.plan_id, "abandoned", "dir-A", detail),
    ]
    assert world.pending == {} and world.visible == {} and world.shown_at == {}
    message = f"run {run.run_id} (plan {plan.plan_id}) was abandoned by an operator ({reason}); its ranges are in no "
    message += "output"
    assert settled == Settled(run.run_id, plan.plan_id, "abandoned",
                              events=(Event("not_shown", message, details={"ranges": _ranges_of(plan)}),))  # fmt: skip


def test_abandoning_a_shown_run_is_refused_and_changes_nothing() -> None:
    world, model, run, log = _planned()
    assert run.plan is not None
    model.commit_step(run)
    assert world.ledger[run.run_id].state == "shown"
    log.clear()
    with pytest.raises(TidemarkError, match=rf"^run {run.run_id} of feed 'model' is shown; a shown run is never taken"):
        abandon(run.plan, run.run_id, "dir-A", publisher=model.output, store=model.store, reason="oops")  # type: ignore[arg-type]
    assert log == [] and world.ledger[run.run_id].state == "shown" and run.plan.plan_id in world.visible


@pytest.mark.parametrize("elsewhere", [False, True], ids=["feed-output", "other-output"])
def test_abandoning_a_run_whose_own_publication_is_shown_records_it_shown(elsewhere: bool) -> None:
    """A run stuck after the output showed its records (an Iceberg catalog commit, then its dead letters): what is
    shown stays; only its pending record goes, the run is recorded ``shown`` (the feed output's shown positions at
    its ends; a plan publishing elsewhere moves none), and a ``promotion_given_up`` event names it."""
    world, model, run, log = _planned(shown_by="")
    assert run.plan is not None
    plan = replace(run.plan, output="s3://elsewhere/") if elsewhere else run.plan
    model.output.shown_by = run.run_id  # type: ignore[attr-defined]
    world.visible[plan.plan_id] = plan  # the output shows it; the run is still committed, its promotion unfinished
    already = model.output.published(plan.plan_id)
    reason = "q" * 1100
    settled = abandon(plan, run.run_id, "dir-A", publisher=model.output, store=model.store, reason=reason)  # type: ignore[arg-type]
    message = (
        f"run {run.run_id} (plan {plan.plan_id}) was given up by an operator ({reason}) after its records were shown "
        "in memory: they stay there. What its promotion had not finished is given up: its 3 quarantined records are "
        "in the dead letters only if its quarantine folder holds them (`tidemark deadletters model` reads the "
        "folders of shown plans)"
    )
    assert log == [("discard", plan.plan_id, run.run_id),
                   ("set_run", GROUP, run.run_id, FEED, plan.plan_id, "shown", "dir-A", message[:1000])]  # fmt: skip
    assert world.pending == {}
    ends = {} if elsewhere else {tp: Shown(2, TOPIC_ID, run.run_id) for tp in TPS}
    assert world.shown_at == ends
    event = Event("promotion_given_up", message, details={"quarantined": 3, "ranges": _ranges_of(plan)})
    assert settled == Settled(run.run_id, plan.plan_id, "shown", manifest=already, events=(event,))


def test_abandoning_a_run_whose_plan_another_run_showed_discards_its_own_publication() -> None:
    """The output shows the plan, published by another run of the same ranges: this run is abandoned as usual."""
    world, model, run, log = _planned(shown_by="0000-other")
    assert run.plan is not None
    world.visible[run.plan.plan_id] = run.plan
    settled = abandon(run.plan, run.run_id, "dir-A", publisher=model.output, store=model.store, reason="x")  # type: ignore[arg-type]
    assert settled.state == "abandoned" and [e[0] for e in log] == ["set_run", "discard", "set_run"]
    assert world.shown_at == {}


def _from_run_dirs(tmp_path: Path) -> tuple[World, Model, Run, list[tuple[Any, ...]], Feed]:
    """Run A planned and staged, its plan saved in its run dir as the plan step saves it; a run whose dir is gone."""
    world, model, run, log = _planned()
    assert run.plan is not None
    run_dir = tmp_path / run.run_id
    run_dir.mkdir()
    write_plan(run.plan, run_dir / PLAN_FILE)
    world.ledger[run.run_id] = replace(world.ledger[run.run_id], run_dir=str(run_dir))
    world.ledger["0009-gone"] = LedgerRun(GROUP, "0009-gone", FEED, "plan-gone", "planned", str(tmp_path / "x"), "now")
    model.kafka.connection = None  # type: ignore[attr-defined]
    return world, model, run, log, Feed(name=FEED, group=GROUP, topics=(TOPIC,))


def test_settling_before_planning_shows_a_staged_run_loaded_from_its_run_dir(tmp_path: Path) -> None:
    """The plan step's ``settle_before_planning``: each open run's plan read from its run dir, its dead jobs'
    staging cleared (dead only: a live job's folder stays), committed and shown; a run whose plan is gone is
    abandoned. It returns the last shown run's plan id (the plan the new one follows)."""
    world, model, run, log, feed = _from_run_dirs(tmp_path)
    assert run.plan is not None
    loaded: list[Plan] = []
    said: list[str] = []

    def publisher_of(plan: Plan) -> Any:
        loaded.append(plan)
        return model.output

    resumed, events = settle_before_planning(feed, publisher_of, model.store, model.kafka, said.append)  # type: ignore[arg-type]
    assert (resumed, events) == (run.plan.plan_id, ())
    assert loaded == [run.plan] and log[0] == ("clear_staging", run.run_id, True)
    assert world.ledger[run.run_id].state == "shown" and run.plan.plan_id in world.visible
    assert world.shown_at == {tp: Shown(2, TOPIC_ID, run.run_id) for tp in TPS}
    assert world.ledger["0009-gone"].state == "abandoned" and world.ledger["0009-gone"].detail == "its plan is gone"
    assert model.store.locked == [GROUP]  # type: ignore[attr-defined]
    assert said == [f"settling run {run.run_id} (planned) of plan {run.plan.plan_id} first"]


def test_settling_before_planning_names_the_run_in_what_it_found(tmp_path: Path) -> None:
    """A staged run whose group another writer moved is refused: the new plan's event says which run it was."""
    world, model, run, _, feed = _from_run_dirs(tmp_path)
    assert run.plan is not None
    model.foreign_step()
    resumed, events = settle_before_planning(feed, lambda plan: model.output, model.store, model.kafka)  # type: ignore[arg-type, return-value]
    assert resumed is None and [e.kind for e in events] == ["commit_refused"]
    assert events[0].message.startswith(f"settling run {run.run_id}: refusing to commit plan {run.plan.plan_id}")
    assert events[0].details == {"ranges": _ranges_of(run.plan), "run_id": run.run_id}
    assert world.ledger[run.run_id].state == "abandoned" and world.visible == {}


def _shaped(plan: Plan, *ranges: tuple[int, int, str | None]) -> Plan:
    """``plan`` with partition ``i`` at ``ranges[i]`` (start, end, topic id)."""
    pairs = zip(plan.partitions, ranges, strict=True)
    parts = tuple(replace(p, start=s, end=e, topic_id=tid) for p, (s, e, tid) in pairs)
    return replace(plan, partitions=parts)


@pytest.mark.parametrize(
    ("shown", "ranges", "overlaps"),
    [
        ((2, TOPIC_ID), [(2, 4, TOPIC_ID), (2, 4, TOPIC_ID)], []),  # starts at the shown position: new records
        ((3, TOPIC_ID), [(2, 4, TOPIC_ID), (3, 4, TOPIC_ID)], [0]),  # one offset of overlap, on partition 0 only
        ((3, TOPIC_ID), [(2, 2, TOPIC_ID), (3, 4, TOPIC_ID)], []),  # behind, but no records there
        ((3, "other-id"), [(2, 4, TOPIC_ID), (2, 4, TOPIC_ID)], []),  # the shown position is of a recreated topic's
        ((3, None), [(2, 4, TOPIC_ID), (3, 4, TOPIC_ID)], [0]),  # a position recorded without an id: the same topic
        ((3, TOPIC_ID), [(2, 4, None), (3, 4, None)], [0]),  # a plan made without ids: the same topic
        ((3, TOPIC_ID), [(2, 4, TOPIC_ID), (0, 4, TOPIC_ID)], [0, 1]),  # both partitions behind
    ],
    ids=["at", "one-behind", "empty-behind", "other-topic-id", "shown-without-id", "plan-without-id", "both-behind"],
)
def test_a_range_starting_one_offset_behind_the_shown_position_is_kept_out(
    shown: tuple[int, str | None], ranges: list[tuple[int, int, str | None]], overlaps: list[int]
) -> None:
    """``overlapping``: each range with records must start at or after its partition's shown position (same topic
    id, or an id unknown on either side); the ``not_shown`` event names the partitions and positions."""
    from tidemark.runs.protocol import overlapping

    world, model, run, _ = _planned()
    assert run.plan is not None
    world.shown_at = {tp: Shown(shown[0], shown[1], "0000-N0") for tp in TPS}
    plan = _shaped(run.plan, *ranges)
    event = overlapping(plan, None, store=model.store)  # type: ignore[arg-type]
    if not overlaps:
        assert event is None
        return
    assert event is not None and event.kind == "not_shown"
    where = ", ".join(f"t[{k}] shown up to 3" for k in overlaps)
    assert event.message == (
        f"plan {plan.plan_id} overlaps what the feed's output already shows ({where}); it was kept out so that no "
        "offset is shown twice. The group is committed at the plan's ends: the ranges past the output's end are in "
        "no output (replay them into another output to read them)"
    )
    assert event.details == {"ranges": [{"topic": TOPIC, "partition": k, "start": ranges[k][0], "end": 4}
                                         for k in overlaps]}  # fmt: skip
    assert overlapping(plan, _manifest(plan), store=model.store) is None  # type: ignore[arg-type]  # already shown
    assert overlapping(replace(plan, output="s3://elsewhere/"), None, store=model.store) is None  # type: ignore[arg-type]


def test_a_commit_result_as_the_run_report_holds_it() -> None:
    from tidemark.runs.commit import CommitResult

    result = CommitResult("p", "r", "g", "committed", {("t", 1): 7, ("t", 0): 5}, "s", "f", (("t", 1),), ("n",))
    assert result.to_dict() == {
        "plan_id": "p", "run_id": "r", "group": "g", "status": "committed",
        "offsets": [{"topic": "t", "partition": 0, "offset": 5}, {"topic": "t", "partition": 1, "offset": 7}],
        "expired": [{"topic": "t", "partition": 1}], "notes": ["n"], "started_at": "s", "finished_at": "f",
    }  # fmt: skip


def test_settling_before_planning_reports_what_it_found_of_every_run(tmp_path: Path) -> None:
    """Two staged runs planned from the same offsets (B planned while A's job was staging), the group then moved by
    another writer: both are refused, and the new plan's events name each."""
    world, model, a, _, feed = _from_run_dirs(tmp_path)
    assert a.plan is not None
    staged = dict(world.pending)
    world.pending.clear()
    b = Run("B", None)
    model.plan_step(b)
    assert b.plan is not None
    world.pending.update(staged)
    (tmp_path / b.run_id).mkdir()
    write_plan(b.plan, tmp_path / b.run_id / PLAN_FILE)
    world.ledger[b.run_id] = replace(world.ledger[b.run_id], run_dir=str(tmp_path / b.run_id))
    model.foreign_step()
    resumed, events = settle_before_planning(feed, lambda plan: model.output, model.store, model.kafka)  # type: ignore[arg-type, return-value]
    assert resumed is None
    assert [(e.kind, e.details["run_id"]) for e in events] == [("commit_refused", r) for r in (a.run_id, b.run_id)]


def test_a_run_that_staged_nothing_is_abandoned_naming_the_move_once_another_writer_moved_the_group(
    tmp_path: Path,
) -> None:
    world, model, a, _, feed = _from_run_dirs(tmp_path)
    world.pending.clear()  # its job has staged nothing (yet)
    settle_before_planning(feed, lambda plan: model.output, model.store, model.kafka)  # type: ignore[arg-type, return-value]
    assert world.ledger[a.run_id].state == "planned"  # the group is where it planned: its job may be running now
    model.foreign_step()
    settle_before_planning(feed, lambda plan: model.output, model.store, model.kafka)  # type: ignore[arg-type, return-value]
    assert world.ledger[a.run_id].state == "abandoned"
    assert world.ledger[a.run_id].detail == "the group moved before it staged anything"
