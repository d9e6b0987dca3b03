"""A feed's alert rules applied to its lag after a run and to the run's events.

Pure over values the caller gathers (the feed's status with lag in time, the run report's
events): the Airflow ``check`` task turns the failures into a failed task, so Airflow's
failure callbacks and notifiers fire, and logs the warnings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidemark.config.models import Feed
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
