"""A feed run's lineage reaches the OpenLineage provider's file transport: topic (with offsets) in, output out.

The feed DAG runs as in :mod:`tests.e2e.test_metrics` (DagBag, ``dag.test``, a fresh
interpreter) with ``[openlineage] transport`` set to the provider's file transport; the
events it wrote are read back and their offset ranges checked against a
``read_committed`` scan of the topic. With OpenLineage's Spark listener turned on, the Spark
application's own events name the task's run as their parent.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.e2e.test_airflow_dags import SECRET, airflow_env  # noqa: F401 - the module's Airflow home fixture
from tests.e2e.test_metrics import _run_feed
from tests.faults.harness import scan
from tests.support.servers.spark import fetch_openlineage_jar
from tidemark.kafka.admin import Record
from tidemark.spark.session import OPENLINEAGE_ENV, OPENLINEAGE_JAR_ENV

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def lineage_env(events: Path) -> dict[str, str]:
    """Airflow settings sending OpenLineage events to ``events``, one JSON document a line."""
    transport = {"type": "file", "log_file_path": str(events), "append": True}
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport), "AIRFLOW__OPENLINEAGE__NAMESPACE": "tidemark-e2e"}


def read_events(events: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in events.read_text().splitlines() if line.strip()] if events.exists() else []


def test_an_iceberg_feed_run_reports_topic_offsets_and_output_to_openlineage(
    kafka: KafkaTestCluster,
    airflow_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    topic, feed = _feed(kafka, "iceberg")
    events_file = tmp_path / "lineage.jsonl"

    proc, _ = _run_feed(airflow_env, tmp_path, "ol_iceberg", feed, **lineage_env(events_file))

    assert "DAGRUN_STATE=success" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    _check_task_events(read_events(events_file), kafka, "ol_iceberg", topic,
                       {"namespace": "iceberg://tidemark", "name": "tidemark.ol_iceberg"})  # fmt: skip
    assert SECRET not in events_file.read_text()


def test_the_spark_jobs_own_events_hang_under_the_tasks_run(
    kafka: KafkaTestCluster,
    airflow_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """A Parquet feed run with OpenLineage's Spark listener on, as docs/guide/observe.md's Lineage section turns it on.

    The provider emits from a thread of the task process here ([openlineage] execute_in_thread).
    """
    topic, feed = _feed(kafka, "parquet")
    feed["driver_read_max_records"] = 0  # the executors' read: the Kafka settings are data source options
    tasks_file, spark_file = tmp_path / "lineage.jsonl", tmp_path / "spark-lineage.jsonl"
    secrets = {SECRET, "registry-pa55-not-for-lineage", "aws-s3cret-not-for-lineage"}
    env = {
        **lineage_env(tasks_file),
        # The provider's cheaper way to emit, as docs/guide/observe.md (Lineage) suggests (the Iceberg test above
        # keeps its default: a forked child per event): the same events either way.
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
        "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "True",
        "AIRFLOW__OPENLINEAGE__SPARK_INJECT_TRANSPORT_INFO": "True",  # HTTP transports only: a file one is left alone
        OPENLINEAGE_ENV: "on",
        OPENLINEAGE_JAR_ENV: str(fetch_openlineage_jar()),  # OPENLINEAGE_PACKAGE, without Ivy at every start
        # The listener's own transport: the OpenLineage client's variables, which spark-submit hands to the driver.
        "OPENLINEAGE__TRANSPORT__TYPE": "file", "OPENLINEAGE__TRANSPORT__LOCATION": str(spark_file),
        # More connection secrets the Spark task hands to spark-submit's environment.
        "AIRFLOW_CONN_TIDEMARK_SCHEMA_REGISTRY": json.dumps(
            {"conn_type": "http", "host": "http://127.0.0.1:9", "login": "ol",
             "password": "registry-pa55-not-for-lineage"}
        ),
        "AIRFLOW_CONN_TIDEMARK_STORAGE": json.dumps(
            {"conn_type": "aws", "login": "AKIAOLTEST", "password": "aws-s3cret-not-for-lineage"}
        ),
    }  # fmt: skip

    proc, _ = _run_feed(airflow_env, tmp_path, "ol_spark", feed, **env)

    assert "DAGRUN_STATE=success" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    task_start = _check_task_events(read_events(tasks_file), kafka, "ol_spark", topic,
                                    {"namespace": "file", "name": str((tmp_path / "out").resolve())})  # fmt: skip
    spark = read_events(spark_file)
    app = [e for e in spark if e["job"].get("facets", {}).get("jobType", {}).get("jobType") == "APPLICATION"]
    assert sorted(e["eventType"] for e in app) == ["COMPLETE", "START"], [(e["eventType"], e["job"]) for e in spark]
    dag_run = task_start["run"]["facets"]["parent"]  # the provider hangs the task under its DAG run
    for event in app:
        parent = event["run"]["facets"]["parent"]
        assert _run_and_job(parent) == _run_and_job(task_start)
        assert _run_and_job(parent["root"]) == _run_and_job(dag_run)
    # The job's queries hang under the application, all under the same DAG run.
    queries = [e for e in spark if e not in app]
    assert queries and {e["run"]["facets"]["parent"]["run"]["runId"] for e in queries} == {app[0]["run"]["runId"]}
    assert {e["run"]["facets"]["parent"]["root"]["run"]["runId"] for e in spark} == {dag_run["run"]["runId"]}
    for path in (tasks_file, spark_file):
        text = path.read_text()
        assert not [secret for secret in secrets if secret in text], path


def _run_and_job(ref: dict[str, Any]) -> tuple[str, str, str]:
    """Run id, job namespace and name of an event or of a parent facet's reference."""
    return ref["run"]["runId"], ref["job"]["namespace"], ref["job"]["name"]


def _feed(kafka: KafkaTestCluster, output_format: str) -> tuple[str, dict[str, Any]]:
    """A topic of 8 string records over 2 partitions, and a feed reading it into ``output_format``."""
    topic = kafka.new_topic(partitions=2, prefix="ol")
    kafka.produce(topic, [Record(value=f"v{i}".encode(), partition=i % 2) for i in range(8)])
    feed = {"topics": [topic], "group": f"g-ol-{uuid.uuid4().hex[:8]}", "deserialization": {"format": "string"},
            "output_format": output_format}  # fmt: skip
    return topic, feed


def _check_task_events(
    events: list[dict[str, Any]], kafka: KafkaTestCluster, name: str, topic: str, expected_output: dict[str, str]
) -> dict[str, Any]:
    """The Spark task's START and COMPLETE name the topic with the ranges of the 8 records and the output; its START."""
    spark = [e for e in events if e.get("job", {}).get("name") == f"tidemark_{name}.read_validate_publish"]
    assert sorted(e["eventType"] for e in spark) == ["COMPLETE", "START"], [
        (e.get("eventType"), e.get("job", {}).get("name")) for e in events
    ]
    host_port = kafka.connection.bootstrap_servers.split(",")[0].strip()
    for event in spark:
        (source,) = event["inputs"]
        assert (source["namespace"], source["name"]) == (f"kafka://{host_port}", topic)
        facet = source["inputFacets"]["tidemark_offsets"]
        ranges = {r["partition"]: (r["start"], r["end"]) for r in facet["partitions"]}
        assert ranges == {0: (0, 4), 1: (0, 4)}
        (target,) = event["outputs"]
        assert {k: target[k] for k in ("namespace", "name")} == expected_output
    # The ranges hold exactly what was produced, by an independent read_committed scan.
    rows = scan(kafka.connection, {(topic, p): r for p, r in ranges.items()})
    assert sorted(value for _, value in rows) == sorted(f"v{i}".encode() for i in range(8))
    return next(e for e in spark if e["eventType"] == "START")
