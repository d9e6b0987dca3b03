"""Run reports: one JSON document per run, under ``<state>/runs/<feed>/<run_id>/report.json``.

A report says what one run planned (plan id, ranges, events), what it read and how it
was validated (counts, gaps, the validation summary and its Data Docs page), where it
wrote (output paths), and what it committed (the commit result), with timestamps. It is
built from the plan, the Spark job's result (``job.json``, read as a
:class:`~tidemark.job.result.JobResult`) and ``validation.json`` in the run dir, and the
:class:`~tidemark.runs.commit.CommitResult`. Runs that never reached the report
step (a failed Spark job) are still listed, from what their run dir holds.

No credential ever appears in a report: connection settings are included only through
:meth:`KafkaConnection.describe`, and before writing, every string is scrubbed of the
secret values of the connection and of ``TIDEMARK_KAFKA_*`` secret variables.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field

from tidemark.config.masking import MASKING_KEY_ENV
from tidemark.errors import ConfigError, OffsetsMovedError, TidemarkError
from tidemark.job.result import JobResult, read_result
from tidemark.kafka.connection import ENV_PREFIX, KafkaConnection, is_secret
from tidemark.kafka.registry import ENV_PASSWORD as REGISTRY_PASSWORD_ENV
from tidemark.planning.plan import PLAN_FILE, Event, Plan
from tidemark.redaction import redact
from tidemark.runs.commit import CommitResult
from tidemark.runs.protocol import Settled
from tidemark.runs.run import Root, RunHandle, run_dir_for, run_status, runs_root, write_status
from tidemark.storage import Location

REPORT_VERSION = 1
REPORT_FILE = "report.json"

RunStatus = Literal["succeeded", "failed", "running"]


class RunReport(BaseModel):
    """One run, as ``tidemark report RUN`` prints it."""

    model_config = ConfigDict(extra="forbid")

    version: int = REPORT_VERSION
    run_id: str
    feed: str
    status: RunStatus
    plan_id: str | None = None
    group: str | None = None
    mode: str | None = None
    commit_requested: bool | None = None
    resumed_plan: str | None = None  # an earlier plan whose commit this run finished first
    ranges: list[dict[str, Any]] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    gaps: dict[str, int] = Field(default_factory=dict)  # "topic[partition]" -> offsets with no record
    window: list[dict[str, Any]] = Field(default_factory=list)  # exact time windows: per-partition counts
    events: list[dict[str, Any]] = Field(default_factory=list)
    validation: dict[str, Any] | None = None
    data_docs: str | None = None
    outputs: dict[str, Any] = Field(default_factory=dict)
    commit: dict[str, Any] | None = None
    error: str | None = None
    connection: dict[str, str] | None = None
    schemas: dict[str, Any] | None = None  # Schema Registry feeds: the reader schema and the writer ids seen
    timings_s: dict[str, float] = Field(default_factory=dict)  # the Spark job's step durations
    timestamps: dict[str, str] = Field(default_factory=dict)

    @property
    def started_at(self) -> str | None:
        return self.timestamps.get("planned_at") or self.timestamps.get("started_at")

    @property
    def finished_at(self) -> str | None:
        return self.timestamps.get("finished_at")

    def lag_ms_at_plan(self) -> dict[tuple[str, int], int]:
        """Per partition, how old the oldest record the run read was when the run was planned (0: nothing to read).

        For a run that starts at the group's position (a scheduled or committing run), this
        is the group's lag in time at plan time: the age of its oldest unread record. A
        partition the run read nothing from counts 0 when nothing was left to read, and is
        left out when the job did not say (it failed, or an older report).
        """
        planned = self.timestamps.get("planned_at")
        if not planned:
            return {}
        planned_ms = int(datetime.fromisoformat(planned).timestamp() * 1000)
        out = {}
        for r in self.ranges:
            key = (str(r["topic"]), int(r["partition"]))
            first = r.get("first_record_ms")
            if isinstance(first, int):
                out[key] = max(planned_ms - first, 0)
            elif r.get("records") == 0 and r.get("start") == r.get("end_available"):
                out[key] = 0
        return out


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _read_json(path: Location) -> dict[str, Any] | None:
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    return doc if isinstance(doc, dict) else None


def _first_record_ms(job: JobResult | None) -> dict[tuple[str, int], int]:
    """Per partition, the oldest timestamp among the records the job read (its ``ranges`` statistics)."""
    out = {}
    for r in job.ranges if job is not None else []:
        if isinstance(r.get("min_timestamp_ms"), int):
            out[(str(r["topic"]), int(r["partition"]))] = int(r["min_timestamp_ms"])
    return out


def _ranges(plan: Plan, job: JobResult | None) -> list[dict[str, Any]]:
    firsts = _first_record_ms(job)
    return [
        {
            "topic": p.topic,
            "partition": p.partition,
            "start": p.start,
            "end": p.end,
            "records": p.records,
            "committed_before": p.committed,
            "checkpoint_before": p.checkpoint,
            "log_start": p.log_start,
            "high_watermark": p.high_watermark,
            "end_available": p.end_available,
            "reason": p.reason,
            "first_record_ms": firsts.get(p.key),  # None: nothing read (or the job did not finish)
        }
        for p in plan.partitions
    ]


def _events(plan: Plan | None, job: JobResult | None, commit: CommitResult | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if plan is not None:
        out += [e.reported("plan") for e in plan.events]
    for event in job.events if job is not None else []:
        out.append({"source": "job", **event})
    for topic, partition in commit.expired if commit is not None else ():
        expired = Event("group_offsets_expired", f"{topic}[{partition}]: the group's offset vanished after planning "
                        "(expired or deleted); committed back at the plan's end", topic=topic,
                        partition=partition)  # fmt: skip
        out.append(expired.reported("commit"))
    return out


def build_report(
    *,
    handle: RunHandle,
    plan: Plan | None,
    job: JobResult | None,
    commit: CommitResult | None = None,
    skipped_reason: str | None = None,
    error: str | None = None,
    connection: KafkaConnection | None = None,
    timestamps: Mapping[str, str] | None = None,
) -> RunReport:
    """A report from the plan, the Spark job's result (``None``: the job wrote none) and the commit result.

    From ``job``: its ``validation`` summary (else ``validation.json`` in the run dir), the
    records read, published and quarantined, its ``manifest`` (as ``outputs``), ``events``,
    ``window``, ``schemas``, ``timings_s``, ``error`` and its start and finish times.
    """
    run_dir, now = Location.of(handle.run_dir), _now()
    ranges = _ranges(plan, job) if plan is not None else []
    events = _events(plan, job, commit)
    validation = (job.validation if job is not None else None) or _read_json(run_dir / "validation.json")
    counts: dict[str, int] = {}
    if plan is not None:
        counts["planned"] = plan.total_records
    if job is not None:  # as the metrics send them
        counts.update(read=job.records_read, published=job.records_published, quarantined=job.records_quarantined)
    if validation:
        for key, value in (validation.get("counts") or {}).items():
            if isinstance(value, int):
                counts.setdefault(key, value)
    gaps: dict[str, int] = {}
    if validation:
        gaps = {f"{p['topic']}[{p['partition']}]": int(p["gaps"]) for p in validation.get("partitions", [])}
    outputs: dict[str, Any] = {"manifest": job.manifest} if job is not None and job.manifest else {}
    skipped_doc = {"status": "skipped", "reason": skipped_reason} if skipped_reason is not None else None
    commit_doc = commit.to_dict() if commit is not None else skipped_doc
    status_doc = run_status(run_dir)
    stamps = {k: str(v) for k, v in status_doc.items() if k.endswith("_at") and v}
    stamps.update(job.timestamps if job is not None else {})
    if commit is not None:
        stamps["committed_at"] = commit.finished_at
    stamps.update(timestamps or {})
    stamps.setdefault("finished_at", now)
    failure = error or (job.error if job is not None else None) or status_doc.get("error")
    return RunReport(
        run_id=handle.run_id,
        feed=handle.feed,
        status="failed" if failure else "succeeded",
        plan_id=handle.plan_id,
        group=plan.group if plan is not None else None,
        mode=handle.mode,
        commit_requested=handle.commit,
        resumed_plan=handle.resumed,
        ranges=ranges,
        counts=counts,
        gaps=gaps,
        window=list(job.window) if job is not None else [],
        events=events,
        validation=validation,
        data_docs=(validation or {}).get("data_docs") or (validation or {}).get("data_docs_index"),
        outputs=outputs,
        commit=commit_doc,
        error=str(failure) if failure else None,
        connection=connection.describe() if connection is not None else None,
        schemas=job.schemas if job is not None else None,
        timings_s=dict(job.timings_s) if job is not None else {},
        timestamps=stamps,
    )


# -- redaction -------------------------------------------------------------------------


def secret_values(connection: KafkaConnection | None = None, environ: Mapping[str, str] | None = None) -> set[str]:
    """Secret setting values that must never be written: the connection's and the env's."""
    env = os.environ if environ is None else environ
    values = {v for k, v in (connection.settings.items() if connection else ()) if is_secret(k)}
    values |= {v for k, v in env.items() if k.startswith(ENV_PREFIX) and is_secret(k[len(ENV_PREFIX) :])}
    # Object-store and checkpoint-store credentials (tidemark.storage, tidemark.checkpoints.store).
    values |= {env[k] for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN") if env.get(k)}
    values |= {env[k] for k in (REGISTRY_PASSWORD_ENV,) if env.get(k)}  # tidemark.kafka.registry
    values |= {env[k] for k in (MASKING_KEY_ENV,) if env.get(k)}  # the HMAC key of masked fields (spark.masking)
    # Passwords written into connection URLs, as written (percent-encoded) and decoded: the checkpoint store's,
    # the Iceberg catalog's, the registry's.
    for name in ("TIDEMARK_CHECKPOINT_URL", "TIDEMARK_ICEBERG_CATALOG_URI", "TIDEMARK_SCHEMA_REGISTRY_URL"):
        url = env.get(name, "")
        if "://" in url and "@" in url:
            credentials = url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[0]
            if ":" in credentials:
                written = credentials.split(":", 1)[1]
                values |= {written, unquote(written)}
    return {v for v in values if len(v) >= 3}  # shorter values would blank out ordinary text


# -- store -------------------------------------------------------------------------------


def save_report(
    report: RunReport,
    run_dir: Path | Location | None = None,
    *,
    root: Root | None = None,
    connection: KafkaConnection | None = None,
) -> Path | Location:
    """Write ``report.json`` whole into the run dir (derived from feed and run id if not given).

    Returns a ``Path`` for a local run dir, else the report's object-store location.
    """
    folder = Location.of(run_dir) if run_dir is not None else run_dir_for(report.feed, report.run_id, root)
    doc = redact(report.model_dump(mode="json"), secret_values(connection))
    path = folder / REPORT_FILE
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    return path.local_path() if path.is_local else path


def record_failure(
    handle: RunHandle, plan: Plan, job: JobResult | None, reason: str, connection: KafkaConnection | None
) -> Path | Location:
    """Record a failed run, its report and its ``run.json`` status, so that ``tidemark runs`` shows why."""
    return _record(handle, plan, job, {"failed_at": _now(), "error": reason}, error=reason, connection=connection)


DRY_RUN = "dry run: planned only, nothing read, published or committed"


@dataclass(frozen=True)
class RunEnd:
    """How the commit step ended a run, as its report and ``run.json`` now say."""

    report_path: Path | Location
    commit: CommitResult | None = None
    skipped: str | None = None  # why the group was not committed (the run's mode, a dry run)
    error: str | None = None  # why the run failed: it was refused, or abandoned


def record_end(
    handle: RunHandle,
    plan: Plan,
    job: JobResult | None,
    *,
    settled: Settled | None,
    refused: TidemarkError | None = None,
    connection: KafkaConnection | None = None,
) -> RunEnd:
    """Record how the commit step ended the run: its report (the job's events, then settling's) and ``run.json``.

    ``settled`` is :func:`~tidemark.runs.protocol.settle`'s answer (``None``: a dry run, or
    settling raised ``refused``). A run another writer's move refused is abandoned, with a
    ``commit_refused`` event; a run settling abandoned fails with its last event's message.
    """
    status: dict[str, Any] = {}
    commit = skipped = error = None
    if refused is not None:
        message, events = str(refused), list(job.events) if job is not None else []
        if isinstance(refused, OffsetsMovedError):  # retrying can never succeed: discarded, never shown
            status["abandoned"] = message
            event = Event("commit_refused", f"run {handle.run_id} was refused; its staged plan was discarded: "
                          f"{message}", details={"plan_id": plan.plan_id})  # fmt: skip
            events.append(event.reported("commit"))
        job, error = _with_events(job, plan, events), f"commit refused: {message}"
    elif settled is not None and settled.state == "abandoned":
        job, error = _with_settled(job, plan, settled), settled.events[-1].message if settled.events else None
        error = error or f"run {handle.run_id} was abandoned"
        status["abandoned"] = error
    else:
        job = _with_settled(job, plan, settled) if settled is not None else job
        commit = settled.commit if settled is not None else None
        skipped = DRY_RUN if handle.dry_run else None if handle.commit else f"mode {handle.mode} does not commit"
        status.update(committed=commit is not None, finished_at=_now())
    if error is not None:
        status.update(failed_at=_now(), error=error)
    path = _record(handle, plan, job, status, commit=commit, skipped=skipped, error=error, connection=connection)
    return RunEnd(path, commit, skipped, error)


def _record(
    handle: RunHandle,
    plan: Plan,
    job: JobResult | None,
    status: Mapping[str, Any],
    *,
    commit: CommitResult | None = None,
    skipped: str | None = None,
    error: str | None = None,
    connection: KafkaConnection | None,
) -> Path | Location:
    """Write the run's report, then add ``status`` to its ``run.json`` (whose times the report already holds)."""
    run_dir = Location.of(handle.run_dir)
    stamps = {k: str(v) for k, v in status.items() if k.endswith("_at")}
    report = build_report(handle=handle, plan=plan, job=job, commit=commit, skipped_reason=skipped, error=error,
                          connection=connection, timestamps=stamps)  # fmt: skip
    path = save_report(report, run_dir, connection=connection)
    write_status(run_dir, **status)
    return path


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


def _from_run_dir(run_dir: Location, feed: str) -> RunReport:
    """A report for a run that never wrote one (failed or still running), from its run dir.

    The run's own copy of its plan (``plan.json``) gives the ranges and the plan's events,
    so a run that failed in the Spark job still shows, say, that its group offsets had expired.
    """
    status = run_status(run_dir)
    plan_doc = _read_json(run_dir / PLAN_FILE)
    plan = Plan.from_dict(plan_doc) if plan_doc else None
    job = read_result(run_dir)
    handle = status.get("handle") or {}
    validation = _read_json(run_dir / "validation.json")
    error = (job.error if job is not None else None) or status.get("error")
    if not error and validation and validation.get("success") is False:
        error = validation.get("failure")
    finished = status.get("failed_at") or status.get("finished_at")
    return RunReport(
        run_id=run_dir.name,
        feed=feed,
        status="failed" if error else ("succeeded" if status.get("committed") else "running"),
        plan_id=handle.get("plan_id"),
        group=plan.group if plan is not None else None,
        mode=handle.get("mode"),
        commit_requested=handle.get("commit"),
        ranges=_ranges(plan, job) if plan is not None else [],
        counts={"planned": int(handle["records"])} if isinstance(handle.get("records"), int) else {},
        events=_events(plan, job),
        validation=validation,
        data_docs=(validation or {}).get("data_docs"),
        error=str(error) if error else None,
        timestamps={k: str(v) for k, v in status.items() if k.endswith("_at") and v}
        | (job.timestamps if job is not None else {})
        | ({"finished_at": str(finished)} if finished else {}),
    )


def load_report(run_id: str, feed: str | None = None, *, root: Root | None = None) -> RunReport:
    """A run's report by run id (searched across feeds unless ``feed`` is given) or by path or URL."""
    if run_id.endswith(REPORT_FILE) and Location.of(run_id).exists():
        return RunReport.model_validate_json(Location.of(run_id).read_text())
    base = runs_root(root)
    candidates = [base / feed / run_id] if feed else [f / run_id for f in base.children(folders_only=True)]
    candidates = [c for c in candidates if c.exists() and not c.is_file()]
    if not candidates:
        raise ConfigError(
            f"no run '{run_id}' under {base}{f'/{feed}' if feed else ''} (list runs with 'tidemark runs FEED')"
        )
    if len(candidates) > 1:
        feeds = ", ".join(c.parent.name for c in candidates)
        raise ConfigError(f"run id '{run_id}' exists for several feeds ({feeds}); pass --feed")
    folder = candidates[0]
    path = folder / REPORT_FILE
    if path.exists():
        return RunReport.model_validate_json(path.read_text())
    return _from_run_dir(folder, folder.parent.name)


def list_runs(feed: str, limit: int = 20, *, root: Root | None = None) -> list[RunReport]:
    """The feed's most recent runs, newest first (run ids start with their UTC start time)."""
    base = runs_root(root) / feed
    folders = sorted(base.children(folders_only=True), key=lambda d: d.name, reverse=True)[:limit]
    out = []
    for folder in folders:
        path = folder / REPORT_FILE
        out.append(RunReport.model_validate_json(path.read_text()) if path.exists() else _from_run_dir(folder, feed))
    return out
