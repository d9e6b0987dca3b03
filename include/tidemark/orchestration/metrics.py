"""Feed metrics sent through Airflow's own metrics client, so the deployment's StatsD or OpenTelemetry settings apply.

The plan task sends lag and planned records per partition and a counter per plan event;
the commit task sends the run's record counts, the Spark job's step durations (from
``job.json``), the lag in time at plan time per partition (the age of the oldest record
the run read, from the report: the number the Tidemark view charts), the outcome, a
counter per job or commit event and, for a committed run that quarantined records, the
dead letters it added per reason code (``tidemark.dead_letters``, tagged ``reason``: the
codes the dead-letter table groups by; a record with two reasons counts under each); a
refused commit is counted where it is refused.
Everything is read from the run's plan, ``job.json`` and report after the fact: nothing
is sent from Spark executors, and the read path is untouched. Tags are the feed, topic
and partition (never a connection setting); whether they reach the backend is the
deployment's choice (``[metrics] statsd_influxdb_enabled``, ``statsd_datadog_enabled`` or
``otel_on``). :data:`METRICS` declares every name; docs/reference/metrics.md is generated from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from airflow.sdk.observability import stats

from tidemark.planning.plan import Plan
from tidemark.runs.report import RunReport
from tidemark.runs.status import FeedStatus
from tidemark.storage import Location

PREFIX = "tidemark"


def _tags(feed: str, topic: str | None = None, partition: int | None = None) -> dict[str, str]:
    tags = {"feed": feed}
    if topic is not None:
        tags["topic"] = topic
    if partition is not None:
        tags["partition"] = str(partition)
    return tags


def _count_events(feed: str, events: Iterable[Mapping[str, Any]]) -> None:
    for event in events:
        kind = event.get("kind")
        if kind:
            stats.incr(f"{PREFIX}.event.{kind}", tags=_tags(feed, event.get("topic"), event.get("partition")))


def planned(plan: Plan) -> None:
    """Lag (records between the position a partition starts from and the end it could read) and planned records.

    Lag only for plans that start at the group's position (scheduled and committing runs):
    a replay or backfill from older offsets says nothing about how far the group is behind.
    """
    for p in plan.partitions:
        tags = _tags(plan.feed, p.topic, p.partition)
        if plan.commit:
            stats.gauge(f"{PREFIX}.lag_records", max(p.end_available - p.start, 0), tags=tags)
        stats.gauge(f"{PREFIX}.planned_records", p.records, tags=tags)
    _count_events(
        plan.feed, ({"kind": e.kind, "topic": e.topic, "partition": e.partition} for e in plan.events)
    )  # fmt: skip


def _read_json(path: Location) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def finished(feed: str, run_dir: str, report_path: str, *, committed: bool) -> None:
    """The run's counts, step durations, outcome, and the events its job and commit reported."""
    job = _read_json(Location.of(run_dir) / "job.json")
    tags = _tags(feed)
    for key in ("records_read", "records_published", "records_quarantined"):
        value = job.get(key)
        if isinstance(value, int):
            stats.incr(f"{PREFIX}.{key}", count=value, tags=tags)
    for step, seconds in (job.get("timings_s") or {}).items():
        stats.timing(f"{PREFIX}.step.{step}", timedelta(seconds=float(seconds)), tags=tags)
    stats.incr(f"{PREFIX}.run.{'committed' if committed else 'not_committed'}", tags=tags)
    if committed:
        for reason, count in dead_letter_reasons(job).items():
            stats.incr(f"{PREFIX}.dead_letters", count=count, tags={**tags, "reason": reason})
    doc = _read_json(Location.of(report_path))
    _count_events(feed, (e for e in doc.get("events") or [] if e.get("source") != "plan"))  # plan task sent those
    if doc and doc.get("commit_requested"):  # started at the group's position: its lag, as the view charts it
        for (topic, partition), ms in RunReport.model_validate(doc).lag_ms_at_plan().items():
            stats.gauge(f"{PREFIX}.lag_seconds_at_plan", ms / 1000, tags=_tags(feed, topic, partition))


def dead_letter_reasons(job: Mapping[str, Any]) -> dict[str, int]:
    """Per reason code, the records a job quarantined (``job.json``'s validation counts): ``decode_error`` and each
    row rule's label, as the dead-letter table names them."""
    if not job.get("records_quarantined"):
        return {}
    counts = (job.get("validation") or {}).get("counts") or {}
    found = {"decode_error": int(counts.get("decode_errors") or 0)}
    for label, n in (counts.get("by_rule") or {}).items():
        code = str(label).split("#", 1)[0]  # two rules of one kind on one column: one code, as the table's
        if code != "decode_error":
            found[code] = found.get(code, 0) + int(n or 0)
    return {reason: n for reason, n in found.items() if n > 0}


def started(feed: str, cause: str) -> None:
    """A scheduled feed run started, by its cause: ``lag`` (its lag trigger), ``schedule`` (its cron), ``manual``."""
    stats.incr(f"{PREFIX}.run_started", tags={**_tags(feed), "cause": cause})


def commit_refused(feed: str) -> None:
    stats.incr(f"{PREFIX}.commit_refused", tags=_tags(feed))


def lagging(status: FeedStatus) -> None:
    """Lag in time after the run: the age of the oldest record the group has not read (0 when none)."""
    for p in status.partitions:
        if p.lag_ms is not None:
            stats.gauge(f"{PREFIX}.lag_seconds", p.lag_ms / 1000, tags=_tags(status.feed, p.topic, p.partition))


def commit_ages(last_commits: Mapping[str, datetime | None], now: datetime) -> None:
    """Per feed, seconds since its last committed run (from the watchdog; feeds that never committed send none)."""
    for feed, last in last_commits.items():
        if last is not None:
            stats.gauge(f"{PREFIX}.last_commit_age_seconds", (now - last).total_seconds(), tags=_tags(feed))


MetricType = Literal["counter", "gauge", "timer (ms)"]


@dataclass(frozen=True)
class Metric:
    """One metric the DAGs send, as ``docs/reference/metrics.md`` lists it (``<...>``: one name per value)."""

    name: str
    type: MetricType
    tags: tuple[str, ...]
    sent_by: str
    value: str


# Every name the functions above send, after ``PREFIX``: the reference page is generated from this, and a test
# checks each name the functions send is declared here.
METRICS: tuple[Metric, ...] = (
    Metric(
        "run_started",
        "counter",
        ("feed", "cause"),
        "plan (feed DAG runs)",
        "one per run, by what started it: `lag` (its lag trigger), `schedule` (its cron) or `manual`",
    ),
    Metric(
        "lag_records",
        "gauge",
        ("feed", "topic", "partition"),
        "plan (scheduled and committing runs)",
        "records between where the partition starts and the end it could read (last stable offset under "
        "`read_committed`) when the run was planned",
    ),
    Metric(
        "planned_records",
        "gauge",
        ("feed", "topic", "partition"),
        "plan",
        "records this run reads from the partition (less than the lag when capped)",
    ),
    Metric(
        "event.<kind>",
        "counter",
        ("feed", "topic", "partition"),
        "plan: planning events; commit: the job's and the commit's",
        "one per event of that kind (every kind: docs/reference/events.md), e.g. `event.data_loss`; topic and "
        "partition when the event names them",
    ),
    Metric("records_read", "counter", ("feed",), "commit", "records the Spark job read"),
    Metric(
        "dead_letters",
        "counter",
        ("feed", "reason"),
        "commit (committed runs)",
        "records the run quarantined, per reason code (`decode_error`, or a rule's label such as "
        "`expect_column_values_to_match_regex(value)`); a record with two reasons counts under each",
    ),
    Metric("records_published", "counter", ("feed",), "commit", "records it published"),
    Metric("records_quarantined", "counter", ("feed",), "commit", "records it quarantined"),
    Metric(
        "step.<step>",
        "timer (ms)",
        ("feed",),
        "commit",
        "the Spark job's step durations (`job.json`'s `timings_s`), e.g. `spark_session`, `read`, `validate`, "
        "`write`, `publish`",
    ),
    Metric(
        "lag_seconds_at_plan",
        "gauge",
        ("feed", "topic", "partition"),
        "commit (scheduled and committing runs)",
        "age, when the run was planned, of the oldest record it read (0 when nothing was left to read): the "
        "group's lag in time before the run, as the view charts it",
    ),
    Metric(
        "run.committed",
        "counter",
        ("feed",),
        "commit",
        "the run committed the group's offsets",
    ),
    Metric(
        "run.not_committed",
        "counter",
        ("feed",),
        "commit",
        "the run ended without a commit: a dry run, or a backfill or replay that does not commit",
    ),
    Metric(
        "commit_refused",
        "counter",
        ("feed",),
        "commit",
        "the group's offsets moved under the run, so its commit was refused (the task fails)",
    ),
    Metric(
        "lag_seconds",
        "gauge",
        ("feed", "topic", "partition"),
        "check (feeds with `alerts`)",
        "age of the oldest record the group has not read after the run (0 when none)",
    ),
    Metric(
        "last_commit_age_seconds",
        "gauge",
        ("feed",),
        "`tidemark_watchdog` (feeds with `alerts.stale_after`)",
        "seconds since the feed's last committed run",
    ),
)
