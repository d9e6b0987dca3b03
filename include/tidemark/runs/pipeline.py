"""One run end to end: plan, read/validate/publish (the Spark job), commit, report.

The same three steps serve the CLI (``tidemark run``) and the DAGs (one task each). Each
step loads what it works on once, as a :class:`Run` (the handle, the feed and the plan;
in the plan step also the request), and hands that value down:

1. :func:`plan_run` turns the trigger parameters into one
   :class:`~tidemark.planning.requests.RunRequest`, first finishes every open run of the
   feed (the design's "finish that commit before planning anything new"), then plans,
   saves the plan into the new run's dir (``runs/<feed>/<run_id>/plan.json``: each run
   keeps its own copy, with the offsets it started from and its events) and returns a
   :class:`RunHandle` (small, secret-free: it travels through XCom).
2. The Spark job (``spark_jobs/tidemark_job.py``) reads exactly the plan's ranges,
   validates, publishes and writes ``job.json`` into the run dir. :func:`run_job`
   submits it with ``spark-submit`` for the CLI; the DAGs use the Spark provider. A plan
   with no records needs no Spark: :func:`run_empty` writes its ``job.json``.
3. :func:`commit_run` settles the run (:func:`tidemark.runs.protocol.settle`: the group's
   commit, then the publication shown) and writes the run report. Nothing before it
   moves the group's offsets.

:func:`run_feed` does the three in one process and loads the feed and the plan once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tidemark.checkpoints.store import CheckpointStore, open_store
from tidemark.config.models import Feed, load_feed, load_feeds, package_root, state_location
from tidemark.errors import (
    ConfigError,
    OffsetsMovedError,
    TidemarkError,
    ValidationFailedError,
)
from tidemark.faults import fault_point
from tidemark.job.result import JobResult, read_result, run_without_spark, write_result
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import RegistryClient, RegistryConnection, require
from tidemark.kafka.registry import from_env as registry_from_env
from tidemark.output import publisher_for
from tidemark.output.base import check_replay_output
from tidemark.planning.plan import PLAN_FILE, Event, Plan, read_plan, write_plan
from tidemark.planning.requests import RunRequest, confine_output, output_roots, run_request
from tidemark.runs.commit import CommitResult
from tidemark.runs.gather import plan_feed
from tidemark.runs.protocol import Settled, abandon, settle, settle_before_planning
from tidemark.runs.report import Root, build_report, save_report
from tidemark.spark.secrets import SECRETS_FILE_ENV, secrets_file, split_env
from tidemark.spark.session import (
    SUBMIT_CONF,
    avro_conf,
    driver_class_archive,
    merge_conf,
    openlineage_conf,
    s3a_jars,
    small_run_conf,
)
from tidemark.spark.wire import planned_readers
from tidemark.storage import Location

Progress = Callable[[str], None]
JobRunner = Callable[["RunHandle", KafkaConnection], dict[str, Any]]


def _silent(_: str) -> None:
    """Progress sink that drops messages."""


@dataclass(frozen=True)
class RunHandle:
    """What the steps of one run pass to each other (and through XCom): no secrets."""

    run_id: str
    feed: str
    plan_id: str
    plan_path: str
    run_dir: str
    mode: str
    commit: bool
    records: int
    resumed: str | None = None  # plan id of an earlier run of the feed this run committed or showed first
    dry_run: bool = False  # plan only: nothing is read, published or committed

    def to_xcom(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_xcom(cls, doc: Mapping[str, Any]) -> RunHandle:
        return cls(**doc)

    def plan(self) -> Plan:
        return read_plan(self.plan_path)


@dataclass(frozen=True)
class Run:
    """One run as a step works on it: loaded once per process, then passed down.

    ``request`` is there only in the process that planned the run; the later steps act on
    what the plan recorded of it (mode, commit, window, output).
    """

    handle: RunHandle
    feed: Feed
    plan: Plan
    request: RunRequest | None = None

    @classmethod
    def load(cls, handle: RunHandle) -> Run:
        """The run ``handle`` names, as a later step (another process) finds it: its feed and its saved plan."""
        return cls(handle, load_feed(handle.feed), handle.plan())

    @property
    def dir(self) -> Location:
        return Location.of(self.handle.run_dir)


def _root(root: Root | None) -> Location:
    return Location.of(root) if root is not None else state_location()


def _checkpoints(root: Root | None, given: CheckpointStore | None = None) -> CheckpointStore:
    """``given``, else the store ``TIDEMARK_CHECKPOINT_URL`` names, else SQLite under ``root``."""
    return given if given is not None else open_store(root=_root(root))


def runs_dir(feed: str, root: Root | None = None) -> Location:
    return _root(root) / "runs" / feed


def _run_status(run_dir: Location) -> dict[str, Any]:
    path = run_dir / "run.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _write_status(run_dir: Location, **fields: Any) -> None:
    doc = {**_run_status(run_dir), **fields}
    (run_dir / "run.json").write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))


def abandon_run(
    feed_name: str, run_id: str, reason: str, *, root: Root | None = None, checkpoints: CheckpointStore | None = None
) -> Settled:
    """Give up a run that cannot be finished (``tidemark abandon``): see :func:`tidemark.runs.protocol.abandon`.

    Its event goes into its own report, so the view and ``tidemark runs`` name the ranges it leaves out.
    """
    feed = load_feed(feed_name)
    run_dir = runs_dir(feed.name, root) / run_id
    if not (run_dir / PLAN_FILE).exists():
        raise ConfigError(
            f"feed '{feed.name}' has no run {run_id} (no {run_dir / PLAN_FILE}); see `tidemark runs {feed.name}`"
        )
    plan = read_plan(run_dir / PLAN_FILE)
    checkpoints = _checkpoints(root, checkpoints)
    with checkpoints.commit_lock(plan.group):
        settled = abandon(plan, run_id, str(run_dir), publisher=publisher_for(feed, plan), store=checkpoints,
                          reason=reason)  # fmt: skip
    _write_status(run_dir, abandoned=settled.events[0].message)
    return settled


# -- step 1: plan ------------------------------------------------------------------------


def publish_target(feed: Feed, request: RunRequest) -> Location | None:
    """Where a run of ``request`` publishes, checked against the feeds' outputs (``None``: the feed's own output).

    A scheduled run, and a backfill or replay that commits (it moves the feed's group, so it
    is the feed's next run: ``docs/ARCHITECTURE.md``, "The feed's output"), publish into the
    feed's own output; a committing one names no other. Any other backfill or replay
    publishes beside the feed's output (``feed.output_for``) or where its ``output``
    parameter says, never into a feed's output, and only under the allowed places
    (compared as text, then again with symlinks followed, against every feed).
    """
    if request.mode == "scheduled":
        return None
    if request.commit and not request.dry_run:  # a dry run commits nothing: it publishes where asked
        if request.output is not None:
            raise ConfigError(
                f"parameter 'output': a committing {request.mode} of feed '{feed.name}' publishes to the feed's own "
                f"output ({feed.output_location()}), because it moves the group past these records; leave 'output' "
                "empty, or run without commit to publish elsewhere"
            )
        return None
    default = feed.output_for(request.mode)
    target = request.output if request.output is not None else default
    if target == feed.output_location():
        raise ConfigError(
            f"parameter 'output': {target} is feed '{feed.name}''s own output; a {request.mode} publishes elsewhere "
            f"(default {default}) so readers of the feed never see its records twice"
        )
    roots = output_roots([default])
    confine_output(target, roots)
    # Again with symlinks followed, here where the plan task (and so the writer) runs, against every feed.
    check_replay_output(target, {**load_feeds(), feed.name: feed}, roots)
    return target


def plan_request(feed: Feed, adapter: KafkaAdapter, checkpoints: CheckpointStore, request: RunRequest) -> Plan:
    """Plan one run of ``request``, without saving or reading anything; the plan's ``output`` says where it publishes.

    :func:`start_run` plans the same way (after settling the feed's open runs); the
    Tidemark view's replay preview shows this, so a preview is exactly the plan a dry run
    of the same parameters makes.
    """
    target = publish_target(feed, request)
    plan = plan_feed(feed, adapter, checkpoints, request)
    return plan if target is None else replace(plan, output=str(target))


def plan_run(
    feed_name: str,
    connection: KafkaConnection,
    *,
    mode: str = "scheduled",
    params: Mapping[str, Any] | None = None,
    root: Root | None = None,
    progress: Progress = _silent,
    checkpoints: CheckpointStore | None = None,
    registry: RegistryConnection | None = None,
) -> RunHandle:
    """Step 1: finish the feed's open runs, then plan and save this run's plan (see :func:`start_run`)."""
    request = run_request(mode, params)  # refused before anything is loaded or asked
    run = start_run(load_feed(feed_name), connection, request, root=root, progress=progress,
                    checkpoints=checkpoints, registry=registry)  # fmt: skip
    return run.handle


def start_run(
    feed: Feed,
    connection: KafkaConnection,
    request: RunRequest,
    *,
    root: Root | None = None,
    progress: Progress = _silent,
    checkpoints: CheckpointStore | None = None,
    registry: RegistryConnection | None = None,
) -> Run:
    """Step 1 on a loaded feed: settle the feed's open runs, plan ``request``, save the plan; the run as a value.

    A plan with records of a feed in a Schema Registry format that pins no reader version
    records the subject's latest version (``registry``, default the ``TIDEMARK_SCHEMA_REGISTRY_*``
    environment), so that every attempt of the plan decodes with the same reader.
    """
    target = publish_target(feed, request)  # a request refused here settles nothing
    checkpoints = _checkpoints(root, checkpoints)
    kafka = KafkaAdapter(connection)
    resumed, settled = (None, ()) if request.dry_run else settle_before_planning(feed, checkpoints, kafka, progress)
    plan = plan_feed(feed, kafka, checkpoints, request)  # as plan_request, with the open runs settled first
    handle = _handle(feed, plan, request, _root(root), resumed)  # names the plan id: what follows keeps it
    # In this run's report: what finishing the earlier runs found (not part of the plan id), and where it publishes.
    plan = replace(plan, events=(*settled, *plan.events), output=None if target is None else str(target))
    if plan.total_records and not request.dry_run and feed.deserialization.registry_parts:
        # The latest version of each registry subject the feed does not pin, asked now.
        schemas = RegistryClient(require(registry if registry is not None else registry_from_env(), feed.name))
        plan = replace(plan, readers=planned_readers(feed, schemas))
    run = _save(Run(handle, feed, plan, request), checkpoints)
    _log_plan(run, progress)
    return run


def _handle(feed: Feed, plan: Plan, request: RunRequest, root: Location, resumed: str | None) -> RunHandle:
    run_id = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}-{plan.plan_id[:8]}"
    run_dir = runs_dir(feed.name, root) / run_id
    return RunHandle(
        run_id=run_id,
        feed=feed.name,
        plan_id=plan.plan_id,
        plan_path=str(run_dir / PLAN_FILE),
        run_dir=str(run_dir),
        mode=request.mode,
        commit=plan.commit,
        records=plan.total_records,
        resumed=resumed,
        dry_run=request.dry_run,
    )


def _save(run: Run, checkpoints: CheckpointStore) -> Run:
    """Save the plan into the run dir, the run into the ledger (``planned``; not a dry run), the handle to run.json."""
    handle, plan = run.handle, run.plan
    write_plan(plan, Location.of(handle.plan_path))
    if not handle.dry_run:
        checkpoints.set_run(plan.group, handle.run_id, feed=handle.feed, plan_id=plan.plan_id, state="planned",
                            run_dir=handle.run_dir)  # fmt: skip
    status = {"handle": handle.to_xcom(), "planned_at": datetime.now(UTC).isoformat()}  # a new run dir's first
    (run.dir / "run.json").write_text(json.dumps(status, indent=2, sort_keys=True, default=str))
    return run


def _log_plan(run: Run, progress: Progress) -> None:
    plan = run.plan
    progress(
        f"planned {plan.plan_id}: {plan.total_records} records in {sum(1 for p in plan.partitions if p.records)} of "
        f"{len(plan.partitions)} partitions, {len(plan.tasks)} Spark tasks, {len(plan.events)} events"
    )
    for event in plan.events:
        progress(f"event {event.kind}: {event.message}")
    if run.handle.dry_run:
        progress(f"dry run: nothing is read, published or committed. The plan ({plan.total_records} records):")
        for line in plan_table(plan):
            progress(line)


def plan_table(plan: Plan) -> list[str]:
    """The plan's ranges as aligned text lines (a dry run's task log)."""
    rows = [("partition", "committed", "start", "end", "records", "reason")]
    rows += [(f"{p.topic}[{p.partition}]", "-" if p.committed is None else str(p.committed), str(p.start),
              str(p.end), str(p.records), p.reason) for p in plan.partitions]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


# -- step 2: the job ---------------------------------------------------------------------


def decodes_avro(feed: str) -> bool:
    """Whether ``feed``'s job needs ``from_avro``; a feed that does not load is the job's to report."""
    try:
        return load_feed(feed).deserialization.decodes_avro
    except ConfigError:
        return False


def spark_submit_command(
    handle: RunHandle, master: str | None = None, *, class_archive: str = "", avro: bool = False
) -> list[str]:
    """The ``spark-submit`` command of a run, for ``local[*]`` or any cluster master.

    A small run's driver gets the JVM options of :func:`~tidemark.spark.session.small_run_conf`
    (with ``class_archive``, from :func:`~tidemark.spark.session.driver_class_archive`).

    On a cluster (``spark://``, ``yarn``, ``k8s://``) the job zips the ``tidemark`` package
    and ships it to the executors itself (:func:`tidemark.job.entry.should_ship`); the connections reach
    the driver in a private file (:mod:`tidemark.spark.secrets`, never an argument here), Kafka settings
    travel inside the read's tasks, never as Spark configuration, and
    :data:`~tidemark.spark.session.SUBMIT_CONF` widens Spark's redaction to Tidemark's secret names.
    ``avro``: the feed decodes Avro (``from_avro``'s package is added).
    """
    job = os.environ.get("TIDEMARK_SPARK_JOB", str(package_root().parent / "spark_jobs" / "tidemark_job.py"))
    spark_submit = str(Path(sys.executable).with_name("spark-submit"))
    conf = {"spark.ui.enabled": "false", "spark.pyspark.python": sys.executable, **SUBMIT_CONF}
    conf.update(small_run_conf(handle.records, class_archive=class_archive))
    jars = s3a_jars()
    extra = merge_conf(avro_conf() if avro else {}, openlineage_conf())
    jars += [jar for jar in extra.pop("spark.jars", "").split(",") if jar]  # --jars would replace them otherwise
    conf.update(extra)
    return [
        spark_submit,
        "--master",
        master or os.environ.get("TIDEMARK_SPARK_MASTER", "local[*]"),
        "--name",
        f"tidemark-{handle.feed}",
        *(["--jars", ",".join(jars)] if jars else []),
        *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
        job,
        "--plan",
        handle.plan_path,
        "--run-dir",
        handle.run_dir,
    ]


def run_job(
    handle: RunHandle, connection: KafkaConnection, *, master: str | None = None, progress: Progress = _silent
) -> dict[str, Any]:
    """Step 2 for the CLI: submit the Spark job.

    The connections (Kafka's, the registry's, the object store's and the Iceberg catalog's variables) reach
    the driver through a private file (:mod:`tidemark.spark.secrets`): spark-submit's command line and
    environment hold only its path.
    """
    return _submit(Run.load(handle), connection, master=master, progress=progress)


def _submit(run: Run, connection: KafkaConnection, *, master: str | None, progress: Progress) -> dict[str, Any]:
    handle = run.handle
    env, connections = split_env({**os.environ, **connection.to_env(), "PYSPARK_PYTHON": sys.executable})
    started = time.monotonic()
    with driver_class_archive() as class_archive, secrets_file(connections) as path:
        if path:
            env[SECRETS_FILE_ENV] = path
        cmd = spark_submit_command(handle, master, class_archive=class_archive.option,
                                   avro=run.feed.deserialization.decodes_avro)  # fmt: skip
        if cmd[2].startswith("local"):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # keep a local job on loopback
        progress(f"reading {handle.records} records with Spark ({cmd[2]})")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        class_archive.succeeded = proc.returncode == 0
    log = run.dir / "spark-submit.log"
    log.write_text(proc.stdout + proc.stderr)
    job = read_result(run.dir)
    if proc.returncode != 0:
        reason = (job.error if job is not None else None) or _last_error_line(proc.stderr)
        _fail(run, connection, job, reason)
        raise TidemarkError(
            f"the Spark job for plan {handle.plan_id} failed (exit {proc.returncode}): {reason}\n"
            f"full log: {log}. Offsets were not committed; rerun to retry the same plan."
        )
    if job is None:
        raise TidemarkError(f"the Spark job exited 0 but wrote no {handle.run_dir}/job.json; see {log}")
    progress(f"read, validated and published in {time.monotonic() - started:.1f}s")
    return job.to_dict()


def run_empty(handle: RunHandle, connection: KafkaConnection, *, progress: Progress = _silent) -> dict[str, Any]:
    """Step 2 for a plan with no records: no Spark application; ``job.json`` says so.

    Raises :class:`~tidemark.errors.ValidationFailedError` (after recording the failed
    run) when the feed expects records. The DAGs call this instead of submitting Spark.
    """
    return _run_empty(Run.load(handle), connection, progress)


def _run_empty(run: Run, connection: KafkaConnection, progress: Progress) -> dict[str, Any]:
    result = run_without_spark(run.plan, run.feed)
    write_result(run.handle.run_dir, result)
    if result.error is not None:
        _fail(run, connection, result, result.error)
        raise ValidationFailedError(result.error)
    progress(f"nothing to read in plan {run.plan.plan_id}: no Spark application started")
    return result.to_dict()


def _fail(run: Run, connection: KafkaConnection, job: JobResult | None, reason: str) -> None:
    """Record a failed run (status and report) so that ``tidemark runs`` shows why."""
    _write_status(run.dir, failed_at=datetime.now(UTC).isoformat(), error=reason)
    report = build_report(handle=run.handle, plan=run.plan, job=job, error=reason, connection=connection)
    save_report(report, run.dir, connection=connection)


def _last_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "Error" in ln or "error" in ln]
    return lines[-1].strip() if lines else "see the log"


# -- step 3: commit and report -----------------------------------------------------------


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


def commit_run(
    handle: RunHandle,
    connection: KafkaConnection,
    *,
    root: Root | None = None,
    progress: Progress = _silent,
    checkpoints: CheckpointStore | None = None,
) -> CommitOutcome:
    """Step 3: commit the group at the plan's ends (when the run commits), then show the publication; report.

    :func:`tidemark.runs.protocol.settle` under the group's commit lock: the staged
    publication becomes visible only after the group's commit succeeded; a refused run's
    publication is discarded, never having been visible.
    """
    return _commit(Run.load(handle), connection, progress=progress, checkpoints=_checkpoints(root, checkpoints))


def _commit(
    run: Run, connection: KafkaConnection, *, progress: Progress, checkpoints: CheckpointStore
) -> CommitOutcome:
    handle, plan = run.handle, run.plan
    job = read_result(run.dir)
    _log_job(job, progress)  # a dry run's job did nothing: nothing to log
    if handle.dry_run:
        return _finish(run, connection, None, job, "dry run: planned only, nothing read, published or committed",
                       progress)  # fmt: skip
    if handle.commit:
        fault_point("commit.before")
    publisher = publisher_for(run.feed, plan)
    try:
        with checkpoints.commit_lock(plan.group):
            settled = settle(
                plan, handle.run_id, handle.run_dir, publisher=publisher, store=checkpoints,
                kafka=KafkaAdapter(connection), connection=connection, progress=progress,
            )  # fmt: skip
    except TidemarkError as exc:
        _refused(run, connection, job, exc)
        raise
    job = _with_settled(job, plan, settled)
    for event in settled.events:
        progress(f"event {event.kind}: {event.message}")
    if settled.state == "abandoned":
        reason = settled.events[-1].message if settled.events else f"run {handle.run_id} was abandoned"
        _write_status(run.dir, abandoned=reason)
        _fail(run, connection, job, reason)
        raise TidemarkError(reason)
    if handle.commit and settled.commit is not None:
        progress(f"committed group '{plan.group}' at the plan's ends ({len(plan.partitions)} partitions)")
        for note in settled.commit.notes:
            progress(f"commit: {note}")
    if settled.manifest is not None:
        progress(f"shown in {publisher.describe()}: plan {plan.plan_id}")
    skipped = None if handle.commit else f"mode {handle.mode} does not commit unless asked"
    return _finish(run, connection, settled.commit, job, skipped, progress)


def _log_job(job: JobResult | None, progress: Progress) -> None:
    """The job's exact-window counts and events, into the commit step's log."""
    for w in job.window if job is not None else []:
        progress(
            f"window {w['topic']}[{w['partition']}]: read {w['read']} ({w['read_in_margin']} in the end margin), "
            f"kept {w['kept']} ({w['kept_in_margin']} from the margin), dropped {w['dropped']} stamped outside, "
            f"largest skew {w['largest_skew_ms']} ms"
        )
    for e in job.events if job is not None else []:
        progress(f"event {e.get('kind')}: {e.get('message')}")


def _refused(run: Run, connection: KafkaConnection, job: JobResult | None, exc: TidemarkError) -> None:
    """Record a run whose settling raised; one another writer's move refused is abandoned, with an event."""
    message = str(exc)
    events = list(job.events) if job is not None else []
    if isinstance(exc, OffsetsMovedError):  # retrying can never succeed: discarded, never shown
        _write_status(run.dir, abandoned=message)
        refused = Event("commit_refused", f"run {run.handle.run_id} was refused; its staged plan was discarded: "
                        f"{message}", details={"plan_id": run.plan.plan_id})  # fmt: skip
        events.append(refused.reported("commit"))
    _fail(run, connection, _with_events(job, run.plan, events), f"commit refused: {message}")


def _with_settled(job: JobResult | None, plan: Plan, settled: Settled) -> JobResult:
    """The job's result with settling's events after its own, and the snapshot its promotion committed."""
    snapshot = settled.manifest.extra.get("snapshot_id") if settled.manifest is not None else None
    job_events = [_with_snapshot(e, snapshot) for e in (job.events if job is not None else [])]
    return _with_events(job, plan, [*job_events, *(e.reported("commit") for e in settled.events)])


def _with_events(job: JobResult | None, plan: Plan, events: list[dict[str, Any]]) -> JobResult:
    """``job`` with ``events`` in place of its own (a job that wrote no result: only the events)."""
    return replace(job, events=events) if job is not None else JobResult(plan.plan_id, plan.feed, events=events)


def _with_snapshot(event: dict[str, Any], snapshot: Any) -> dict[str, Any]:
    """A job's ``table_schema_evolved`` event with the snapshot its promotion committed (the job staged it pending).

    The job's events are its ``job.json`` documents, kept as written (some carry no topic).
    """
    if event.get("kind") != "table_schema_evolved" or snapshot is None or event["details"].get("snapshot_id"):
        return event
    table, changes = event["details"].get("table"), list(event["details"].get("changes") or [])
    return {**event, "details": {**event["details"], "snapshot_id": snapshot},
            "message": f"Iceberg table {table}: {'; '.join(changes)}, in snapshot {snapshot}, the one adding these "
            "records"}  # fmt: skip


def _finish(
    run: Run,
    connection: KafkaConnection,
    result: CommitResult | None,
    job: JobResult | None,
    skipped: str | None,
    progress: Progress,
) -> CommitOutcome:
    """Record the run as finished and write its report."""
    if skipped is not None:
        progress(f"not committing: {skipped}")
    handle, plan = run.handle, run.plan
    _write_status(run.dir, committed=result is not None, finished_at=datetime.now(UTC).isoformat())
    report = build_report(
        handle=handle, plan=plan, job=job, commit=result, skipped_reason=skipped, connection=connection
    )
    path = save_report(report, run.dir, connection=connection)
    offsets = {f"{t}[{p}]": end for (t, p), end in plan.ends().items()} if result is not None else {}
    return CommitOutcome(handle.run_id, plan.plan_id, result is not None, skipped, offsets, str(path))


def run_feed(
    feed_name: str,
    connection: KafkaConnection,
    *,
    mode: str = "scheduled",
    params: Mapping[str, Any] | None = None,
    root: Root | None = None,
    master: str | None = None,
    progress: Progress = _silent,
    job_runner: JobRunner | None = None,
    checkpoints: CheckpointStore | None = None,
) -> tuple[RunHandle, dict[str, Any], CommitOutcome]:
    """All three steps, as ``tidemark run`` does them, on one :class:`Run` loaded once.

    ``job_runner`` replaces ``spark-submit`` (tests run the job in their own session).
    """
    request = run_request(mode, params)
    checkpoints = _checkpoints(root, checkpoints)
    run = start_run(load_feed(feed_name), connection, request, root=root, progress=progress, checkpoints=checkpoints)
    if request.dry_run:
        job: dict[str, Any] = {}
    elif run.plan.total_records == 0:
        job = _run_empty(run, connection, progress)
    elif job_runner is None:
        job = _submit(run, connection, master=master, progress=progress)
    else:
        job = job_runner(run.handle, connection)
    return run.handle, job, _commit(run, connection, progress=progress, checkpoints=checkpoints)
