"""A re-drive as a run: a feed's dead letters that pass its current rules, published into its output exactly once.

``tidemark redrive FEED`` (:func:`redrive_feed`) takes the commit protocol's steps with a
record of its own in place of a plan:

1. **settle first**: every re-drive of the feed a crash left open is finished or given up
   (:func:`settle_open_redrives`), so what it took is known before anything is chosen;
2. **choose**: the feed's dead letters (those no re-drive took:
   :func:`tidemark.output.deadletters.dead_letters`) through the current decoding and row
   rules (:func:`tidemark.job.redrive.recheck`; a masked feed's from the raw bytes its
   ``keep_raw`` location holds, masked before the rules as a run masks); the
   :class:`RedriveRecord` names those that pass (``taken``) and the new reasons of the
   rest; its id is a hash of ``taken``, so the
   same dead letters are the same publication (``plan_id=redrive-…``), which the output
   publishes at most once. The record goes into the run ledger with the re-drive's row
   (state ``planned``, under :func:`redrive_ledger_feed`) in one transaction, before anything
   is staged (a copy in the run dir's ``redrive.json`` is for people); re-drives recorded
   before the ledger kept records are copied into it from their run dirs first
   (:func:`adopt_folder_records`), and one recorded nowhere refuses the re-drive
   (:func:`refuse_unknown_redrives`);
3. **stage**: the passing records are staged pending under the run's id, as a plan's job
   stages (:func:`tidemark.job.redrive.stage_passing`), invisible to readers;
4. **show, then record**: under the group's commit lock (:func:`settle_redrive`) the
   publication is promoted, unless a shown re-drive already took one of its dead
   letters (then it is discarded, ``abandoned``), and only then is the row ``shown``;
5. **report**: ``report.json`` and ``run.json`` in ``runs/<feed>/<run id>/`` as any run
   (:func:`tidemark.runs.report.record_end`, mode ``redrive``, no group commit).

The Spark work (2's re-check and 3's staging) runs in the caller's session, or, given a
:class:`~tidemark.job.redrive_job.RedriveJob`, in ``spark-submit`` jobs on the feed's Spark
(the DAG, and the CLI with a master), each step in between on this side. A staging job that
fails leaves the row ``planned`` and what it staged as a crash after staging does.

A crash after 4's promotion and before its ``shown`` leaves an open row whose publication the
output shows: the listing already leaves its dead letters out (``redriven`` asks the
output), and the next re-drive records it ``shown``; a crash after staging leaves a pending
publication the next re-drive shows. A re-drive never moves the group's offsets, the
ledger's shown positions or an Iceberg table's ledger ends: its records lie behind them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.checkpoints.store import CheckpointStore, RunState
from tidemark.config.models import Feed, load_feed
from tidemark.errors import StuckRunError
from tidemark.faults import fault_point
from tidemark.job.redrive import Recheck, Verdict, recheck, refuse_unsupported, stage_passing
from tidemark.job.redrive_job import RedriveJob, RedriveJobError
from tidemark.job.result import JobResult
from tidemark.kafka.registry import RegistryConnection
from tidemark.output import publisher_for
from tidemark.output.base import Manifest, Publisher
from tidemark.output.deadletters import (
    REDRIVE_FILE,
    DeadLetter,
    Key,
    RedriveRecord,
    dead_letters,
    read_redrive,
    redrive_ledger_feed,
    redriven,
)
from tidemark.planning.plan import Event, Plan
from tidemark.runs.protocol import Settled
from tidemark.runs.report import record_end
from tidemark.runs.run import Progress, Root, RunHandle, open_checkpoints, run_dir_for, silent, write_status
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REDRIVE_MODE = "redrive"
REDRIVE_PREFIX = "redrive-"  # a re-drive's publication is plan_id=redrive-<hash>: no plan id looks like it


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
    settled_first: tuple[str, ...] = ()  # open re-drives of the feed finished or given up first
    error: str | None = None

    @property
    def passing(self) -> int:
        return sum(1 for v in self.verdicts if v.passes)


def redrive_id_of(feed: str, taken: Sequence[Key]) -> str:
    """The publication's plan id: a hash of the feed and the sorted dead letters it takes."""
    text = json.dumps([feed, sorted(taken)], separators=(",", ":"))
    return REDRIVE_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


def redrive_plan(record: RedriveRecord, feed: Feed, created_at: str) -> Plan:
    """What the publisher is handed for a re-drive: its id, feed and group, and no ranges.

    No ranges: its records lie behind the output's end, and a plan's ranges would move the
    Iceberg table ledger's ends (or be refused by them); the record in the run dir names them.
    The mode is a replay's: a publication that commits no group.
    """
    return Plan(plan_id=record.redrive_id, feed=feed.name, group=feed.group, mode="replay", commit=False,
                isolation=feed.isolation, created_at=created_at, partitions=(), tasks=())  # fmt: skip


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

    def stage(self, feed: Feed, letters: Sequence[DeadLetter], plan: Plan, *, run_id: str, extra: Mapping[str, Any],
              log: Location | None = None) -> None:  # fmt: skip
        """Stage ``letters``, the re-check's passing ones (its frame holds them decoded), pending for ``run_id``."""
        assert self.checked is not None  # staged right after its re-check
        stage_passing(self.checked, plan, feed, self.publisher, run_id=run_id, extra=extra)


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
    settled_first = () if dry_run else settle_open_redrives(feed, publisher, store, progress=progress)
    if not dry_run:
        refuse_unknown_redrives(feed, store, publisher)
    letters = dead_letters(feed, since=since, reason=reason, store=store)
    work = spark if isinstance(spark, RedriveJob) else _InSession(spark, publisher, registry)
    verdicts = work.recheck(feed, letters)
    if dry_run:
        return RedriveOutcome(feed.name, None, None, None, 0, verdicts)
    taken = tuple(sorted(v.letter.key_of for v in verdicts if v.passes))
    failing = tuple((v.letter.key_of, v.reason_codes) for v in verdicts if not v.passes)
    now = datetime.now(UTC)
    redrive_id = redrive_id_of(feed.name, taken)
    run_id = f"{now.strftime('%Y%m%dT%H%M%S%fZ')}-{redrive_id[len(REDRIVE_PREFIX) :][:8]}"
    run_dir = run_dir_for(feed.name, run_id, root)
    record = RedriveRecord(redrive_id, run_id, feed.name, taken, failing)
    run_dir.mkdir()
    write_status(run_dir, planned_at=now.isoformat(), handle=_handle(record, run_dir).to_xcom())
    # The record and the row in one transaction of the run ledger, before anything is staged: what this re-drive
    # takes is known from the ledger alone (its run dir may be pruned). The run dir's copy is for people.
    store.plan_redrive(feed.group, run_id, feed=redrive_ledger_feed(feed.name), plan_id=redrive_id,
                       run_dir=str(run_dir), record=record.to_json())  # fmt: skip
    (run_dir / REDRIVE_FILE).write_text(record.to_json())
    plan = redrive_plan(record, feed, now.isoformat())
    progress(f"re-drive {run_id}: {len(taken)} of {len(letters)} dead letters pass the feed's rules now")
    if taken:
        extra = {"redrive": {"run_id": run_id, "records": len(taken)}}
        try:
            work.stage(feed, [v.letter for v in verdicts if v.passes], plan, run_id=run_id, extra=extra,
                       log=run_dir / "spark-submit.log")  # fmt: skip
        except RedriveJobError as exc:  # as a crash after staging: the row stays planned, the next re-drive settles
            write_status(run_dir, failed_at=datetime.now(UTC).isoformat(), error=f"re-drive {run_id}: {exc}")
            raise
        except Exception as exc:  # nothing shown: given up, its report says why (a crash leaves it to settle)
            with store.commit_lock(feed.group):
                store.set_run(feed.group, run_id, feed=redrive_ledger_feed(feed.name), plan_id=redrive_id,
                              state="abandoned", run_dir=str(run_dir), detail=str(exc)[:1000])  # fmt: skip
                publisher.discard(redrive_id, run_id)
            write_status(run_dir, failed_at=datetime.now(UTC).isoformat(), error=f"re-drive {run_id}: {exc}")
            raise
        fault_point("redrive.after_stage")  # staged pending, not shown, not recorded
    with store.commit_lock(feed.group):
        settled = settle_redrive(record, str(run_dir), feed, publisher=publisher, store=store)
    path = _report(record, run_dir, feed, plan, settled)
    published = 0 if settled.manifest is None or settled.manifest.reused else settled.manifest.records
    error = settled.events[-1].message if settled.state == "abandoned" and settled.events else None
    return RedriveOutcome(feed.name, run_id, redrive_id, settled.state, published, verdicts, str(path),
                          settled_first, error)  # fmt: skip


def settle_redrive(
    record: RedriveRecord, run_dir: str, feed: Feed, *, publisher: Publisher, store: CheckpointStore
) -> Settled:
    """Show re-drive ``record``'s staged publication, once, then record it ``shown``. Call with the group's commit
    lock held.

    Given up (``abandoned``, its pending publication discarded) when a shown re-drive took
    one of its dead letters already, or when it staged nothing and the output does not
    show it. A row already ``shown`` or ``abandoned`` stays so.
    """
    row = store.run(feed.group, record.run_id)
    state: RunState = row.state if row is not None else "planned"

    def mark(new: RunState, detail: str | None = None) -> None:
        store.set_run(feed.group, record.run_id, feed=redrive_ledger_feed(feed.name), plan_id=record.redrive_id,
                      state=new, run_dir=run_dir, detail=detail)  # fmt: skip

    if state == "abandoned":
        publisher.discard(record.redrive_id, record.run_id)
        return Settled(record.run_id, record.redrive_id, state)
    if state == "shown":
        return Settled(record.run_id, record.redrive_id, state)
    manifest: Manifest | None = None
    if record.taken:
        already = publisher.published(record.redrive_id)
        staged = publisher.staged(record.redrive_id, record.run_id)
        if already is None:
            others = redriven(feed, store, publisher).taken
            clash = sorted(k for k in record.taken if others.get(k, record.run_id) != record.run_id)
            why = None
            if clash:
                p, t, n, o = clash[0]
                why = (f"re-drive {record.run_id}: {len(clash)} of its dead letters (the first {t}[{n}] offset {o} "
                       f"of plan {p}) were published by re-drive {others[clash[0]]} meanwhile; it was given up so "
                       "that none is published twice. Run `tidemark redrive` again for the rest")  # fmt: skip
            elif staged is None:
                why = f"re-drive {record.run_id} staged nothing and its publication is not shown; given up"
            if why is not None:
                mark("abandoned", why[:1000])  # first: a crash before the discard leaves it owed, not lost
                publisher.discard(record.redrive_id, record.run_id)
                event = Event("not_shown", why, details={"redrive_id": record.redrive_id})
                return Settled(record.run_id, record.redrive_id, "abandoned", events=(event,))
        manifest = publisher.promote(record.redrive_id, record.run_id) if staged is not None else already
    fault_point("redrive.before_record")  # shown, and the ledger not yet told
    mark("shown")
    return Settled(record.run_id, record.redrive_id, "shown", manifest=manifest)


def settle_open_redrives(
    feed: Feed, publisher: Publisher, store: CheckpointStore, *, progress: Progress = silent
) -> tuple[str, ...]:
    """Before choosing: every open re-drive of ``feed`` shown (its publication shown or staged) or given up, with
    its report written; their run ids.

    A re-drive still staging in another process now is given up too; it then finds its row
    ``abandoned`` and discards what it staged (never shown twice, never half shown).
    """
    done = []
    with store.commit_lock(feed.group):
        adopt_folder_records(feed, store)
        kept = store.redrive_records(feed.group, redrive_ledger_feed(feed.name))
        for row in store.open_runs(redrive_ledger_feed(feed.name)):
            record = read_redrive(row, kept)
            if record is None:
                store.set_run(row.group, row.run_id, feed=row.feed, plan_id=row.plan_id, state="abandoned",
                              run_dir=row.run_dir, detail="its record (redrive.json) is gone")  # fmt: skip
                continue
            progress(f"settling re-drive {row.run_id} ({row.state}) first")
            settled = settle_redrive(record, row.run_dir, feed, publisher=publisher, store=store)
            plan = redrive_plan(record, feed, datetime.now(UTC).isoformat())
            _report(record, Location.of(row.run_dir), feed, plan, settled)
            done.append(row.run_id)
    return tuple(done)


def adopt_folder_records(feed: Feed, store: CheckpointStore) -> tuple[str, ...]:
    """Copy into the run ledger the record of every re-drive of ``feed`` recorded before the ledger kept them (only
    in its run dir's ``redrive.json``); their run ids. Call with the group's commit lock held.

    After this, pruning those run dirs changes nothing either. A record is never replaced:
    the ledger's is the one the re-drive staged by.
    """
    ledger_feed = redrive_ledger_feed(feed.name)
    rows = store.feed_runs(ledger_feed, ("shown", "planned", "committing", "committed"))
    kept = store.redrive_records(feed.group, ledger_feed) if rows else {}
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


def _handle(record: RedriveRecord, run_dir: Location) -> RunHandle:
    return RunHandle(run_id=record.run_id, feed=record.feed, plan_id=record.redrive_id, plan_path="",
                     run_dir=str(run_dir), mode=REDRIVE_MODE, commit=False, records=len(record.taken))  # fmt: skip


def _report(record: RedriveRecord, run_dir: Location, feed: Feed, plan: Plan, settled: Settled) -> Path | Location:
    """The re-drive's report and ``run.json``, as :func:`record_end` writes any run's (events: what it took)."""
    shown = settled.manifest
    published = 0 if shown is None or shown.reused else shown.records
    message = (f"re-drive {record.run_id}: {len(record.taken)} dead letters pass the feed's rules now "
               f"({published} published into {feed.name}'s output as {record.redrive_id}"
               f"{', already shown' if shown is not None and shown.reused else ''}); {len(record.failing)} still fail "
               "and keep their new reasons")  # fmt: skip
    event = {"kind": "redrive", "message": message,
             "details": {"redrive_id": record.redrive_id, "taken": len(record.taken), "published": published,
                         "still_failing": len(record.failing),
                         "reasons_now": sorted({c for _, codes in record.failing for c in codes})}}  # fmt: skip
    job = JobResult(
        record.redrive_id, feed.name, published=shown is not None, reused=bool(shown is not None and shown.reused),
        manifest=shown.to_dict() if shown is not None else None,
        records_read=len(record.taken) + len(record.failing),  # every dead letter re-checked: it passes or fails
        records_published=published, records_quarantined=len(record.failing), events=[event],
    )  # fmt: skip
    return record_end(_handle(record, run_dir), plan, job, settled=settled).report_path
