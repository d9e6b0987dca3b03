"""A cleared old DAG run, through the running Airflow's own REST API.

An operator clears an old failed run of a feed DAG in the Airflow UI after later runs
committed: Airflow re-runs its ``read_validate_publish`` and ``commit`` tasks with the
handle its ``plan`` task returned back then, a plan made from offsets the group has
since left. Whatever that re-run does, the feed's output must still hold every offset
at most once and equal an independent ``read_committed`` scan of what the group has
committed.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import yaml

from tests.conftest import keyed_records
from tests.e2e.conftest import CLEARED_FEED, RunningAirflow
from tests.faults.harness import oracle
from tests.integration.read_helpers import published_pairs

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DAG_ID = f"tidemark_{CLEARED_FEED}"
SPARK_TASK = "read_validate_publish"


def _states(airflow: RunningAirflow, run_id: str) -> dict[str, Any]:
    status, doc = airflow.request(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")
    assert status == 200, doc
    return {ti["task_id"]: ti["state"] for ti in doc["task_instances"]}


def _wait_for(what: str, check: Any, timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _fail_spark_task_before_it_starts(airflow: RunningAirflow, run_id: str) -> None:
    """Mark the run's Spark task failed while its ``plan`` task is still on its way.

    The run then has a saved plan and read nothing: a Spark task that failed before
    publishing, as a lost executor or a full disk would leave it.
    """
    states = _wait_for("the run's task instances", lambda: (s := _states(airflow, run_id)) and SPARK_TASK in s and s)
    assert states["plan"] != "success" and states[SPARK_TASK] is None, states
    status, doc = airflow.request(
        f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{SPARK_TASK}", body={"new_state": "failed"},
        method="PATCH",
    )  # fmt: skip
    assert status == 200, doc


def _output_against_kafka(airflow: RunningAirflow, group: str) -> None:
    """The feed's whole output is the read_committed scan of [0, committed): nothing twice, nothing missing."""
    tps = [(airflow.cleared_topic, p) for p in range(3)]
    committed = {tp: c.offset or 0 for tp, c in airflow.kafka.adapter.committed(group, tps).items()}
    scan = oracle(airflow.kafka.connection, {tp: (0, end) for tp, end in committed.items()})
    expected = Counter((partition, offset) for _topic, partition, offset, _value in scan.elements())
    files = [str(f) for f in airflow.output.with_name(CLEARED_FEED).glob("plan_id=*/**/*.parquet")]
    got = Counter(published_pairs(files))
    twice = sorted(pair for pair, n in got.items() if n > 1)
    assert not twice, f"published more than once: {twice[:5]} ({sum(got[p] - 1 for p in twice)} extra copies)"
    assert got == expected, f"missing {sorted(expected - got)[:5]}, not committed {sorted(got - expected)[:5]}"


def test_a_cleared_old_run_publishes_nothing_twice(airflow: RunningAirflow) -> None:
    feeds_dir = airflow.output.parent.parent / "feeds"
    group = yaml.safe_load((feeds_dir / f"{CLEARED_FEED}.yaml").read_text())["group"]
    for partition in range(3):
        airflow.kafka.produce(airflow.cleared_topic, keyed_records(3, partition=partition, prefix=f"a{partition}"))

    old = airflow.trigger(DAG_ID)  # plans [0, 3) on each partition; its Spark task fails
    _fail_spark_task_before_it_starts(airflow, old)
    assert airflow.wait_run(DAG_ID, old) == "failed"
    assert _states(airflow, old)["commit"] == "upstream_failed"

    for partition in range(3):
        airflow.kafka.produce(airflow.cleared_topic, keyed_records(3, partition=partition, prefix=f"b{partition}"))
    later = airflow.trigger(DAG_ID)  # plans [0, 6), publishes and commits
    assert airflow.wait_run(DAG_ID, later) == "success", airflow.task_logs(DAG_ID, later)
    _output_against_kafka(airflow, group)

    # The operator clears the old run's failed tasks: they run again with the old plan.
    status, doc = airflow.request(
        f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
        body={"dry_run": False, "dag_run_id": old, "task_ids": [SPARK_TASK, "commit"], "only_failed": False},
    )  # fmt: skip
    assert status == 200, doc
    ended = ("success", "failed", "up_for_retry")
    _wait_for("the old run's Spark task to run again",
              lambda: _states(airflow, old).get(SPARK_TASK) in ended)  # fmt: skip
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in (airflow.airflow.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={old}").rglob("*.log")
    )
    try:
        assert "Nothing was published" in logs, logs[-3000:]
        _output_against_kafka(airflow, group)
    finally:  # no retry of the old run left behind
        airflow.request(f"/api/v2/dags/{DAG_ID}/dagRuns/{old}", body={"state": "failed"}, method="PATCH")
