"""Two lows of issue 60 that stay deployment decisions (docs/deploy.md, "What the deployment must keep from teams"),
pinned so that the documented behaviour is what the code does.

- Read on the shared replay DAG: its trigger form's ``feed`` parameter lists every feed's name, whichever team owns
  it; a team's role that may trigger the DAG reads that list. The view lists only the user's own feeds.
- Asset events on a feed's lag asset: anyone with Airflow's Asset-create right can post one. It is a schedule of the
  feed's DAG (it starts a run), and the run records it as its cause, payload and all: Tidemark does not check who
  posted it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidemark.config.models import Feed, Trigger
from tidemark.orchestration import dags
from tidemark.orchestration.lag import CAUSE_FILE


def test_the_replay_dags_feed_parameter_names_every_teams_feed() -> None:
    feeds = {name: Feed(name=name, topics=(f"t-{name}",), group=f"g-{name}", team=team)
             for name, team in (("orders", "red"), ("payroll", "blue"))}  # fmt: skip
    param = dags._feed_param(feeds)
    assert param.schema["enum"] == ["orders", "payroll"]  # both teams' feeds, to whoever may read the DAG


def _context(run_type: str, events: list[Any]) -> dict[str, Any]:
    return {"dag_run": SimpleNamespace(run_type=run_type), "triggering_asset_events": {"lag": events}}


@pytest.mark.parametrize(
    ("extra", "cause"),
    [({"payload": {"lag_records": 10**9, "reason": "posted by hand"}}, "lag"), ({}, "schedule")],
    ids=["forged-lag-payload", "bare-event"],
)
def test_a_posted_lag_event_starts_a_run_recorded_with_its_payload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], cause: str
) -> None:
    feed = Feed(name="orders", topics=("t-orders",), group="g-orders", trigger=Trigger(lag_records=100))
    assert dags.lag_asset(feed) in list(dags.feed_schedule(feed))  # an event on the asset schedules a run
    event = SimpleNamespace(extra=extra)  # what Airflow hands the run for a POST /api/v2/assets/events
    monkeypatch.setattr(dags, "get_current_context", lambda: _context("asset_triggered", [event]))
    assert dags._record_cause(str(tmp_path)) == cause
    recorded = json.loads((tmp_path / CAUSE_FILE).read_text())
    assert recorded["cause"] == cause and recorded["run_type"] == "asset_triggered"
    assert recorded["lag_events"] == ([extra["payload"]] if extra else [])  # whoever posted it, as posted
