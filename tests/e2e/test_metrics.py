"""A feed DAG's metrics reach a StatsD listener through Airflow's own metrics client; its alerts fail its check.

The test opens a UDP socket as the StatsD server, points Airflow's ``[metrics]`` settings at
it (InfluxDB-style tags on), runs the feed DAG with ``dag.test`` in a fresh interpreter and
checks the datagrams against a ``read_committed`` scan of the topic: records read, the
ones that do not parse (quarantined) and the rest (published), lag per partition.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster
from tests.e2e.test_airflow_dags import ROOT, SECRET, airflow_env  # noqa: F401 - the module's Airflow home fixture
from tests.faults.harness import scan
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import load_feed
from tidemark.kafka.admin import Record
from tidemark.runs.report import list_runs
from tidemark.web.app import create_app

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Through the DagBag, as the DAG processor loads DAGs (it applies the cluster policy), with the metrics client
# initialized as the task runner does before a task runs (task_runner.main); dag.test runs tasks in-process.
RUN_DAG = """
import sys
from airflow.sdk.observability import stats
from airflow.sdk.observability.metrics import stats_utils
stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[2])
assert not bag.import_errors, bag.import_errors
run = bag.dags[sys.argv[1]].test()
print("DAGRUN_STATE=" + str(run.state))
"""


def _run_feed(
    base_env: dict[str, str], tmp_path: Path, name: str, feed: dict[str, Any], **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Write the feed, run its DAG with a UDP socket as Airflow's StatsD server; what it received."""
    feeds = tmp_path / "feeds"
    feeds.mkdir(exist_ok=True)
    (feeds / f"{name}.yaml").write_text(yaml.safe_dump({"schedule": "@daily", "output": str(tmp_path / "out"), **feed}))
    return run_dag(base_env, tmp_path, f"tidemark_{name}", **env)


def run_dag(
    base_env: dict[str, str], tmp_path: Path, dag_id: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run a DAG over the feeds in ``tmp_path/feeds`` with a UDP socket as Airflow's StatsD server."""
    feeds = tmp_path / "feeds"
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    env = {
        **base_env, "TIDEMARK_FEEDS_DIR": str(feeds), "TIDEMARK_STATE_DIR": str(tmp_path / "state"),
        "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True", **env,
    }  # fmt: skip
    try:
        proc = subprocess.run([sys.executable, "-c", RUN_DAG, dag_id, str(ROOT / "dags")], env=env,
                              capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
        return proc, _received(listener)
    finally:
        listener.close()


def _received(sock: socket.socket) -> list[str]:
    lines = []
    sock.settimeout(2.0)
    try:
        while True:
            lines.extend(sock.recv(65536).decode().splitlines())
    except TimeoutError:
        return lines


def _parse(lines: list[str]) -> dict[tuple[str, str], list[float]]:
    """Tidemark's ``name,tag=v,...:value|type`` → {(name, type): values} with the tags kept in the name."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line in (ln for ln in lines if ln.startswith("airflow.tidemark.")):
        name, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        out[(name, kind)].append(float(value))
    return out


def test_feed_run_sends_its_metrics_to_statsd(
    kafka: KafkaTestCluster,
    airflow_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    topic = kafka.new_topic(partitions=2, prefix="met")
    bad = {3, 4, 9}  # 4 → partition 0, 3 and 9 → partition 1
    stamped = int(time.time() * 1000) - 3_600_000  # an hour old: record i is stamped stamped + i
    kafka.produce(topic, [
        Record(value=b"{broken" if i in bad else json.dumps({"n": i}).encode(), partition=i % 2,
               timestamp_ms=stamped + i) for i in range(12)
    ])  # fmt: skip
    feed = {
        "topics": [topic], "group": f"g-met-{uuid.uuid4().hex[:8]}",
        "deserialization": {"format": "json", "fields": [{"name": "n", "type": "integer"}]},
        "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    }  # fmt: skip

    before_ms = time.time() * 1000
    proc, lines = _run_feed(airflow_env, tmp_path, "met", feed)
    after_ms = time.time() * 1000

    assert "DAGRUN_STATE=success" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = scan(kafka.connection, {(topic, 0): (0, 6), (topic, 1): (0, 6)})  # the independent truth
    unparsable = sum(1 for _, value in rows if value == b"{broken")
    assert (len(rows), unparsable) == (12, 3)
    got = _parse(lines)
    for p in (0, 1):
        tags = f"feed=met,topic={topic},partition={p}"
        assert got[(f"airflow.tidemark.lag_records,{tags}", "g")] == [6]
        assert got[(f"airflow.tidemark.planned_records,{tags}", "g")] == [6]
    assert got[("airflow.tidemark.records_read,feed=met", "c")] == [len(rows)]
    assert got[("airflow.tidemark.records_quarantined,feed=met", "c")] == [unparsable]
    assert got[("airflow.tidemark.records_published,feed=met", "c")] == [len(rows) - unparsable]
    assert got[("airflow.tidemark.run.committed,feed=met", "c")] == [1]
    job = json.loads(next(tmp_path.glob("state/runs/met/*/job.json")).read_text())
    for step, seconds in job["timings_s"].items():  # durations as the job measured them, in milliseconds
        assert got[(f"airflow.tidemark.step.{step},feed=met", "ms")] == [pytest.approx(seconds * 1000, abs=1)]
    lag_s = {}
    for p in (0, 1):  # the oldest unread record of partition p was stamped stamped + p, before the run was planned
        (lag_s[p],) = got[(f"airflow.tidemark.lag_seconds_at_plan,feed=met,topic={topic},partition={p}", "g")]
        assert (before_ms - stamped - p) / 1000 <= lag_s[p] <= (after_ms - stamped - p) / 1000
    assert not any(SECRET in line for line in lines)

    # The Tidemark view shows the run with the numbers the metrics carried.
    view = create_app(feeds=lambda: {"met": load_feed("met", tmp_path / "feeds")},
                      connection=lambda: kafka.connection, runs=lambda name: list_runs(name, root=tmp_path / "state"),
                      checkpoints=lambda: SqliteCheckpointStore(tmp_path / "view-cp.sqlite"))  # fmt: skip
    client = TestClient(view)
    (row,) = client.get("/api/feeds/met").json()["run_rows"]
    assert (row["records"], row["published"], row["quarantined"]) == (len(rows), len(rows) - unparsable, unparsable)
    assert row["lag_time_before_ms"] == pytest.approx(max(lag_s.values()) * 1000, abs=1)
    page = client.get("/feeds/met").text
    assert f'class="lag-time-point" data-ms="{row["lag_time_before_ms"]}"' in page
    assert f'data-col="lag_time_before" data-ms="{row["lag_time_before_ms"]}">1h' in page


# A deployment's cluster policy adding a failure callback to every task, as notifiers are attached.
LOCAL_SETTINGS = """
import os


def _notify(context):
    with open(os.environ["ALERT_FILE"], "a") as out:
        out.write(context["ti"].task_id + ": " + str(context["exception"]) + "\\n")


def task_policy(task):
    task.on_failure_callback = [_notify]  # set after construction: the list form the task runner iterates
"""


def _failure_policy(tmp_path: Path) -> Path:
    """A folder with the cluster policy above, to put on the DAG run's PYTHONPATH."""
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)
    return policy


def test_feed_lagging_more_than_its_max_lag_fails_its_check_and_the_failure_callback_fires(
    kafka: KafkaTestCluster,
    airflow_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    topic = kafka.new_topic(partitions=2, prefix="lag")
    group = f"g-lag-{uuid.uuid4().hex[:8]}"
    policy = _failure_policy(tmp_path)
    kafka.produce(topic, [Record(value=f"v{i}".encode(), partition=i % 2) for i in range(10)])
    feed = {
        "topics": [topic], "group": group, "deserialization": {"format": "string"},
        "max_records_per_run": 4,  # 10 produced: 6 stay unread, as old as the run is long (Spark alone: > 2 s)
        "alerts": {"max_lag": "2s"},
    }  # fmt: skip
    alert_file = tmp_path / "alerts.txt"

    proc, lines = _run_feed(airflow_env, tmp_path, "lag", feed, ALERT_FILE=str(alert_file), PYTHONPATH=str(policy))

    assert "DAGRUN_STATE=failed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    committed = kafka.adapter.committed(group, [(topic, 0), (topic, 1)])
    assert {tp: c.offset for tp, c in committed.items()} == {(topic, 0): 2, (topic, 1): 2}  # the run itself stands
    alerts = alert_file.read_text().splitlines()
    assert len(alerts) == 1 and alerts[0].startswith("check: "), alerts  # only the check failed
    for p in (0, 1):
        assert f"feed 'lag': {topic}[{p}] lags" in alerts[0] and "(3 records from offset 2 to 5)" in alerts[0]
    assert "more than alerts.max_lag 2s" in alerts[0]
    got = _parse(lines)
    for p in (0, 1):  # the lag in time the check saw, sent from the check task
        (seconds,) = got[(f"airflow.tidemark.lag_seconds,feed=lag,topic={topic},partition={p}", "g")]
        assert seconds > 2
        assert f"{topic}[{p}] lags {seconds / 60:.1f} min" in alerts[0]


def test_watchdog_names_a_feed_whose_last_commit_is_older_than_its_stale_after_and_the_callback_fires(
    kafka: KafkaTestCluster,
    airflow_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    topic = kafka.new_topic(partitions=1, prefix="wd")
    policy = _failure_policy(tmp_path)
    kafka.produce(topic, [Record(value=f"v{i}".encode()) for i in range(3)])
    group = f"g-wd-{uuid.uuid4().hex[:8]}"
    feed = {"topics": [topic], "group": group, "deserialization": {"format": "string"}}
    before = time.time()
    ran, _ = _run_feed(airflow_env, tmp_path, "wd", {**feed, "alerts": {"stale_after": "1h"}})
    after = time.time()
    assert "DAGRUN_STATE=success" in ran.stdout, ran.stdout[-4000:] + ran.stderr[-4000:]
    assert kafka.adapter.committed(group, [(topic, 0)])[(topic, 0)].offset == 3  # the run committed
    # Now the feed has not committed for longer than it may (as if its DAG were paused since that run).
    (tmp_path / "feeds" / "wd.yaml").write_text(
        yaml.safe_dump({"schedule": "@daily", "output": str(tmp_path / "out"), **feed, "alerts": {"stale_after": "1s"}})
    )
    alert_file = tmp_path / "alerts.txt"
    checked_from = time.time()

    proc, lines = run_dag(
        airflow_env, tmp_path, "tidemark_watchdog", ALERT_FILE=str(alert_file), PYTHONPATH=str(policy)
    )  # fmt: skip

    assert "DAGRUN_STATE=failed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    (alert,) = alert_file.read_text().splitlines()
    assert alert.startswith("stale_feeds: feed 'wd' last committed a run ") and "alerts.stale_after 1s" in alert
    assert "check that its DAG tidemark_wd is unpaused" in alert
    (age,) = _parse(lines)[("airflow.tidemark.last_commit_age_seconds,feed=wd", "g")]
    assert checked_from - after <= age <= time.time() - before  # the commit happened while the feed DAG ran
