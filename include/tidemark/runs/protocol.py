"""The commit protocol: the feed's output shows a run's records only after the group committed them.

A run moves through the states of the run ledger (:class:`~tidemark.checkpoints.store.LedgerRun`,
in the checkpoint store), each written under the group's commit lock *before* the step it
names acts, so that whoever takes the lock next knows what a crash may have left:

====================  ===============================================  ==========================================
state                 what holds                                       a crash here leaves; the next run
====================  ===============================================  ==========================================
``planned``           plan saved; the job stages the publication       nothing visible. Staged: committed and shown
                      *pending* (invisible to readers)                 by the next run (or its own retry); unstaged
                                                                       and its group moved: ``abandoned``
``committing``        the Kafka commit (compare-and-set) is under way  it asks the group: this run's metadata at the
                                                                       ends → landed, go on; the group where the plan
                                                                       saw it → commit again; moved by another
                                                                       writer → shown if the group is past every
                                                                       range, else discarded, with an event
``committed``         the group is at the plan's ends (checkpoint      promoted by the next run before it plans
                      recorded); the publication is still pending
``shown``             promoted: readers see it; the ledger's shown     final
                      positions advanced to the plan's ends
``discarding``        refused before anything landed (or kept out so   its discard was cut short: the next run
                      nothing shows twice, or given up): never         discards again (idempotent), then records
                      visible; its discard is under way                it ``abandoned``
``abandoned``         discarded: nothing of the run is left            final
====================  ===============================================  ==========================================

A discard deletes only the run's own files: its pending publication, its staging folders
(named by its run id) and, on Iceberg, its own quarantine folder; never a file of a plan the
output holds as this run committed it.

Two rules make the output right whatever the order of runs, retries, replays and other
writers: a publication is promoted only after its run's commit (or, for a run that does
not commit, after its job), and only when every range with records starts at or after
the output's shown position of its partition (:func:`show`), so no offset is shown twice.
Nothing shown is ever taken back. A re-drive's plan (:mod:`tidemark.runs.redrive`) claims
dead letters instead of ranges and commits no group; it is settled here as any run, its
clash rule :func:`letters_taken` (no letter a shown re-drive took) in place of the ranges'
(:func:`overlapping`). The planner compares the group with the shown
positions (``planning.resolve._against_shown``) and names every range the group was moved
over by another writer.

:func:`settle` is the whole protocol for one run, called with the lock held: by the run's
own commit step, and by :func:`settle_open_runs` before any new plan of the feed (the
plan step's :func:`settle_before_planning`, which loads each open run from its run dir). It
takes its collaborators as arguments (a Kafka adapter, the store, the publisher), so the
model test (``tests/unit/runs/test_protocol_model.py``) drives exactly this code with an
in-memory group and output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import CheckpointStore, LedgerRun, RunState
from tidemark.config.models import Feed
from tidemark.errors import GroupInUseError, OffsetsMovedError, StuckRunError, TidemarkError
from tidemark.faults import fault_point
from tidemark.job.guard import moved_since_planning
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.output.base import Manifest, Publisher
from tidemark.output.deadletters import redriven_in
from tidemark.planning.metadata import plan_topic_ids
from tidemark.planning.plan import PLAN_FILE, Event, EventKind, Plan, read_plan
from tidemark.runs.commit import CommitResult, commit_plan
from tidemark.runs.run import Progress, silent
from tidemark.storage import Location


@dataclass(frozen=True)
class Settled:
    """Where :func:`settle` left a run, and what happened on the way (events for its report)."""

    run_id: str
    plan_id: str
    state: RunState
    commit: CommitResult | None = None
    manifest: Manifest | None = None
    events: tuple[Event, ...] = field(default_factory=tuple)  # reported as the commit step's


def _fmt(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


def _ranges(plan: Plan, keys: set[TP] | None = None) -> list[dict[str, Any]]:
    return [{"topic": p.topic, "partition": p.partition, "start": p.start, "end": p.end}
            for p in plan.partitions if p.records and (keys is None or p.key in keys)]  # fmt: skip


def _event(kind: EventKind, message: str, **details: Any) -> Event:
    return Event(kind, message, details=details)


def shows_in_feed_output(plan: Plan) -> bool:
    """Whether ``plan`` publishes to its feed's own output (whose shown positions the ledger keeps)."""
    return not plan.output


def settle(
    plan: Plan,
    run_id: str,
    run_dir: str,
    *,
    publisher: Publisher,
    store: CheckpointStore,
    kafka: KafkaAdapter | None,
    connection: KafkaConnection | None = None,
    progress: Progress = silent,
) -> Settled:
    """Take run ``run_id`` of ``plan`` as far as it can go: commit the group (if the plan commits), then show.

    Call with ``store.commit_lock(plan.group)`` held. Raises what refuses the run
    (:class:`~tidemark.errors.OffsetsMovedError` after discarding its publication and
    recording it ``abandoned``, :class:`~tidemark.errors.GroupInUseError` leaving it
    ``planned`` to try again) or what left it undecided (any other error: the next
    settle decides from the group's offsets).
    """
    row = store.run(plan.group, run_id)
    state: RunState = row.state if row is not None else "planned"

    def mark(new: RunState, detail: str | None = None) -> None:
        store.set_run(plan.group, run_id, feed=plan.feed, plan_id=plan.plan_id, state=new, run_dir=run_dir,
                      detail=detail)  # fmt: skip

    def give_up(detail: str | None) -> None:
        """``discarding`` first, so a crash or an interrupt in the discard leaves it owed; ``abandoned`` once done."""
        mark("discarding", detail)
        publisher.discard(plan.plan_id, run_id)
        mark("abandoned", detail)

    if state == "discarding":  # a discard cut short: finished now
        give_up(row.detail if row is not None else None)
        return Settled(run_id, plan.plan_id, "abandoned")
    if state == "abandoned":
        publisher.discard(plan.plan_id, run_id)  # idempotent; a row recorded before discards were recorded done
        return Settled(run_id, plan.plan_id, state)
    if state == "shown":
        return Settled(run_id, plan.plan_id, state)

    events: list[Event] = []
    result = None
    if state in ("planned", "committing") and plan.commit:
        _refuse_unstaged(plan, run_id, publisher)
        was_committing = state == "committing"
        mark("committing")
        try:
            result = commit_plan(plan, connection, store, run_id=run_id, adapter=kafka)
        except GroupInUseError:
            mark("planned")  # nothing landed: the run may try again once the live consumer is gone
            raise
        except OffsetsMovedError as exc:
            if was_committing and kafka is not None and _group_past(plan, kafka):
                # An earlier attempt's commit may have landed before another writer moved the
                # group on; either way the group is past every range: show them.
                events.append(_event(
                    "group_moved", f"run {run_id}: the group was moved by another writer after this run began its "
                    f"commit; it is past every range of plan {plan.plan_id}, so the plan is shown: {exc}",
                    ranges=_ranges(plan)))  # fmt: skip
            else:
                give_up(str(exc)[:1000])
                progress(f"run {run_id} was refused: its staged plan {plan.plan_id} was discarded, never shown")
                raise
        else:
            mark("committed")
    fault_point("commit.before_show")
    already = publisher.published(plan.plan_id) if plan.total_records else None  # asked once: a table load on Iceberg
    overlap = overlapping(plan, already, store=store) or letters_taken(plan, run_id, already, store, publisher)
    if overlap is not None:
        give_up(overlap.message[:1000])
        return Settled(run_id, plan.plan_id, "abandoned", result, None, (*events, overlap))
    manifest = show(plan, run_id, already, publisher=publisher, store=store)
    fault_point("commit.after_show")  # shown (a run's, a re-drive's), the run ledger not yet told
    if manifest is not None and not manifest.reused:  # what the output's commit reports (a keyed table's counts)
        events += [_event(e["kind"], e["message"], **e.get("details", {})) for e in manifest.extra.get("events", [])]
    mark("shown")
    return Settled(run_id, plan.plan_id, "shown", result, manifest, tuple(events))


def _refuse_unstaged(plan: Plan, run_id: str, publisher: Publisher) -> None:
    """Refuse to commit run ``run_id`` of ``plan`` when its records were staged nowhere (and are not shown)."""
    if (
        plan.total_records
        and publisher.staged(plan.plan_id, run_id) is None
        and publisher.published(plan.plan_id) is None
    ):
        raise TidemarkError(
            f"run {run_id} of feed '{plan.feed}' has not staged plan {plan.plan_id}; refusing to commit offsets "
            "for records that were not staged for publication"
        )


def _group_past(plan: Plan, kafka: KafkaAdapter) -> bool:
    """Whether the group's offset is at or past the end of every range of ``plan`` with records."""
    current = kafka.committed(plan.group, [p.key for p in plan.partitions])
    return all(current[p.key].offset is not None and current[p.key].offset >= p.end  # type: ignore[operator]
               for p in plan.partitions if p.records)  # fmt: skip


def overlapping(plan: Plan, already: Manifest | None, *, store: CheckpointStore) -> Event | None:
    """The ``not_shown`` event when showing ``plan`` in its feed's output would show an offset twice, else ``None``.

    Every range with records must start at or after the output's shown position of its
    partition (on the same topic id). A plan the output already shows (``already``: an
    earlier promotion of this run, or another run of the same ranges) is not shown again
    and overlaps nothing.
    """
    if not shows_in_feed_output(plan) or not plan.total_records or already is not None:
        return None
    shown = store.shown(plan.feed)
    overlap = {
        p.key for p in plan.partitions
        if p.records and (s := shown.get(p.key)) is not None and s.position > p.start
        and not (s.topic_id and p.topic_id and s.topic_id != p.topic_id)
    }  # fmt: skip
    if not overlap:
        return None
    where = ", ".join(f"{_fmt(k)} shown up to {shown[k].position}" for k in sorted(overlap))
    return _event(
        "not_shown", f"plan {plan.plan_id} overlaps what the feed's output already shows ({where}); it was kept out "
        "so that no offset is shown twice. The group is committed at the plan's ends: the ranges past the output's "
        "end are in no output (replay them into another output to read them)",
        ranges=_ranges(plan, overlap))  # fmt: skip


def letters_taken(
    plan: Plan, run_id: str, already: Manifest | None, store: CheckpointStore, publisher: Publisher
) -> Event | None:
    """A re-drive plan's clash rule: the ``not_shown`` event when another re-drive of the feed the output shows took
    one of the dead letters ``plan`` claims (showing it would publish that letter twice), else ``None``.

    A plan the output already shows (this run's earlier promotion, or another run of the same
    letters) clashes with nothing.
    """
    if not plan.letters or already is not None:
        return None
    others = redriven_in(plan.feed, plan.group, store, publisher).taken
    clash = sorted(k for k in plan.letters if others.get(k, run_id) != run_id)
    if not clash:
        return None
    p, t, n, o = clash[0]
    return _event(
        "not_shown", f"re-drive {run_id}: {len(clash)} of its dead letters (the first {t}[{n}] offset {o} of plan "
        f"{p}) were published by re-drive {others[clash[0]]} meanwhile; it was given up so that none is published "
        "twice. Run `tidemark redrive` again for the rest", redrive_id=plan.plan_id)  # fmt: skip


def show(
    plan: Plan, run_id: str, already: Manifest | None, *, publisher: Publisher, store: CheckpointStore
) -> Manifest | None:
    """Promote run ``run_id``'s pending publication, then advance the feed output's shown positions.

    A plan the output ``already`` shows is promoted too: promotion is idempotent, and an output
    whose promotion is two commits (an Iceberg feed's data, then its dead letters) finishes
    there what a crash between them left.
    """
    manifest = already
    if plan.total_records:
        manifest = publisher.promote(plan.plan_id, run_id)
    if shows_in_feed_output(plan):
        store.advance_shown(plan.feed, run_id, plan.ends(), plan_topic_ids(plan))
    return manifest


def settle_before_planning(
    feed: Feed,
    publisher_of: Callable[[Plan], Publisher],
    store: CheckpointStore,
    kafka: KafkaAdapter,
    progress: Progress = silent,
) -> tuple[str | None, tuple[Event, ...]]:
    """Every open run of ``feed`` first, loaded from its run dir (``docs/ARCHITECTURE.md``, "The commit protocol").

    A committed run is shown, a staged one committed and shown, a refused one discarded;
    ``publisher_of(plan)`` is where a plan publishes (:func:`tidemark.output.publisher_for`).
    Returns the plan id of the last run shown and what settling found, as events of the new plan.
    """
    resumed = None
    events: list[Event] = []
    for settled in settle_open_runs(feed.name, from_run_dirs(publisher_of), store=store, kafka=kafka, group=feed.group,
                                    connection=kafka.connection, progress=progress):  # fmt: skip
        if settled.state == "shown":
            resumed = settled.plan_id
        events += [replace(e, message=f"settling run {settled.run_id}: {e.message}",
                           details={**e.details, "run_id": settled.run_id}) for e in settled.events]  # fmt: skip
    return resumed, tuple(events)


def from_run_dirs(publisher_of: Callable[[Plan], Publisher]) -> Callable[[LedgerRun], tuple[Plan, Publisher] | None]:
    """For :func:`settle_open_runs`: a ledger row's plan (its run dir's copy; ``None`` when gone) and publisher.

    Loading an open run removes what its dead jobs left in staging (a job killed mid-write: raw bytes included),
    never a folder a live job holds (:func:`tidemark.output.staging.remove_run_staging`)."""

    def load(row: LedgerRun) -> tuple[Plan, Publisher] | None:
        path = Location.of(row.run_dir) / PLAN_FILE
        if not path.exists():
            return None
        plan = read_plan(path)
        publisher = publisher_of(plan)
        publisher.clear_staging(row.run_id, dead_only=True)  # what a job of the run that died left in staging
        return plan, publisher

    return load


def settle_open_runs(
    feed: str,
    load: Callable[[LedgerRun], tuple[Plan, Publisher] | None],
    *,
    store: CheckpointStore,
    kafka: KafkaAdapter | None,
    group: str,
    connection: KafkaConnection | None = None,
    progress: Progress = silent,
    which: Callable[[LedgerRun], bool] = lambda row: True,
) -> list[Settled]:
    """Before planning: finish or abandon every open run of ``feed`` in the ledger, oldest first, under the lock.

    ``load(row)`` gives a run's plan and publisher (``None``: its plan is gone; it is
    abandoned). A ``planned`` run that staged nothing is left alone while the group is
    still where its plan saw it (its job may be running now) and abandoned once another
    writer moved the group (it can never commit). Refusals are reported, not raised:
    the new run plans from the group's offsets as they are. ``which``: the open runs to settle (a re-drive, which
    has no Kafka connection, settles the feed's open re-drives only: they commit no group); the rest are left.
    """
    done: list[Settled] = []
    with store.commit_lock(group):
        for row in filter(which, store.open_runs(feed)):
            loaded = load(row)
            if loaded is None or _staged_nothing(row, *loaded):
                # A run that staged nothing is left alone (its job may be running now) unless it never can commit;
                # then what its jobs left in staging is discarded like any given-up run's.
                why = "its plan is gone" if loaded is None else _never_staged(row, *loaded, kafka, store)
                if why is not None:
                    steps: tuple[RunState, ...] = ("discarding", "abandoned") if loaded is not None else ("abandoned",)
                    for step in steps:
                        store.set_run(row.group, row.run_id, feed=row.feed, plan_id=row.plan_id, state=step,
                                      run_dir=row.run_dir, detail=why)  # fmt: skip
                        if step == "discarding" and loaded is not None:
                            loaded[1].discard(row.plan_id, row.run_id)
                continue
            plan, publisher = loaded
            progress(f"settling run {row.run_id} ({row.state}) of plan {plan.plan_id} first")
            if row.state == "discarding":  # given up: nothing of it can show, so a failing discard stops nothing
                try:
                    done.append(settle(plan, row.run_id, row.run_dir, publisher=publisher, store=store, kafka=kafka,
                                       connection=connection, progress=progress))  # fmt: skip
                except (TidemarkError, OSError) as exc:
                    progress(f"run {row.run_id} was given up; its discard failed and stays owed to the next run: {exc}")
                continue
            try:
                done.append(settle(plan, row.run_id, row.run_dir, publisher=publisher, store=store, kafka=kafka,
                                   connection=connection, progress=progress))  # fmt: skip
            except TidemarkError as exc:
                if not isinstance(exc, OffsetsMovedError | GroupInUseError):
                    # Committed (or maybe committed) but it cannot be shown, e.g. a table whose schema another
                    # writer changed: planning past it would leave its records out for good. Say so and how to clear.
                    ranges = ", ".join(f"{_fmt((r['topic'], r['partition']))} [{r['start']}, {r['end']})"
                                       for r in _ranges(plan))  # fmt: skip
                    raise StuckRunError(
                        f"run {row.run_id} of feed '{plan.feed}' ({row.state}, plan {plan.plan_id}) cannot be "
                        f"finished: {exc}. Nothing new is planned before it is. Fix the cause and run the feed "
                        f"again, or give it up with `tidemark abandon {plan.feed} {row.run_id}` (its ranges, "
                        f"{ranges}, are then in no output and named by an event)"
                    ) from exc
                progress(f"run {row.run_id} cannot commit: {exc}")
                state: RunState = "abandoned" if isinstance(exc, OffsetsMovedError) else "planned"
                done.append(Settled(row.run_id, plan.plan_id, state,
                                    events=(_event("commit_refused", str(exc), ranges=_ranges(plan)),)))  # fmt: skip
    return done


def _staged_nothing(row: LedgerRun, plan: Plan, publisher: Publisher) -> bool:
    """Whether ``row`` is a ``planned`` run whose job has staged nothing (yet).

    A run that commits no group (a re-drive, a replay without commit) whose publication the
    output already shows, or that has nothing to publish, waits for nothing: its settle died
    after the promotion (or before it recorded an empty run), and settling records it ``shown``.
    """
    if row.state != "planned":
        return False
    if not plan.total_records:
        return plan.commit
    if publisher.staged(plan.plan_id, row.run_id) is not None:
        return False
    return plan.commit or publisher.published(plan.plan_id) is None


def _never_staged(
    row: LedgerRun, plan: Plan, publisher: Publisher, kafka: KafkaAdapter | None, store: CheckpointStore
) -> str | None:
    """Why a run that staged nothing can never show: another writer moved the group since it planned, or (a
    re-drive) another re-drive showed one of its dead letters."""
    if plan.letters:
        taken = letters_taken(plan, row.run_id, None, store, publisher)
        return None if taken is None else f"it staged nothing: {taken.message}"
    if not plan.commit or kafka is None:
        return None
    current = kafka.committed(plan.group, [p.key for p in plan.partitions])
    return "the group moved before it staged anything" if moved_since_planning(plan, row.run_id, current)[0] else None


def abandon(
    plan: Plan,
    run_id: str,
    run_dir: str,
    *,
    publisher: Publisher,
    store: CheckpointStore,
    reason: str,
    by: str = "an operator",
) -> Settled:
    """An operator gives up run ``run_id`` (``tidemark abandon``): recorded ``abandoned``, its pending
    publication discarded, a ``not_shown`` event naming its ranges. A run already shown is left as it is.

    Call with the group's commit lock held.
    """
    row = store.run(plan.group, run_id)
    if row is not None and row.state == "shown":
        raise TidemarkError(f"run {run_id} of feed '{plan.feed}' is shown; a shown run is never taken back")
    already = publisher.published(plan.plan_id) if plan.total_records else None
    if already is not None and already.extra.get("run_id") == run_id:
        return _give_up_shown(plan, run_id, run_dir, already, publisher=publisher, store=store, reason=reason)

    def mark(state: RunState) -> None:
        store.set_run(plan.group, run_id, feed=plan.feed, plan_id=plan.plan_id, state=state, run_dir=run_dir,
                      detail=f"abandoned by {by}: {reason}"[:1000])  # fmt: skip

    mark("discarding")  # first: an interrupted discard stays owed, and the next settle finishes it
    publisher.discard(plan.plan_id, run_id)
    mark("abandoned")
    event = _event("not_shown", f"run {run_id} (plan {plan.plan_id}) was abandoned by {by} ({reason}); its "
                   f"{'dead letters stay listed' if plan.letters else 'ranges are in no output'}",
                   ranges=_ranges(plan))  # fmt: skip
    return Settled(run_id, plan.plan_id, "abandoned", events=(event,))


def _give_up_shown(
    plan: Plan,
    run_id: str,
    run_dir: str,
    already: Manifest,
    *,
    publisher: Publisher,
    store: CheckpointStore,
    reason: str,
) -> Settled:
    """An operator gives up run ``run_id`` whose own publication the output already shows (an Iceberg run stuck
    after its catalog commit, on its dead letters): what is shown is never taken back, so the run is recorded
    ``shown`` with the output's shown positions at its ends, and only its pending record goes (the output
    references its files). A ``promotion_given_up`` event names what its promotion had not finished."""
    publisher.discard(plan.plan_id, run_id)
    if shows_in_feed_output(plan):
        store.advance_shown(plan.feed, run_id, plan.ends(), plan_topic_ids(plan))
    message = (
        f"run {run_id} (plan {plan.plan_id}) was given up by an operator ({reason}) after its records were shown in "
        f"{publisher.describe()}: they stay there. What its promotion had not finished is given up: its "
        f"{already.quarantined} quarantined records are in the dead letters only if its quarantine folder holds them "
        f"(`tidemark deadletters {plan.feed}` reads the folders of shown plans)"
    )
    store.set_run(plan.group, run_id, feed=plan.feed, plan_id=plan.plan_id, state="shown", run_dir=run_dir,
                  detail=message[:1000])  # fmt: skip
    event = _event("promotion_given_up", message, quarantined=already.quarantined, ranges=_ranges(plan))
    return Settled(run_id, plan.plan_id, "shown", manifest=already, events=(event,))
