"""One run end to end: plan, read/validate/publish (the Spark job), commit, report.

The same three steps serve the CLI (``tidemark run``) and the DAGs (one task each); each
is its own module, and acts on one :class:`~tidemark.runs.run.Run` (the handle, the feed
and the plan; in the plan step also the request), loaded once per process:

1. :func:`plan_run` (:mod:`tidemark.runs.start`): one
   :class:`~tidemark.planning.requests.RunRequest` from the trigger parameters; every open
   run of the feed finished first; the plan saved into the new run's dir; a
   :class:`~tidemark.runs.run.RunHandle` returned (small, secret-free: it travels through XCom).
2. :func:`run_job` / :func:`run_empty` (:mod:`tidemark.runs.submit`): the Spark job
   (``spark_jobs/tidemark_job.py``) reads exactly the plan's ranges, validates, stages the
   publication and writes ``job.json``; a plan with no records needs no Spark.
3. :func:`commit_run` (:mod:`tidemark.runs.finish`): the run is settled
   (:func:`tidemark.runs.protocol.settle`: the group's commit, then the publication shown)
   and reported. Nothing before it moves the group's offsets.

:func:`run_feed` does the three in one process on one :class:`~tidemark.runs.run.Run`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tidemark.checkpoints.store import CheckpointStore
from tidemark.config.models import load_feed
from tidemark.errors import ConfigError
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import RegistryConnection
from tidemark.output import publisher_for
from tidemark.planning.plan import PLAN_FILE, read_plan
from tidemark.planning.requests import run_request
from tidemark.runs.finish import CommitOutcome, finish_run
from tidemark.runs.protocol import Settled, abandon
from tidemark.runs.run import Progress, Root, Run, RunHandle, open_checkpoints, run_dir_for, silent, write_status
from tidemark.runs.start import plan_request, publish_target, start_run
from tidemark.runs.submit import decodes_avro, spark_submit_command, submit
from tidemark.runs.submit import run_empty as empty_job

__all__ = [
    "CommitOutcome", "Run", "RunHandle", "abandon_run", "commit_run", "decodes_avro", "plan_request", "plan_run",
    "publish_target", "run_empty", "run_feed", "run_job", "spark_submit_command", "start_run",
]  # fmt: skip

JobRunner = Callable[[RunHandle, KafkaConnection], dict[str, Any]]


def plan_run(
    feed_name: str,
    connection: KafkaConnection,
    *,
    mode: str = "scheduled",
    params: Mapping[str, Any] | None = None,
    root: Root | None = None,
    progress: Progress = silent,
    checkpoints: CheckpointStore | None = None,
    registry: RegistryConnection | None = None,
) -> RunHandle:
    """Step 1: finish the feed's open runs, then plan and save this run's plan (:func:`.start.start_run`)."""
    request = run_request(mode, params)  # refused before anything is loaded or asked
    run = start_run(load_feed(feed_name), connection, request, root=root, progress=progress,
                    checkpoints=checkpoints, registry=registry)  # fmt: skip
    return run.handle


def run_job(
    handle: RunHandle, connection: KafkaConnection, *, master: str | None = None, progress: Progress = silent
) -> dict[str, Any]:
    """Step 2 for the CLI: submit the Spark job (:func:`~tidemark.runs.submit.submit`)."""
    return submit(Run.load(handle), connection, master=master, progress=progress)


def run_empty(handle: RunHandle, connection: KafkaConnection, *, progress: Progress = silent) -> dict[str, Any]:
    """Step 2 for a plan with no records (:func:`~tidemark.runs.submit.run_empty`): no Spark application."""
    return empty_job(Run.load(handle), connection, progress)


def commit_run(
    handle: RunHandle,
    connection: KafkaConnection,
    *,
    root: Root | None = None,
    progress: Progress = silent,
    checkpoints: CheckpointStore | None = None,
) -> CommitOutcome:
    """Step 3: settle the run and report it (:func:`~tidemark.runs.finish.finish_run`)."""
    return finish_run(Run.load(handle), connection, checkpoints=open_checkpoints(root, checkpoints), progress=progress)


def run_feed(
    feed_name: str,
    connection: KafkaConnection,
    *,
    mode: str = "scheduled",
    params: Mapping[str, Any] | None = None,
    root: Root | None = None,
    master: str | None = None,
    progress: Progress = silent,
    job_runner: JobRunner | None = None,
    checkpoints: CheckpointStore | None = None,
) -> tuple[RunHandle, dict[str, Any], CommitOutcome]:
    """All three steps, as ``tidemark run`` does them, on one :class:`~tidemark.runs.run.Run` loaded once.

    ``job_runner`` replaces ``spark-submit`` (tests run the job in their own session).
    """
    request = run_request(mode, params)
    checkpoints = open_checkpoints(root, checkpoints)
    run = start_run(load_feed(feed_name), connection, request, root=root, progress=progress, checkpoints=checkpoints)
    if request.dry_run:
        job: dict[str, Any] = {}
    elif run.plan.total_records == 0:
        job = empty_job(run, connection, progress)
    elif job_runner is None:
        job = submit(run, connection, master=master, progress=progress)
    else:
        job = job_runner(run.handle, connection)
    return run.handle, job, finish_run(run, connection, checkpoints=checkpoints, progress=progress)


def abandon_run(
    feed_name: str, run_id: str, reason: str, *, root: Root | None = None, checkpoints: CheckpointStore | None = None
) -> Settled:
    """Give up a run that cannot be finished (``tidemark abandon``): see :func:`tidemark.runs.protocol.abandon`.

    Its event goes into its own report, so the view and ``tidemark runs`` name the ranges it leaves out.
    """
    feed = load_feed(feed_name)
    run_dir = run_dir_for(feed.name, run_id, root)
    if not (run_dir / PLAN_FILE).exists():
        raise ConfigError(
            f"feed '{feed.name}' has no run {run_id} (no {run_dir / PLAN_FILE}); see `tidemark runs {feed.name}`"
        )
    plan = read_plan(run_dir / PLAN_FILE)
    checkpoints = open_checkpoints(root, checkpoints)
    with checkpoints.commit_lock(plan.group):
        settled = abandon(plan, run_id, str(run_dir), publisher=publisher_for(feed, plan), store=checkpoints,
                          reason=reason)  # fmt: skip
    # A run the output already shows stays shown: only what its promotion left undone was given up.
    write_status(run_dir, **{"abandoned" if settled.state == "abandoned" else "given_up": settled.events[0].message})
    return settled
