"""A feed's alert rules applied to its lag after a run and to the run's events.

Pure over values the caller gathers (the feed's status with lag in time, the run report's
events; for the watchdog, when each feed last committed a run): the Airflow ``check`` and
``stale_feeds`` tasks turn the failures into a failed task, so Airflow's failure callbacks
and notifiers fire, and log the warnings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tidemark.config.durations import parse_skew
from tidemark.config.models import Feed, dag_id
from tidemark.runs.report import list_runs
from tidemark.runs.run import Root
from tidemark.runs.status import FeedStatus

# The event kind each policy of ``alerts`` watches.
POLICY_EVENTS = {"on_data_loss": "data_loss", "on_expired_offsets": "group_offsets_expired"}


@dataclass(frozen=True)
class AlertCheck:
    failures: tuple[str, ...]
    warnings: tuple[str, ...]


def _minutes(ms: int) -> str:
    return f"{ms / 60_000:.1f} min"


def check_alerts(feed: Feed, status: FeedStatus, events: Iterable[Mapping[str, Any]]) -> AlertCheck:
    """What breaks the feed's ``alerts`` rules (failures) and what only warns."""
    alerts = feed.alerts
    if alerts is None:
        return AlertCheck((), ())
    failures: list[str] = []
    warnings: list[str] = []
    limit = alerts.max_lag_ms
    if limit is not None:
        for p in status.partitions:
            if p.lag_ms is not None and p.lag_ms > limit:
                failures.append(
                    f"feed '{feed.name}': {p.topic}[{p.partition}] lags {_minutes(p.lag_ms)} ({p.lag} records from "
                    f"offset {p.committed if p.committed is not None else p.checkpoint} to {p.end}), more than "
                    f"alerts.max_lag {alerts.max_lag}; the feed is falling behind: run it more often or let it "
                    "read more per run (max_records_per_run)"
                )
    seen = list(events)
    for policy, kind in POLICY_EVENTS.items():
        for e in (e for e in seen if e.get("kind") == kind):
            line = f"feed '{feed.name}': event {kind} ({e.get('message')})"
            (failures if getattr(alerts, policy) == "fail" else warnings).append(f"{line} [alerts.{policy}]")
    return AlertCheck(tuple(failures), tuple(warnings))


def last_commit_at(feed: str, *, root: Root | None = None, look_back: int = 50) -> datetime | None:
    """When the feed's newest committed run committed (from its run reports), ``None`` when none did."""
    for report in list_runs(feed, limit=look_back, root=root):  # newest first
        stamp = report.timestamps.get("committed_at")
        if stamp:
            return datetime.fromisoformat(stamp)
    return None


def stale_feeds(feeds: Iterable[Feed], last_commits: Mapping[str, datetime | None], now: datetime) -> tuple[str, ...]:
    """The feeds whose last committed run is older than their ``alerts.stale_after``, with what to do."""
    out = []
    for feed in feeds:
        after = feed.alerts.stale_after if feed.alerts is not None else None
        if after is None:
            continue
        todo = f"check that its DAG {dag_id(feed.name)} is unpaused, scheduled and its runs succeed"
        last = last_commits.get(feed.name)
        if last is None:
            out.append(f"feed '{feed.name}' has no committed run (alerts.stale_after {after}): {todo}")
            continue
        age_ms = int((now - last).total_seconds() * 1000)
        if age_ms > parse_skew(after, "alerts.stale_after").total_seconds() * 1000:
            out.append(
                f"feed '{feed.name}' last committed a run {_minutes(age_ms)} ago (at {last.isoformat()}), "
                f"more than alerts.stale_after {after}: {todo}"
            )
    return tuple(out)
