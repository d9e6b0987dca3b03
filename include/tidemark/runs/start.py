"""Step 1 of a run: finish the feed's open runs, plan the request, save the plan (``docs/ARCHITECTURE.md``).

:func:`start_run` is the step: it checks where the run may publish (:func:`publish_target`),
settles every open run of the feed first (the design's "finish that commit before planning
anything new": :func:`tidemark.runs.protocol.settle_before_planning`), plans
(:func:`tidemark.runs.gather.plan_feed`), pins the registry subjects' reader versions, and
saves the plan into the new run's dir (``runs/<feed>/<run_id>/plan.json``: each run keeps
its own copy, with the offsets it started from and its events) and the run into the
ledger (``planned``). It returns the :class:`~tidemark.runs.run.Run`; its handle is small
and secret-free and travels through XCom. :func:`plan_request` plans the same way without
settling or saving anything: the view's replay preview.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

from tidemark.checkpoints.store import CheckpointStore
from tidemark.config.declared import avro_fields
from tidemark.config.masking import masking_problems
from tidemark.config.models import Feed, load_feeds
from tidemark.errors import ConfigError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import RegistryClient, RegistryConnection, require
from tidemark.kafka.registry import from_env as registry_from_env
from tidemark.output import publisher_for
from tidemark.output.base import check_replay_output
from tidemark.planning.plan import Event, Plan, plan_lines, write_plan
from tidemark.planning.requests import RunRequest, confine_output, output_roots
from tidemark.runs.gather import plan_feed
from tidemark.runs.protocol import settle_before_planning
from tidemark.runs.run import Progress, Root, Run, RunHandle, open_checkpoints, silent, write_status
from tidemark.spark.wire import pin_planned, planned_readers, reader_version
from tidemark.storage import Location


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
    plan = plan_feed(feed, adapter, checkpoints, request, output=publisher_for(feed))
    return plan if target is None else replace(plan, output=str(target))


def start_run(
    feed: Feed,
    connection: KafkaConnection,
    request: RunRequest,
    *,
    root: Root | None = None,
    progress: Progress = silent,
    checkpoints: CheckpointStore | None = None,
    registry: RegistryConnection | None = None,
) -> Run:
    """Step 1 on a loaded feed: settle the feed's open runs, plan ``request``, save the plan; the run as a value.

    A plan with records of a feed in a Schema Registry format that pins no reader version
    records the subject's latest version (``registry``, default the ``TIDEMARK_SCHEMA_REGISTRY_*``
    environment), so that every attempt of the plan decodes with the same reader.
    """
    target = publish_target(feed, request)  # a request refused here settles nothing
    checkpoints = open_checkpoints(root, checkpoints)
    kafka = KafkaAdapter(connection)
    output = publisher_for(feed)  # the feed's own output: open runs are shown there, planning asks its positions
    resumed: str | None = None
    settled: tuple[Event, ...] = ()
    if not request.dry_run:  # a dry run settles nothing: it changes nothing
        publisher_of = partial(publisher_for, feed)  # where each open run's plan publishes
        resumed, settled = settle_before_planning(feed, publisher_of, checkpoints, kafka, progress)
    plan = plan_feed(feed, kafka, checkpoints, request, output=output)  # as plan_request, open runs settled first
    # In this run's report: what finishing the earlier runs found (not part of the plan id), and where it publishes.
    plan = replace(plan, events=(*settled, *plan.events), output=None if target is None else str(target))
    if plan.total_records and not request.dry_run and feed.deserialization.registry_parts:
        # The latest version of each registry subject the feed does not pin, asked now.
        schemas = RegistryClient(require(registry if registry is not None else registry_from_env(), feed.name))
        plan = replace(plan, readers=planned_readers(feed, schemas))
        _refuse_masked_paths(feed, plan, schemas)
    run = Run(RunHandle.new(plan, request, root, resumed), feed, plan, request)
    _save(run, checkpoints, progress)
    return run


def _refuse_masked_paths(feed: Feed, plan: Plan, schemas: RegistryClient) -> None:
    """An Avro feed's masked paths checked against the reader schema the plan decodes with, before anything runs
    (the job checks every format's again against the decoded records)."""
    if feed.masking is None or not feed.masking.fields or feed.deserialization.format != "avro":
        return
    reader = reader_version(pin_planned(feed, plan.readers), schemas, part="value")
    problems = masking_problems(feed.masking, avro_fields(reader.schema))
    if problems:
        raise ConfigError(
            f"feed '{feed.name}': {'; '.join(problems)}, in the reader schema (subject '{reader.subject}' version "
            f"{reader.version}); fix the feed's masking or the subject; nothing was read"
        )


def _save(run: Run, checkpoints: CheckpointStore, progress: Progress) -> None:
    """Save the plan into the run dir (and say what it holds), the run into the ledger (``planned``; not a dry
    run), the handle to ``run.json``."""
    handle, plan = run.handle, run.plan
    write_plan(plan, Location.of(handle.plan_path))
    for line in plan_lines(plan, dry_run=handle.dry_run):
        progress(line)
    if not handle.dry_run:
        checkpoints.set_run(plan.group, handle.run_id, feed=handle.feed, plan_id=plan.plan_id, state="planned",
                            run_dir=handle.run_dir)  # fmt: skip
    write_status(run.dir, handle=handle.to_xcom(), planned_at=datetime.now(UTC).isoformat())
