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

from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import CheckpointStore, LedgerRun, open_store

if TYPE_CHECKING:
    from tidemark.runs.commit import CommitResult
from tidemark.config.durations import parse_skew, parse_timestamp
from tidemark.config.models import Feed, load_feed, load_feeds, package_root, state_location
from tidemark.errors import ConfigError, DataLossError, OffsetsMovedError, PlanningError, TidemarkError, shown
from tidemark.faults import fault_point
from tidemark.job.result import JobResult, read_result, run_without_spark, write_result
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import RegistryConnection
from tidemark.output import publisher_for
from tidemark.output.base import Publisher
from tidemark.planning.plan import Event, EventKind, Mode, PartitionPlan, Plan, write_plan
from tidemark.planning.requests import (
    confine_output,
    flag,
    output_location,
    output_roots,
    parse_replay_params,
)
from tidemark.runs.protocol import Settled, abandon, settle, settle_open_runs
from tidemark.runs.report import PLAN_FILE
from tidemark.storage import Location, Where

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
        return Plan.from_json(Location.of(self.plan_path).read_text())


Root = Where  # the state dir: a local folder or an object-store URL


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


def _load_run(feed: Feed) -> Callable[[LedgerRun], tuple[Plan, Publisher] | None]:
    """For :func:`~tidemark.runs.protocol.settle_open_runs`: a ledger row's plan (its run dir's copy) and publisher."""

    def load(row: LedgerRun) -> tuple[Plan, Publisher] | None:
        path = Location.of(row.run_dir) / PLAN_FILE
        if not path.exists():
            return None
        plan = Plan.from_json(path.read_text())
        return plan, publisher_for(feed, plan)

    return load


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
    plan = Plan.from_json((run_dir / PLAN_FILE).read_text())
    checkpoints = _checkpoints(root, checkpoints)
    with checkpoints.commit_lock(plan.group):
        settled = abandon(plan, run_id, str(run_dir), publisher=publisher_for(feed, plan), store=checkpoints,
                          reason=reason)  # fmt: skip
    _write_status(run_dir, abandoned=settled.events[0]["message"])
    return settled


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
        plan, output = committing_request(feed, plan, params, _output_positions(feed, checkpoints)), None
    if output is not None:
        plan = replace(plan, output=str(output))
    return plan, output, dry_run


def _output_positions(feed: Feed, checkpoints: CheckpointStore) -> dict[TP, int]:
    """Where the feed's output ends per partition: the run ledger's shown positions, else an Iceberg table's record."""
    shown = {tp: s.position for tp, s in checkpoints.shown(feed.name).items()}
    if shown:
        return shown
    recovered = publisher_for(feed).positions(feed)
    return dict(recovered.ends) if recovered is not None else {}


def committing_request(
    feed: Feed, plan: Plan, params: Mapping[str, Any], shown: Mapping[TP, int] | None = None
) -> Plan:
    """A committing backfill or replay, checked: it moves the feed's group, so it is the feed's next run.

    The rule (``docs/ARCHITECTURE.md``, "The feed's output"): it publishes to the feed's own
    output (never only to ``.backfills``/``.replays``: the group must not move over records
    that reached no output), and it starts where the group is: the committed offset, else
    the checkpoint, else where the feed's output ends (``shown``: the run ledger, or an
    Iceberg table's recorded position); on a topic recreated since (a ``topic_recreated``
    plan event) the old topic's position means nothing and the new topic's log start is
    where it is. A start past that would skip ``[base, start)``: refused unless
    ``allow_gap`` is true, and then each skipped range is an ``offsets_skipped`` event;
    ``[base, log start)`` that retention deleted is the feed's ``on_data_loss`` to decide
    (``fail`` refuses, ``skip`` names it as a ``data_loss`` event), as for scheduled runs. A
    start before the base (a rewind) would publish offsets the output already holds, or
    move the group back so that the feed publishes them again: always refused.
    """
    if params.get("output") not in (None, ""):
        raise ConfigError(
            f"parameter 'output': a committing {plan.mode} of feed '{feed.name}' publishes to the feed's own output "
            f"({feed.output_location()}), because it moves the group past these records; leave 'output' empty, or "
            "run without commit to publish elsewhere"
        )
    allow_gap = flag(params, "allow_gap")
    recreated = {e.topic for e in plan.events if e.kind == "topic_recreated"}
    rewinds: list[str] = []
    gaps: list[tuple[PartitionPlan, int]] = []
    lost: list[tuple[PartitionPlan, int]] = []
    for p in plan.partitions:
        if p.topic in recreated:
            base: int | None = p.log_start  # the old topic's offsets say nothing about the new one
        else:
            base = p.committed if p.committed is not None else p.checkpoint
            if base is None:
                base = (shown or {}).get(p.key)
        if base is None:
            continue  # the group has no position yet and the output holds nothing: the feed's reset policy
        if p.start < base:
            rewinds.append(f"{p.topic}[{p.partition}] starts at {p.start}, the group is at {base}")
            continue
        named = any(e.kind == "data_loss" and (e.topic, e.partition) == p.key for e in plan.events)
        if base < p.log_start and p.start >= p.log_start and not named:  # retention deleted [base, log start)
            lost.append((p, base))
        if p.start > max(base, p.log_start):
            gaps.append((p, max(base, p.log_start)))
    if lost and feed.on_data_loss == "fail":
        deleted = "; ".join(f"{p.topic}[{p.partition}] [{base}, {p.log_start})" for p, base in lost)
        raise DataLossError(
            f"a committing {plan.mode} of feed '{feed.name}' (group '{plan.group}') would commit past records "
            f"retention deleted unread: {deleted}, and on_data_loss is fail. Set on_data_loss: skip to go on from the "
            "log start (each lost range is then a data_loss event), or run it without commit"
        )
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

    def passed_over(kind: EventKind, p: PartitionPlan, start: int, end: int, why: str) -> Event:
        """An event naming ``[start, end)`` of ``p``, which the committing run moves the group past."""
        where = f"{p.topic}[{p.partition}]: offsets [{start}, {end}) ({end - start} records)"
        return Event(kind=kind, message=f"{where} {why}", topic=p.topic, partition=p.partition,
                     details={"start": start, "end": end, "records": end - start})  # fmt: skip

    events = tuple(
        passed_over("data_loss", p, base, p.log_start, "were deleted by retention before they were read; the "
                    f"committing {plan.mode} goes on from the log start (on_data_loss: skip)")
        for p, base in lost
    ) + tuple(
        passed_over("offsets_skipped", p, base, p.start, f"are skipped on request (allow_gap): the {plan.mode} "
                    "commits past them and they are in no output")
        for p, base in gaps
    )  # fmt: skip
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
    settled_events: list[Event] = []
    if not flag(params, "dry_run"):
        # Every open run of the feed first (docs/ARCHITECTURE.md, "The commit protocol"): a
        # committed run is shown, a staged one committed and shown, a refused one discarded.
        for settled in settle_open_runs(
            feed.name, _load_run(feed), store=checkpoints, kafka=KafkaAdapter(connection), group=feed.group,
            connection=connection, progress=progress,
        ):  # fmt: skip
            if settled.state == "shown":
                resumed = settled.plan_id
            settled_events += [
                Event(kind=e["kind"], message=f"settling run {settled.run_id}: {e['message']}",
                      details={**e["details"], "run_id": settled.run_id})
                for e in settled.events
            ]  # fmt: skip
    plan, _output, dry_run = plan_request(feed, KafkaAdapter(connection), checkpoints, mode, params)
    if settled_events:  # in this run's report: what finishing the earlier runs found (not part of the plan id)
        plan = replace(plan, events=(*settled_events, *plan.events))
    if plan.total_records and not dry_run and feed.deserialization.registry_parts:
        plan = replace(plan, readers=_planned_readers(feed, registry))
    run_id = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}-{plan.plan_id[:8]}"
    run_dir = runs_dir(feed.name, root) / run_id
    plan_path = run_dir / PLAN_FILE
    write_plan(plan, plan_path)
    if not dry_run:
        checkpoints.set_run(plan.group, run_id, feed=feed.name, plan_id=plan.plan_id, state="planned",
                            run_dir=str(run_dir))  # fmt: skip
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
    and ships it to the executors itself (:func:`tidemark.job.entry.should_ship`); the connections reach
    the driver in a private file (:mod:`tidemark.spark.secrets`, never an argument here), Kafka settings
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
    """Step 2 for the CLI: submit the Spark job.

    The connections (Kafka's, the registry's, the object store's and the Iceberg catalog's variables) reach
    the driver through a private file (:mod:`tidemark.spark.secrets`): spark-submit's command line and
    environment hold only its path.
    """
    from tidemark.spark.secrets import SECRETS_FILE_ENV, secrets_file, split_env
    from tidemark.spark.session import driver_class_archive

    env, connections = split_env({**os.environ, **connection.to_env(), "PYSPARK_PYTHON": sys.executable})
    started = time.monotonic()
    with driver_class_archive() as class_archive, secrets_file(connections) as path:
        if path:
            env[SECRETS_FILE_ENV] = path
        cmd = spark_submit_command(handle, master, class_archive=class_archive.option)
        if cmd[2].startswith("local"):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # keep a local job on loopback
        progress(f"reading {handle.records} records with Spark ({cmd[2]})")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        class_archive.succeeded = proc.returncode == 0
    log = Location.of(handle.run_dir) / "spark-submit.log"
    log.write_text(proc.stdout + proc.stderr)
    job = read_result(handle.run_dir)
    if proc.returncode != 0:
        reason = (job.error if job is not None else None) or _last_error_line(proc.stderr)
        _fail(handle, connection, job, reason)
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
    from tidemark.errors import ValidationFailedError

    plan = handle.plan()
    result = run_without_spark(plan, load_feed(handle.feed))
    write_result(handle.run_dir, result)
    if result.error is not None:
        _fail(handle, connection, result, result.error)
        raise ValidationFailedError(result.error)
    progress(f"nothing to read in plan {plan.plan_id}: no Spark application started")
    return result.to_dict()


def _fail(handle: RunHandle, connection: KafkaConnection, job: JobResult | None, reason: str) -> None:
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
    """Step 3: commit the group at the plan's ends (when the run commits), then show the publication; report.

    :func:`tidemark.runs.protocol.settle` under the group's commit lock: the staged
    publication becomes visible only after the group's commit succeeded; a refused run's
    publication is discarded, never having been visible.
    """
    run_dir = Location.of(handle.run_dir)
    job = read_result(run_dir)
    if handle.dry_run:
        return _finish(handle, connection, None, job, "dry run: planned only, nothing read, published or committed",
                       progress)  # fmt: skip
    plan = handle.plan()
    feed = load_feed(handle.feed)
    for w in job.window if job is not None else []:
        progress(
            f"window {w['topic']}[{w['partition']}]: read {w['read']} ({w['read_in_margin']} in the end margin), "
            f"kept {w['kept']} ({w['kept_in_margin']} from the margin), dropped {w['dropped']} stamped outside, "
            f"largest skew {w['largest_skew_ms']} ms"
        )
    for e in job.events if job is not None else []:
        progress(f"event {e.get('kind')}: {e.get('message')}")
    checkpoints = _checkpoints(root, checkpoints)
    if handle.commit:
        fault_point("commit.before")
    try:
        with checkpoints.commit_lock(plan.group):
            settled = settle(
                plan, handle.run_id, handle.run_dir, publisher=publisher_for(feed, plan), store=checkpoints,
                kafka=KafkaAdapter(connection), connection=connection, progress=progress,
            )  # fmt: skip
    except TidemarkError as exc:
        message = str(exc)
        events = list(job.events) if job is not None else []
        if isinstance(exc, OffsetsMovedError):  # retrying can never succeed: discarded, never shown
            _write_status(run_dir, abandoned=message)
            events.append({"source": "commit", "kind": "commit_refused", "topic": None, "partition": None,
                           "message": f"run {handle.run_id} was refused; its staged plan was discarded: {message}",
                           "details": {"plan_id": plan.plan_id}})  # fmt: skip
        _fail(handle, connection, _with_events(job, plan, events), f"commit refused: {message}")
        raise
    snapshot = settled.manifest.extra.get("snapshot_id") if settled.manifest is not None else None
    job_events = [_with_snapshot(e, snapshot) for e in (job.events if job is not None else [])]
    job = _with_events(job, plan, [*job_events, *settled.events])
    for event in settled.events:
        progress(f"event {event['kind']}: {event['message']}")
    if settled.state == "abandoned":
        reason = settled.events[-1]["message"] if settled.events else f"run {handle.run_id} was abandoned"
        _write_status(run_dir, abandoned=reason)
        _fail(handle, connection, job, reason)
        raise TidemarkError(reason)
    if handle.commit and settled.commit is not None:
        progress(f"committed group '{plan.group}' at the plan's ends ({len(plan.partitions)} partitions)")
        for note in settled.commit.notes:
            progress(f"commit: {note}")
    if settled.manifest is not None:
        progress(f"shown in {publisher_for(feed, plan).describe()}: plan {plan.plan_id}")
    skipped = None if handle.commit else f"mode {handle.mode} does not commit unless asked"
    return _finish(handle, connection, settled.commit, job, skipped, progress)


def _with_events(job: JobResult | None, plan: Plan, events: list[dict[str, Any]]) -> JobResult:
    """``job`` with ``events`` in place of its own (a job that wrote no result: only the events)."""
    return replace(job, events=events) if job is not None else JobResult(plan.plan_id, plan.feed, events=events)


def _with_snapshot(event: dict[str, Any], snapshot: Any) -> dict[str, Any]:
    """A job's ``table_schema_evolved`` event with the snapshot its promotion committed (the job staged it pending)."""
    if event.get("kind") != "table_schema_evolved" or snapshot is None or event["details"].get("snapshot_id"):
        return event
    table, changes = event["details"].get("table"), list(event["details"].get("changes") or [])
    return {**event, "details": {**event["details"], "snapshot_id": snapshot},
            "message": f"Iceberg table {table}: {'; '.join(changes)}, in snapshot {snapshot}, the one adding these "
            "records"}  # fmt: skip


def _finish(
    handle: RunHandle,
    connection: KafkaConnection,
    result: CommitResult | None,
    job: JobResult | None,
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
