"""Step 3 of a run: settle it (the group's commit, then the publication shown) and report it.

:func:`finish_run` takes the group's commit lock and hands the run to
:func:`tidemark.runs.protocol.settle` (the commit protocol: nothing before it moves the
group's offsets, and the staged publication becomes visible only after the group's commit
succeeded; a refused run's publication is discarded, never having been visible), then
records how the run ended (:func:`tidemark.runs.report.record_end`: ``run.json`` and the
report, with the job's events followed by settling's).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tidemark.checkpoints.store import CheckpointStore
from tidemark.errors import TidemarkError
from tidemark.faults import fault_point
from tidemark.job.result import read_result
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.output import publisher_for
from tidemark.runs.protocol import Settled, settle
from tidemark.runs.report import record_end
from tidemark.runs.run import Progress, Run, silent


@dataclass(frozen=True)
class CommitOutcome:
    run_id: str
    plan_id: str
    committed: bool
    skipped_reason: str | None
    offsets: dict[str, int]
    report_path: str

    def to_xcom(self) -> dict[str, Any]:
        return asdict(self)


def finish_run(
    run: Run, connection: KafkaConnection | None, *, checkpoints: CheckpointStore, progress: Progress = silent
) -> CommitOutcome:
    """Step 3: commit the group at the plan's ends (when the run commits), then show the publication; report.

    :func:`tidemark.runs.protocol.settle` under the group's commit lock; a dry run's job did
    nothing: it is only reported. Raises what refused the run, or why settling abandoned
    it, once both are recorded. ``connection``: ``None`` for a run that commits no group (a re-drive).
    """
    handle, plan = run.handle, run.plan
    job = read_result(run.dir)
    for line in job.log_lines() if job is not None else []:
        progress(line)
    settled: Settled | None = None
    refused: TidemarkError | None = None
    if not handle.dry_run:
        if handle.commit:
            fault_point("commit.before")
        publisher = publisher_for(run.feed, plan)
        try:
            with checkpoints.commit_lock(plan.group):
                settled = settle(
                    plan, handle.run_id, handle.run_dir, publisher=publisher, store=checkpoints,
                    kafka=KafkaAdapter(connection) if connection is not None else None, connection=connection,
                    progress=progress,
                )  # fmt: skip
        except TidemarkError as exc:
            refused = exc
        else:
            for event in settled.events:
                progress(f"event {event.kind}: {event.message}")
            if handle.commit and settled.commit is not None:
                progress(f"committed group '{plan.group}' at the plan's ends ({len(plan.partitions)} partitions)")
                for note in settled.commit.notes:
                    progress(f"commit: {note}")
            if settled.manifest is not None:
                progress(f"shown in {publisher.describe()}: plan {plan.plan_id}")
    ended = record_end(handle, plan, job, settled=settled, refused=refused, connection=connection)
    if refused is not None:
        raise refused
    if ended.error is not None:
        raise TidemarkError(ended.error)
    if ended.skipped is not None:
        progress(f"not committing: {ended.skipped}")
    offsets = {f"{t}[{p}]": offset for (t, p), offset in plan.ends().items()} if ended.commit is not None else {}
    return CommitOutcome(handle.run_id, plan.plan_id, ended.commit is not None, ended.skipped, offsets,
                         str(ended.report_path))  # fmt: skip
