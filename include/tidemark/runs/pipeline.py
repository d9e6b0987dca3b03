"""One run end to end: plan, read/validate/publish (the Spark job), commit, report.

The same three steps serve the CLI (``tidemark run``) and the DAGs (one task each):

1. :func:`plan_run` first finishes any run of the feed that published but did not
   commit (the design's "finish that commit before planning anything new"), then plans,
   saves the plan into the new run's dir (``runs/<feed>/<run_id>/plan.json``: each run
   keeps its own copy, with the offsets it started from and its events) and returns a
   :class:`RunHandle` (small, secret-free: it travels through XCom).
2. The Spark job (``spark_jobs/tidemark_job.py``) reads exactly the plan's ranges,
   validates, publishes and writes ``job.json`` into the run dir. :func:`run_job`
   submits it with ``spark-submit`` for the CLI; the DAGs use the Spark provider.
3. :func:`commit_run` commits the plan's ends (when the run commits) and writes the
   run report. Nothing before it moves the group's offsets.
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
from typing import TYPE_CHECKING, Any

from tidemark.checkpoints.store import CheckpointStore, open_store

if TYPE_CHECKING:
    from tidemark.runs.commit import CommitResult
from tidemark.config.durations import parse_skew, parse_timestamp
from tidemark.config.models import Feed, load_feed, load_feeds, package_root, state_location
from tidemark.errors import ConfigError, OffsetsMovedError, TidemarkError, shown
from tidemark.faults import fault_point
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import RegistryConnection
from tidemark.planning.plan import Mode, PartitionPlan, Plan, write_plan
from tidemark.planning.requests import (
    confine_output,
    flag,
    output_location,
    output_roots,
    parse_replay_params,
)
from tidemark.runs.report import PLAN_FILE
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
    resumed: str | None = None  # plan id of an earlier run whose commit this run finished
    dry_run: bool = False  # plan only: nothing is read, published or committed

    def to_xcom(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_xcom(cls, doc: Mapping[str, Any]) -> RunHandle:
        return cls(**doc)

    def plan(self) -> Plan:
        return Plan.from_json(Location.of(self.plan_path).read_text())


Root = Path | Location | str  # the state dir: a local folder or an object-store URL


def _root(root: Root | None) -> Location:
    return Location.of(root) if root is not None else state_location()


def _checkpoints(root: Root | None, given: CheckpointStore | None = None) -> CheckpointStore:
    """``given``, else the store ``TIDEMARK_CHECKPOINT_URL`` names, else SQLite under ``root``."""
    return given if given is not None else open_store(root=_root(root))


def runs_dir(feed: str, root: Root | None = None) -> Location:
    return _root(root) / "runs" / feed


def _job_result(run_dir: Location) -> dict[str, Any] | None:
    path = run_dir / "job.json"
    return json.loads(path.read_text()) if path.exists() else None


def _run_status(run_dir: Location) -> dict[str, Any]:
    path = run_dir / "run.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _write_status(run_dir: Location, **fields: Any) -> None:
    doc = {**_run_status(run_dir), **fields}
    (run_dir / "run.json").write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))


def _published(feed: Feed, handle: RunHandle, job: Mapping[str, Any] | None, *, by_this_run: bool = False) -> bool:
    """Whether ``handle``'s plan is published: by its job's word, or by the output itself.

    The output's own record (a Parquet folder's manifest, the plan id in an Iceberg
    table's snapshot history) is the publication's commit point; a job that crashed after
    publishing and before writing ``job.json`` has published all the same, and taking it
    for unpublished would let the next run plan a wider range and publish those records twice.

    ``by_this_run`` (``pending_commit``): a publication that records another run as its
    publisher (``run_id`` in a Parquet manifest's extra, an Iceberg snapshot's
    ``tidemark.run-id``) is that run's to commit. A run
    that failed before publishing shares its plan id with the run that later published
    the same ranges; it must not come back as "published, not committed".
    """
    if job is not None and job.get("published"):
        return True
    from tidemark.output.base import publisher_for

    found = publisher_for(feed, handle.plan()).published(handle.plan_id)
    if found is None:
        return False
    publisher_run = found.extra.get("run_id")
    return not (by_this_run and publisher_run and publisher_run != handle.run_id)


def _check_still_published(feed: Feed, handle: RunHandle, plan: Plan) -> None:
    """Refuse to commit a plan whose publication is gone (retracted by a refused run of the same plan).

    Checked under the group's commit lock, the lock a retraction holds too: a run that
    found the plan published and a run retracting it cannot interleave.
    """
    if plan.total_records == 0:
        return  # an empty plan publishes nothing
    from tidemark.output.base import publisher_for

    publisher = publisher_for(feed, plan)
    if publisher.published(plan.plan_id) is None:
        raise TidemarkError(
            f"run {handle.run_id} of feed '{feed.name}': plan {plan.plan_id} is no longer published in "
            f"{publisher.describe()} (a refused run of the same plan retracted it); nothing was committed. "
            "Run the feed again: it plans from the group's offsets as they are now"
        )


def retract_refused(
    feed: Feed, handle: RunHandle, plan: Plan, checkpoints: CheckpointStore, reason: str
) -> dict[str, Any] | None:
    """Take a refused run's publication out of the feed's output; the ``publication_retracted`` event, or ``None``.

    The feed's rule (``docs/ARCHITECTURE.md``, "The feed's output"): a publication stays in
    the output only while its plan can still be committed. A run whose commit is refused
    because another writer moved the group can never commit, and the next run plans from
    the group's new position, overlapping it: so its publication goes. Kept when the
    publication names another run as its publisher (that run decides), or when some run
    committed the same plan id (the records are the group's). Called under the group's
    commit lock.
    """
    if plan.total_records == 0:
        return None
    from tidemark.output.base import publisher_for

    publisher = publisher_for(feed, plan)
    found = publisher.published(plan.plan_id)
    if found is None:
        return None
    publisher_run = found.extra.get("run_id")
    if publisher_run and publisher_run != handle.run_id:
        return None
    if checkpoints.plan_committer(plan.group, plan.plan_id) is not None:
        return None
    publisher.retract(plan.plan_id, handle.run_id)
    ranges = ", ".join(f"{t}[{p}] [{s}, {e})" for t, p, s, e in plan.ranges() if e > s)
    return {
        "source": "commit",
        "kind": "publication_retracted",
        "message": f"plan {plan.plan_id} of run {handle.run_id} was retracted from {publisher.describe()} "
        f"({ranges}): its commit was refused, and the feed's next runs plan from the group's offsets as they are "
        "now, so keeping it would publish these offsets twice",
        "topic": None,
        "partition": None,
        "details": {"plan_id": plan.plan_id, "run_id": handle.run_id, "output": publisher.describe(),
                    "ranges": [{"topic": t, "partition": p, "start": s, "end": e} for t, p, s, e in plan.ranges()],
                    "reason": reason[:500]},
    }  # fmt: skip


def pending_commit(
    feed: Feed, root: Root | None = None, checkpoints: CheckpointStore | None = None
) -> RunHandle | None:
    """The newest run of ``feed`` that published, should commit, and has not committed.

    Runs whose commit was refused because another writer moved the group's offsets are
    ``abandoned`` and never retried (their plan was made from offsets that no longer hold).
    """
    base = runs_dir(feed.name, root)
    if not base.exists():
        return None
    checkpoints = _checkpoints(root, checkpoints)
    for run_dir in reversed(base.children(folders_only=True)):
        status = _run_status(run_dir)
        if not status or not status.get("handle") or status.get("abandoned"):
            continue
        handle = RunHandle.from_xcom(status["handle"])
        if status.get("committed") or not handle.commit:
            continue
        if _published(feed, handle, _job_result(run_dir), by_this_run=True) and not checkpoints.run_committed(
            feed.group, handle.run_id
        ):
            return handle
    return None


def selection_options(feed: Feed, mode: str, params: Mapping[str, Any]) -> tuple[dict[str, Any], Location | None, bool]:
    """A backfill's or replay's ``topics``, ``partitions``, ``output`` and ``dry_run`` parameters, checked.

    Returns the planner's selection options, where the run publishes (``None``: the feed's
    output, scheduled runs only) and whether it is a dry run.
    """
    options: dict[str, Any] = {}
    topics = params.get("topics")
    if topics not in (None, "", []):
        if isinstance(topics, str):
            topics = [t.strip() for t in topics.split(",") if t.strip()]
        if not isinstance(topics, list | tuple) or not all(isinstance(t, str) for t in topics):
            raise ConfigError(f"parameter 'topics': expected a list of topic names, got {shown(topics)}")
        options["topics"] = list(topics)
    partitions = params.get("partitions")
    if partitions not in (None, "", []):
        if isinstance(partitions, str):
            partitions = [p.strip() for p in partitions.split(",") if p.strip()]
        try:
            numbers = [int(p) for p in partitions]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"parameter 'partitions': expected partition numbers, got {shown(partitions)}") from exc
        if any(n < 0 for n in numbers) or any(isinstance(p, bool) for p in partitions):
            raise ConfigError(f"parameter 'partitions': partition numbers are 0 or more, got {shown(partitions)}")
        options["partitions"] = numbers
    dry_run = flag(params, "dry_run")
    if mode == "scheduled":
        return options, None, dry_run
    output = params.get("output")
    default = feed.output_for(mode)
    target = output_location(output) if output not in (None, "") else default
    if target == feed.output_location():
        raise ConfigError(
            f"parameter 'output': {target} is feed '{feed.name}''s own output; a {mode} publishes elsewhere "
            f"(default {feed.output_for(mode)}) so readers of the feed never see its records twice"
        )
    confine_output(target, [default])
    from tidemark.output.base import check_replay_output

    # Again with symlinks followed, here where the plan task (and so the writer) runs, against every feed.
    check_replay_output(target, {**load_feeds(), feed.name: feed}, output_roots([default]))
    return options, target, dry_run


def window_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """``window_mode`` and ``max_skew`` trigger parameters, checked; absent ones keep the feed's settings."""

    options: dict[str, Any] = {}
    mode = params.get("window_mode")
    if mode not in (None, ""):
        if mode not in ("exact", "offset_cut"):
            raise ConfigError(f"parameter 'window_mode': {mode!r} is not one of exact, offset_cut")
        options["window_mode"] = mode
    skew = params.get("max_skew")
    if skew not in (None, ""):
        options["max_skew"] = parse_skew(str(skew), "max_skew")
    return options


def plan_request(
    feed: Feed, adapter: KafkaAdapter, checkpoints: CheckpointStore, mode: str, params: Mapping[str, Any]
) -> tuple[Plan, Location | None, bool]:
    """Plan one run of ``mode`` from trigger parameters, without saving or reading anything.

    Returns the plan, where it publishes (``None``: the feed's output) and whether it is a
    dry run. :func:`plan_run` saves what this returns; the Tidemark view's replay preview
    shows it, so a preview is exactly the plan a dry run of the same parameters makes.
    """
    from tidemark.runs.gather import plan_feed

    if mode not in ("scheduled", "backfill", "replay"):
        raise ConfigError(f"mode must be scheduled, backfill or replay, got {mode!r}")
    run_mode: Mode = mode  # type: ignore[assignment]
    chosen, output, dry_run = selection_options(feed, mode, params)
    if mode == "scheduled":
        plan = plan_feed(feed, adapter, checkpoints, mode=run_mode)
    elif mode == "backfill":
        start = parse_timestamp("start_timestamp", params.get("start_timestamp"))
        end = parse_timestamp("end_timestamp", params.get("end_timestamp"))
        if start is None or end is None:
            raise ConfigError("a backfill needs parameters 'start_timestamp' and 'end_timestamp'")
        if end <= start:
            raise ConfigError(f"parameter 'end_timestamp' ({end.isoformat()}) must be after 'start_timestamp'")
        plan = plan_feed(
            feed, adapter, checkpoints, mode=run_mode, window_start=start, window_end=end,
            commit=flag(params, "commit"), **window_options(params), **chosen,
        )  # fmt: skip
    else:
        spec = parse_replay_params(params)
        plan = plan_feed(
            feed, adapter, checkpoints, mode=run_mode, replay=spec, commit=spec.commit, **window_options(params),
            **chosen,
        )  # fmt: skip
    if plan.commit and mode != "scheduled" and not dry_run:  # a dry run commits nothing: its plan is shown as asked
        plan, output = committing_request(feed, plan, params), None
    if output is not None:
        plan = replace(plan, output=str(output))
    return plan, output, dry_run


def committing_request(feed: Feed, plan: Plan, params: Mapping[str, Any]) -> Plan:
    """A committing backfill or replay, checked: it moves the feed's group, so it is the feed's next run.

    The rule (``docs/ARCHITECTURE.md``, "The feed's output"): it publishes to the feed's own
    output (never only to ``.backfills``/``.replays``: the group must not move over records
    that reached no output), and it starts where the group is. A start past the committed
    offset would skip ``[committed, start)``: refused unless ``allow_gap`` is true, and then
    each skipped range is an ``offsets_skipped`` event. A start before it (a rewind) would
    publish offsets the output already holds, or move the group back so that the feed
    publishes them again: always refused.
    """
    from tidemark.errors import PlanningError
    from tidemark.planning.plan import Event

    if params.get("output") not in (None, ""):
        raise ConfigError(
            f"parameter 'output': a committing {plan.mode} of feed '{feed.name}' publishes to the feed's own output "
            f"({feed.output_location()}), because it moves the group past these records; leave 'output' empty, or "
            "run without commit to publish elsewhere"
        )
    allow_gap = flag(params, "allow_gap")
    rewinds: list[str] = []
    gaps: list[tuple[PartitionPlan, int]] = []
    for p in plan.partitions:
        base = p.committed if p.committed is not None else p.checkpoint
        if base is None:
            continue  # the group has no position yet: it starts by the feed's reset policy
        if p.start < base:
            rewinds.append(f"{p.topic}[{p.partition}] starts at {p.start}, the group is at {base}")
        elif p.start > max(base, p.log_start):  # below the log start, retention took them: a data_loss event
            gaps.append((p, max(base, p.log_start)))
    if rewinds:
        raise PlanningError(
            f"a committing {plan.mode} of feed '{feed.name}' (group '{plan.group}') would move the group back: "
            f"{'; '.join(rewinds)}. Those offsets are already in the feed's output and would be published twice. "
            "Run it without commit (it publishes beside the feed's output), or start it at the committed offsets"
        )
    if gaps and not allow_gap:
        skipped = "; ".join(f"{p.topic}[{p.partition}] [{base}, {p.start})" for p, base in gaps)
        raise PlanningError(
            f"a committing {plan.mode} of feed '{feed.name}' (group '{plan.group}') would skip offsets that reach no "
            f"output: {skipped}. Start it at the committed offsets, run it without commit, or set allow_gap "
            "(--allow-gap) to skip them on purpose (each skipped range is then an event in the report)"
        )
    events = tuple(
        Event(
            kind="offsets_skipped",
            message=f"{p.topic}[{p.partition}]: offsets [{base}, {p.start}) ({p.start - base} records) are skipped "
            f"on request (allow_gap): the {plan.mode} commits past them and they are in no output",
            topic=p.topic,
            partition=p.partition,
            details={"start": base, "end": p.start, "records": p.start - base},
        )
        for p, base in gaps
    )
    return replace(plan, events=plan.events + events, output=None)


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
    """Step 1: finish a pending commit, then plan and save this run's plan.

    A plan with records of a feed in a Schema Registry format that pins no reader version
    records the subject's latest version (``registry``, default the ``TIDEMARK_SCHEMA_REGISTRY_*``
    environment), so that every attempt of the plan decodes with the same reader.
    """
    if mode not in ("scheduled", "backfill", "replay"):
        raise ConfigError(f"mode must be scheduled, backfill or replay, got {mode!r}")
    root = _root(root)
    feed = load_feed(feed_name)
    params = dict(params or {})
    resumed = None
    checkpoints = _checkpoints(root, checkpoints)
    seen: set[str] = set()
    while (pending := pending_commit(feed, root, checkpoints)) is not None and pending.run_id not in seen:
        seen.add(pending.run_id)
        progress(f"finishing the commit of published plan {pending.plan_id} (run {pending.run_id}) first")
        try:
            commit_run(pending, connection, root=root, progress=progress, checkpoints=checkpoints)
            resumed = pending.plan_id
        except OffsetsMovedError as exc:
            # Refused for good: marked abandoned, its publication retracted; this run plans
            # from the group's offsets as they are now.
            progress(f"run {pending.run_id} cannot commit any more: {exc}")
    plan, _output, dry_run = plan_request(feed, KafkaAdapter(connection), checkpoints, mode, params)
    if plan.total_records and not dry_run and feed.deserialization.registry_parts:
        plan = replace(plan, readers=_planned_readers(feed, registry))
    run_id = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}-{plan.plan_id[:8]}"
    run_dir = runs_dir(feed.name, root) / run_id
    plan_path = run_dir / PLAN_FILE
    write_plan(plan, plan_path)
    handle = RunHandle(
        run_id=run_id,
        feed=feed.name,
        plan_id=plan.plan_id,
        plan_path=str(plan_path),
        run_dir=str(run_dir),
        mode=mode,
        commit=plan.commit,
        records=plan.total_records,
        resumed=resumed,
        dry_run=dry_run,
    )
    _write_status(run_dir, handle=handle.to_xcom(), planned_at=datetime.now(UTC).isoformat())
    progress(
        f"planned {plan.plan_id}: {plan.total_records} records in {sum(1 for p in plan.partitions if p.records)} of "
        f"{len(plan.partitions)} partitions, {len(plan.tasks)} Spark tasks, {len(plan.events)} events"
    )
    for event in plan.events:
        progress(f"event {event.kind}: {event.message}")
    if dry_run:
        progress(f"dry run: nothing is read, published or committed. The plan ({plan.total_records} records):")
        for line in plan_table(plan):
            progress(line)
    return handle


def _planned_readers(feed: Feed, registry: RegistryConnection | None) -> dict[str, dict[str, Any]]:
    """The plan's ``readers``: the latest version of each registry subject the feed does not pin, asked now."""
    from tidemark.kafka.registry import RegistryClient, require
    from tidemark.kafka.registry import from_env as registry_from_env
    from tidemark.spark.wire import planned_readers

    connection = require(registry if registry is not None else registry_from_env(), feed.name)
    return planned_readers(feed, RegistryClient(connection))


def plan_table(plan: Plan) -> list[str]:
    """The plan's ranges as aligned text lines (a dry run's task log)."""
    rows = [("partition", "committed", "start", "end", "records", "reason")]
    rows += [(f"{p.topic}[{p.partition}]", "-" if p.committed is None else str(p.committed), str(p.start),
              str(p.end), str(p.records), p.reason) for p in plan.partitions]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def decodes_avro(feed: str) -> bool:
    """Whether ``feed``'s job needs ``from_avro``; a feed that does not load is the job's to report."""
    try:
        return load_feed(feed).deserialization.decodes_avro
    except ConfigError:
        return False


def spark_submit_command(handle: RunHandle, master: str | None = None, *, class_archive: str = "") -> list[str]:
    """The ``spark-submit`` command of a run, for ``local[*]`` or any cluster master.

    A small run's driver gets the JVM options of :func:`~tidemark.spark.session.small_run_conf`
    (with ``class_archive``, from :func:`~tidemark.spark.session.driver_class_archive`).

    On a cluster (``spark://``, ``yarn``, ``k8s://``) the job zips the ``tidemark`` package
    and ships it to the executors itself (:func:`tidemark.job.steps.should_ship`); Kafka settings
    travel inside the read's tasks, never as Spark configuration, and
    :data:`~tidemark.spark.session.SUBMIT_CONF` widens Spark's redaction to Tidemark's secret names.
    """
    from tidemark.spark.session import SUBMIT_CONF, avro_conf, merge_conf, openlineage_conf, s3a_jars, small_run_conf

    job = os.environ.get("TIDEMARK_SPARK_JOB", str(package_root().parent / "spark_jobs" / "tidemark_job.py"))
    spark_submit = str(Path(sys.executable).with_name("spark-submit"))
    conf = {"spark.ui.enabled": "false", "spark.pyspark.python": sys.executable, **SUBMIT_CONF}
    conf.update(small_run_conf(handle.records, class_archive=class_archive))
    jars = s3a_jars()
    extra = merge_conf(avro_conf() if decodes_avro(handle.feed) else {}, openlineage_conf())
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
    """Step 2 for the CLI: submit the Spark job; secrets go through the environment only."""
    from tidemark.spark.session import driver_class_archive

    env = {**os.environ, **connection.to_env(), "PYSPARK_PYTHON": sys.executable}
    started = time.monotonic()
    with driver_class_archive() as class_archive:
        cmd = spark_submit_command(handle, master, class_archive=class_archive.option)
        if cmd[2].startswith("local"):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # keep a local job on loopback
        progress(f"reading {handle.records} records with Spark ({cmd[2]})")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        class_archive.succeeded = proc.returncode == 0
    log = Location.of(handle.run_dir) / "spark-submit.log"
    log.write_text(proc.stdout + proc.stderr)
    job = _job_result(Location.of(handle.run_dir))
    if proc.returncode != 0:
        reason = (job or {}).get("error") or _last_error_line(proc.stderr)
        _fail(handle, connection, job, reason)
        raise TidemarkError(
            f"the Spark job for plan {handle.plan_id} failed (exit {proc.returncode}): {reason}\n"
            f"full log: {log}. Offsets were not committed; rerun to retry the same plan."
        )
    if job is None:
        raise TidemarkError(f"the Spark job exited 0 but wrote no {handle.run_dir}/job.json; see {log}")
    progress(f"read, validated and published in {time.monotonic() - started:.1f}s")
    return job


def run_empty(handle: RunHandle, connection: KafkaConnection, *, progress: Progress = _silent) -> dict[str, Any]:
    """Step 2 for a plan with no records: no Spark application; ``job.json`` says so.

    Raises :class:`~tidemark.errors.ValidationFailedError` (after recording the failed
    run) when the feed expects records. The DAGs call this instead of submitting Spark.
    """
    from tidemark.errors import ValidationFailedError
    from tidemark.job.steps import run_without_spark, write_result

    plan = handle.plan()
    result = run_without_spark(plan, load_feed(handle.feed))
    write_result(handle.run_dir, result)
    if result.error is not None:
        _fail(handle, connection, result.to_dict(), result.error)
        raise ValidationFailedError(result.error)
    progress(f"nothing to read in plan {plan.plan_id}: no Spark application started")
    return result.to_dict()


def _fail(handle: RunHandle, connection: KafkaConnection, job: Mapping[str, Any] | None, reason: str) -> None:
    """Record a failed run (status and report) so that ``tidemark runs`` shows why."""
    from tidemark.runs.report import build_report, save_report

    run_dir = Location.of(handle.run_dir)
    _write_status(run_dir, failed_at=datetime.now(UTC).isoformat(), error=reason)
    report = build_report(handle=handle, plan=handle.plan(), job=job, error=reason, connection=connection)
    save_report(report, run_dir, connection=connection)


def _last_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "Error" in ln or "error" in ln]
    return lines[-1].strip() if lines else "see the log"


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
    """Step 3: commit the plan's ends (only after a successful publish), then report."""
    from tidemark.runs.commit import commit_plan

    run_dir = Location.of(handle.run_dir)
    job = _job_result(run_dir)
    if handle.dry_run:
        return _finish(handle, connection, None, job, "dry run: planned only, nothing read, published or committed",
                       progress)  # fmt: skip
    if not _published(load_feed(handle.feed), handle, job):
        raise TidemarkError(
            f"run {handle.run_id} of feed '{handle.feed}' has not published plan {handle.plan_id}; "
            "refusing to commit offsets for data that was not published"
        )
    plan = handle.plan()
    for w in (job or {}).get("window") or []:
        progress(
            f"window {w['topic']}[{w['partition']}]: read {w['read']} ({w['read_in_margin']} in the end margin), "
            f"kept {w['kept']} ({w['kept_in_margin']} from the margin), dropped {w['dropped']} stamped outside, "
            f"largest skew {w['largest_skew_ms']} ms"
        )
    for e in (job or {}).get("events") or []:
        progress(f"event {e.get('kind')}: {e.get('message')}")
    checkpoints = _checkpoints(root, checkpoints)
    result = None
    skipped = None
    if handle.commit:
        fault_point("commit.before")
        feed = load_feed(handle.feed)
        retracted: dict[str, Any] | None = None
        try:
            # One committing run per group at a time; a refused run's retraction (below) and
            # another run's commit of the same plan take turns under the same lock.
            with checkpoints.commit_lock(plan.group):
                _check_still_published(feed, handle, plan)
                try:
                    result = commit_plan(plan, connection, checkpoints, run_id=handle.run_id)
                except OffsetsMovedError as exc:
                    retracted = retract_refused(feed, handle, plan, checkpoints, str(exc))
                    raise
        except TidemarkError as exc:
            message = str(exc)
            if isinstance(exc, OffsetsMovedError):  # retrying can never succeed: not left pending
                if retracted is not None:
                    message += f" {retracted['message']}"
                    progress(f"event publication_retracted: {retracted['message']}")
                _write_status(run_dir, abandoned=message)
            events = [*((job or {}).get("events") or []), *([retracted] if retracted else [])]
            _fail(handle, connection, {**(job or {}), "events": events}, f"commit refused: {message}")
            if retracted is not None:
                raise OffsetsMovedError(message) from exc
            raise
        progress(f"committed group '{plan.group}' at the plan's ends ({len(plan.partitions)} partitions)")
        for note in result.notes:
            progress(f"commit: {note}")
    else:
        skipped = f"mode {handle.mode} does not commit unless asked"
    return _finish(handle, connection, result, job, skipped, progress)


def _finish(
    handle: RunHandle,
    connection: KafkaConnection,
    result: CommitResult | None,
    job: Mapping[str, Any] | None,
    skipped: str | None,
    progress: Progress,
) -> CommitOutcome:
    """Record the run as finished and write its report."""
    from tidemark.runs.report import build_report, save_report

    if skipped is not None:
        progress(f"not committing: {skipped}")
    plan = handle.plan()
    run_dir = Location.of(handle.run_dir)
    _write_status(run_dir, committed=result is not None, finished_at=datetime.now(UTC).isoformat())
    report = build_report(
        handle=handle, plan=plan, job=job, commit=result, skipped_reason=skipped, connection=connection
    )
    path = save_report(report, run_dir, connection=connection)
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
    """All three steps, as ``tidemark run`` does them.

    ``job_runner`` replaces ``spark-submit`` (tests run the job in their own session).
    """
    checkpoints = _checkpoints(root, checkpoints)
    handle = plan_run(
        feed_name, connection, mode=mode, params=params, root=root, progress=progress, checkpoints=checkpoints
    )
    if handle.dry_run:
        job: dict[str, Any] = {}
    elif handle.records == 0:
        job = run_empty(handle, connection, progress=progress)
    elif job_runner is None:
        job = run_job(handle, connection, master=master, progress=progress)
    else:
        job = job_runner(handle, connection)
    outcome = commit_run(handle, connection, root=root, progress=progress, checkpoints=checkpoints)
    return handle, job, outcome
