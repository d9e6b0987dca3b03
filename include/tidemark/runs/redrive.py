"""A re-drive as a run of the feed: its dead letters that pass its current rules, published into its output once.

``tidemark redrive FEED`` (:func:`redrive_feed`) is a run of the feed's one commit protocol
(:mod:`tidemark.runs.protocol`), whose plan claims dead letters instead of offset ranges:

1. **choose**: the feed's dead letters (those no re-drive took:
   :func:`tidemark.output.deadletters.dead_letters`) through the current decoding and row
   rules (:func:`tidemark.job.redrive.recheck`; a masked feed's from the raw bytes its
   ``keep_raw`` location holds, masked before the rules as a run masks);
2. **plan**: those that pass are the letters of a re-drive plan
   (:func:`tidemark.planning.plan.redrive_plan`: mode ``redrive``, no range, no group commit;
   its id, ``redrive-…``, a hash of its letters, so the same dead letters are the same
   publication). The plan goes into the run's own folder (``runs/<feed>/<run id>/plan.json``)
   and the run into the run ledger under the feed's name, ``planned``, in one transaction with
   its :class:`~tidemark.output.deadletters.RedriveRecord` (what it takes, and the new reasons
   of the rest), before anything is staged: pruning run folders changes nothing of what it
   took (a copy in ``redrive.json`` is for people);
3. **stage**: the passing records staged pending under the run's id, as a plan's job stages
   (:func:`tidemark.job.redrive.stage_passing`), and its ``job.json`` written
   (:func:`tidemark.job.redrive.staged_result`);
4. **settle and report**: :func:`tidemark.runs.finish.finish_run`, as a run's commit step:
   under the group's commit lock :func:`tidemark.runs.protocol.settle` shows it, unless a
   shown re-drive took one of its letters meanwhile (the plan's clash rule,
   :func:`tidemark.runs.protocol.letters_taken`: then it is discarded and ``abandoned``),
   and records it ``shown``; then its report and ``run.json``.

A crash anywhere leaves an open run of the feed like any other: the feed's next run (or
:func:`tidemark.runs.protocol.settle_open_runs` from anywhere) shows what it staged, finishes
a discard cut short, or gives it up once another re-drive showed one of its letters. A
staging that fails is given up at once (:func:`tidemark.runs.protocol.abandon`); a staging
job that failed after it may have staged (:class:`~tidemark.job.redrive_job.RedriveJobError`)
is left open, as a crash. A re-drive never moves the group's offsets or the ledger's shown
positions: its records lie behind them.

The Spark work (1's re-check and 3's staging) runs in the caller's session, or, given a
:class:`~tidemark.job.redrive_job.RedriveJob`, in ``spark-submit`` jobs on the feed's Spark
(the DAG, and the CLI with a master), each step in between on this side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from functools import partial
from typing import TYPE_CHECKING

from tidemark.checkpoints.store import CheckpointStore, RunState
from tidemark.config.models import Feed, load_feed
from tidemark.errors import StuckRunError, TidemarkError
from tidemark.faults import fault_point
from tidemark.job.redrive import Recheck, Verdict, recheck, refuse_unsupported, stage_passing, staged_result
from tidemark.job.redrive_job import RedriveJob, RedriveJobError
from tidemark.job.result import write_result
from tidemark.kafka.registry import RegistryConnection
from tidemark.output import publisher_for
from tidemark.output.base import Publisher
from tidemark.output.deadletters import (
    REDRIVE_FILE,
    DeadLetter,
    RedriveRecord,
    dead_letters,
    is_redrive,
    read_redrive,
    redrive_records,
    redrive_rows,
    redriven,
)
from tidemark.planning.plan import Event, Mode, Plan, redrive_plan, write_plan
from tidemark.planning.requests import RunRequest
from tidemark.runs.finish import finish_run
from tidemark.runs.protocol import abandon, from_run_dirs, settle_open_runs
from tidemark.runs.report import record_end, record_failure
from tidemark.runs.run import Progress, Root, Run, RunHandle, open_checkpoints, silent, write_status
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REDRIVE_MODE: Mode = "redrive"


@dataclass(frozen=True)
class RedriveOutcome:
    """What one ``tidemark redrive`` did."""

    feed: str
    run_id: str | None  # None: a dry run, which records no run
    redrive_id: str | None
    state: RunState | None
    published: int  # records this re-drive showed in the feed's output (0 when reused or abandoned)
    verdicts: tuple[Verdict, ...]
    report_path: str | None = None
    settled_first: tuple[str, ...] = ()  # open re-drives of the feed settled (shown or given up) before choosing
    error: str | None = None

    @property
    def passing(self) -> int:
        return sum(1 for v in self.verdicts if v.passes)


@dataclass
class _InSession:
    """The re-drive's Spark work in ``spark``, this process's session, with :class:`RedriveJob`'s two steps: the
    re-check keeps its frame, from which the staging writes the letters that passed."""

    spark: SparkSession
    publisher: Publisher
    registry: RegistryConnection | None = None
    checked: Recheck | None = None  # the last re-check's

    def recheck(self, feed: Feed, letters: Sequence[DeadLetter]) -> tuple[Verdict, ...]:
        self.checked = recheck(self.spark, feed, letters, self.registry)
        return self.checked.verdicts

    def stage(self, feed: Feed, plan: Plan, letters: Sequence[DeadLetter], *, run_id: str, run_dir: Location) -> None:
        """Stage ``letters``, the re-check's passing ones (its frame holds them decoded), pending for ``run_id``."""
        assert self.checked is not None  # staged right after its re-check
        manifest = stage_passing(self.checked, plan, feed, self.publisher, run_id=run_id,
                                 extra={"redrive": {"run_id": run_id}})  # fmt: skip
        write_result(run_dir, staged_result(plan, manifest))


def redrive_feed(
    spark: SparkSession | RedriveJob,
    feed_name: str,
    *,
    since: datetime | date | None = None,
    reason: str | None = None,
    dry_run: bool = False,
    root: Root | None = None,
    checkpoints: CheckpointStore | None = None,
    registry: RegistryConnection | None = None,
    progress: Progress = silent,
) -> RedriveOutcome:
    """Re-drive ``feed_name``'s dead letters (filtered as :func:`dead_letters` filters); see the module docstring.

    ``dry_run``: only the verdicts; nothing is written, no run recorded. ``registry``: the schema registry an Avro
    feed's dead letters are decoded with (else the environment's, ``TIDEMARK_SCHEMA_REGISTRY_*``). ``spark``: a session
    to re-check and stage in, or a :class:`RedriveJob` that submits both to the feed's Spark (its driver's
    environment, or the secrets file, then names the registry).
    """
    feed = load_feed(feed_name)
    refuse_unsupported(feed)
    store = open_checkpoints(root, checkpoints)
    publisher = publisher_for(feed)
    settled_first: tuple[str, ...] = ()
    if not dry_run:  # what open re-drives took is known before anything is chosen
        settled_first = settle_open_redrives(feed, store, progress=progress)
        refuse_unknown_redrives(feed, store, publisher)
    letters = dead_letters(feed, since=since, reason=reason, store=store)
    work = spark if isinstance(spark, RedriveJob) else _InSession(spark, publisher, registry)
    verdicts = work.recheck(feed, letters)
    if dry_run:
        return RedriveOutcome(feed.name, None, None, None, 0, verdicts)
    run = start_redrive(feed, verdicts, root=root, store=store, progress=progress)
    if run.plan.letters:
        _stage(work, run, [v.letter for v in verdicts if v.passes], store=store, publisher=publisher)
        fault_point("redrive.after_stage")  # staged pending, not shown, not recorded
    error = None
    try:
        ended = finish_run(run, None, checkpoints=store, progress=progress)
    except TidemarkError as exc:  # given up (a shown re-drive took one of its letters): its report says why
        error = str(exc)
    row = store.run(feed.group, run.handle.run_id)
    state = row.state if row is not None else None
    shown = publisher.published(run.plan.plan_id) if state == "shown" and run.plan.letters else None
    published = shown.records if shown is not None and shown.extra.get("run_id") == run.handle.run_id else 0
    return RedriveOutcome(feed.name, run.handle.run_id, run.plan.plan_id, state, published, verdicts,
                          None if error else ended.report_path, settled_first, error)  # fmt: skip


def settle_open_redrives(feed: Feed, store: CheckpointStore, *, progress: Progress = silent) -> tuple[str, ...]:
    """The feed's open re-drive runs settled by the commit protocol (:func:`settle_open_runs`, as the feed's next
    run settles them; a re-drive has no Kafka connection, and they commit no group); their run ids."""
    settled = settle_open_runs(feed.name, from_run_dirs(partial(publisher_for, feed)), store=store, kafka=None,
                               group=feed.group, progress=progress,
                               which=is_redrive)  # fmt: skip
    return tuple(s.run_id for s in settled)


def start_redrive(
    feed: Feed, verdicts: Sequence[Verdict], *, root: Root | None, store: CheckpointStore, progress: Progress
) -> Run:
    """The re-drive's plan of the letters that pass, saved into its run dir, and its run into the ledger with its
    record (``planned``, one transaction), before anything is staged."""
    taken = tuple(sorted(v.letter.key_of for v in verdicts if v.passes))
    failing = tuple((v.letter.key_of, v.reason_codes) for v in verdicts if not v.passes)
    plan = redrive_plan(feed.name, feed.group, feed.isolation, taken, datetime.now(UTC).isoformat())
    message = (
        f"re-drive of {len(verdicts)} dead letters: {len(taken)} pass the feed's rules now and are published "
        f"into {feed.name}'s output as {plan.plan_id}; {len(failing)} still fail and keep their new reasons"
    )
    event = Event(
        "redrive",
        message,
        details={
            "redrive_id": plan.plan_id,
            "taken": len(taken),
            "still_failing": len(failing),
            "reasons_now": sorted({c for _, codes in failing for c in codes}),
        },
    )
    plan = replace(plan, events=(event,))  # fmt: skip
    run = Run(RunHandle.new(plan, RunRequest(REDRIVE_MODE, commit=False), root, None), feed, plan)
    record = RedriveRecord(plan.plan_id, run.handle.run_id, feed.name, taken, failing)
    run.dir.mkdir()
    write_plan(plan, Location.of(run.handle.plan_path))
    store.plan_redrive(feed.group, run.handle.run_id, feed=feed.name, plan_id=plan.plan_id,
                       run_dir=run.handle.run_dir, record=record.to_json())  # fmt: skip
    (run.dir / REDRIVE_FILE).write_text(record.to_json())
    write_status(run.dir, handle=run.handle.to_xcom(), planned_at=plan.created_at)
    progress(f"re-drive {run.handle.run_id}: {message}")
    return run


def _stage(
    work: _InSession | RedriveJob,
    run: Run,
    letters: Sequence[DeadLetter],
    *,
    store: CheckpointStore,
    publisher: Publisher,
) -> None:
    """Stage the run's letters; a staging that fails is given up at once (nothing of it shown), with its report."""
    try:
        work.stage(run.feed, run.plan, letters, run_id=run.handle.run_id, run_dir=run.dir)
    except RedriveJobError as exc:  # it may have staged: left open as a crash leaves it, for the next settle
        record_failure(run.handle, run.plan, None, f"re-drive {run.handle.run_id}: {exc}", None)
        raise
    except Exception as exc:
        with store.commit_lock(run.plan.group):
            settled = abandon(run.plan, run.handle.run_id, run.handle.run_dir, publisher=publisher, store=store,
                              reason=f"its staging failed: {exc}"[:900], by="the re-drive")  # fmt: skip
        record_end(run.handle, run.plan, None, settled=settled)
        raise


def adopt_folder_records(feed: Feed, store: CheckpointStore) -> tuple[str, ...]:
    """Copy into the run ledger the record of every re-drive of ``feed`` recorded before the ledger kept them (only
    in its run dir's ``redrive.json``); their run ids. Call with the group's commit lock held.

    After this, pruning those run dirs changes nothing either. A record is never replaced:
    the ledger's is the one the re-drive staged by.
    """
    rows = redrive_rows(feed.name, store)
    kept = redrive_records(feed.name, feed.group, store) if rows else {}
    adopted = []
    for row in rows:
        if row.run_id in kept:
            continue
        record = read_redrive(row)
        if record is not None:
            store.adopt_redrive(row.group, row.run_id, record.to_json())
            adopted.append(row.run_id)
    return tuple(adopted)


def refuse_unknown_redrives(feed: Feed, store: CheckpointStore, publisher: Publisher) -> None:
    """Refuse to re-drive while a re-drive that published has its record nowhere: which dead letters it took is
    unknown, so choosing now could publish them a second time."""
    with store.commit_lock(feed.group):
        adopt_folder_records(feed, store)
    unknown = redriven(feed, store, publisher).unknown
    if unknown:
        folders = ", ".join(f"runs/{feed.name}/{r}/{REDRIVE_FILE}" for r in unknown[:5])
        raise StuckRunError(
            f"feed '{feed.name}': {len(unknown)} re-drive(s) published into its output ({', '.join(unknown[:5])}) "
            f"but their record of the dead letters they took is in neither the run ledger nor their run dir (they "
            f"ran before the ledger kept records, and the run dir was removed). Re-driving now could publish those "
            f"dead letters twice, so nothing was chosen or staged. Restore {folders} in the state dir; the next "
            "`tidemark redrive` copies them into the run ledger"
        )
