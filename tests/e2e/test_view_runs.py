"""Runs through the running Airflow's REST API: the feed's Asset, and replays with and without reading.

The feed DAG's commit task emits the feed's Asset, which schedules a downstream DAG; a
replay with ``dry_run=false, commit=false`` publishes into the replay location and leaves
the group's offsets alone; a dry run (the default) reads nothing. A replay triggered
through the Tidemark view's own endpoint runs as the logged-in admin.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.e2e.conftest import DOWNSTREAM_DAG, FEED, SECRET, RunningAirflow

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _offsets(airflow: RunningAirflow) -> dict[int, int | None]:
    tps = [(airflow.topic, p) for p in range(3)]
    return {tp[1]: c.offset for tp, c in airflow.kafka.adapter.committed(airflow.group, tps).items()}


def test_feed_run_emits_its_asset_and_schedules_the_downstream_dag(airflow: RunningAirflow) -> None:
    run_id = airflow.trigger(f"tidemark_{FEED}")
    assert airflow.wait_run(f"tidemark_{FEED}", run_id) == "success", airflow.task_logs(f"tidemark_{FEED}", run_id)
    assert _offsets(airflow) == {0: 8, 1: 5, 2: 3}

    deadline = time.monotonic() + 180
    runs: list[dict[str, object]] = []
    while time.monotonic() < deadline and not runs:
        runs = airflow.request(f"/api/v2/dags/{DOWNSTREAM_DAG}/dagRuns")[1]["dag_runs"]
        time.sleep(0.5)
    assert runs, "the downstream DAG was not scheduled by the feed's asset event"
    assert runs[0]["run_type"] == "asset_triggered"
    assert airflow.wait_run(DOWNSTREAM_DAG, str(runs[0]["dag_run_id"])) == "success"

    # Read the event only once the run it created has started: Airflow 3.3 answers 500 while
    # a created run is queued with no start_date (apache/airflow#71360, fixed after 3.3).
    query = urlencode({"source_dag_id": f"tidemark_{FEED}", "source_run_id": run_id})
    status, doc = airflow.request(f"/api/v2/assets/events?{query}")
    assert status == 200, doc
    [event] = doc["asset_events"]
    assert event["extra"]["records"] == 16 and event["extra"]["plan_id"]
    assert [r["run_id"] for r in event["created_dagruns"]] == [runs[0]["dag_run_id"]]


def test_replay_reads_into_its_own_location_without_moving_the_group(airflow: RunningAirflow) -> None:
    before = _offsets(airflow)
    conf = {"feed": FEED, "start_from": "earliest", "dry_run": False, "commit": False}
    run_id = airflow.trigger("tidemark_replay", conf)
    assert airflow.wait_run("tidemark_replay", run_id) == "success", airflow.task_logs("tidemark_replay", run_id)
    manifests = list(airflow.output.with_name(f"{FEED}.replays").glob("plan_id=*/_manifest.json"))
    assert len(manifests) == 1
    manifest = json.loads(manifests[0].read_text())
    assert sum(r["records"] for r in manifest["ranges"]) == 16
    assert _offsets(airflow) == before

    dry = airflow.trigger("tidemark_replay", {"feed": FEED, "start_from": "earliest"})  # dry_run defaults to true
    assert airflow.wait_run("tidemark_replay", dry) == "success", airflow.task_logs("tidemark_replay", dry)
    run_dir = _tidemark_run(airflow, "tidemark_replay", dry)
    assert not (run_dir / "job.json").exists()  # nothing read
    assert json.loads((run_dir / "report.json").read_text())["commit"]["status"] == "skipped"
    assert _offsets(airflow) == before
    logs = airflow.task_logs("tidemark_replay", run_id) + airflow.task_logs("tidemark_replay", dry)
    assert "dry run" in logs and SECRET not in logs
    for path in airflow.state.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".log", ".html"):
            assert SECRET not in path.read_text(errors="replace"), path


def test_the_views_trigger_starts_the_replay_as_the_user(airflow: RunningAirflow) -> None:
    body = {"start_from": "committed", "partitions": [1], "topics": [airflow.topic]}
    status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}/replay", body=body, cookie=True)
    assert status == 200, doc
    assert doc["conf"]["dry_run"] is True
    run = airflow.request(f"/api/v2/dags/tidemark_replay/dagRuns/{doc['dag_run_id']}")[1]
    assert run["triggered_by"] == "rest_api" and run["conf"]["partitions"] == [1]
    assert run["triggering_user_name"] == "admin"  # the logged-in user, not the view's own identity
    assert airflow.wait_run("tidemark_replay", doc["dag_run_id"]) == "success"


def _tidemark_run(airflow: RunningAirflow, dag_id: str, dag_run_id: str) -> Path:
    """The Tidemark run dir an Airflow run made (its plan task names the Airflow run in airflow.json)."""
    for doc in airflow.state.glob(f"runs/{FEED}/*/airflow.json"):
        if json.loads(doc.read_text()) == {"dag_id": dag_id, "dag_run_id": dag_run_id}:
            return doc.parent
    raise AssertionError(f"no Tidemark run for {dag_id} {dag_run_id}")
