"""A feed run's lineage reaches the OpenLineage provider's file transport: topic (with offsets) in, output out.

The feed DAG runs as in :mod:`tests.e2e.test_metrics` (DagBag, ``dag.test``, a fresh
interpreter) with ``[openlineage] transport`` set to the provider's file transport; the
events it wrote are read back and their offset ranges checked against a
``read_committed`` scan of the topic.
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
from tidemark.kafka.adapter import Record

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def lineage_env(events: Path) -> dict[str, str]:
    """Airflow settings sending OpenLineage events to ``events``, one JSON document a line."""
    transport = {"type": "file", "log_file_path": str(events), "append": True}
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport), "AIRFLOW__OPENLINEAGE__NAMESPACE": "tidemark-e2e"}


def read_events(events: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in events.read_text().splitlines() if line.strip()] if events.exists() else []


@pytest.mark.parametrize("output_format", ["parquet", "iceberg"])
def test_feed_run_reports_topic_offsets_and_output_to_openlineage(
    kafka: KafkaTestCluster,
    airflow_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    output_format: str,
) -> None:
    topic = kafka.new_topic(partitions=2, prefix="ol")
    values = {f"v{i}".encode() for i in range(8)}
    kafka.produce(topic, [Record(value=f"v{i}".encode(), partition=i % 2) for i in range(8)])
    feed = {"topics": [topic], "group": f"g-ol-{uuid.uuid4().hex[:8]}", "deserialization": {"format": "string"},
            "output_format": output_format}  # fmt: skip
    events_file = tmp_path / "lineage.jsonl"

    name = f"ol_{output_format}"  # one DAG id per run: they share the module's Airflow database
    proc, _ = _run_feed(airflow_env, tmp_path, name, feed, **lineage_env(events_file))

    assert "DAGRUN_STATE=success" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    events = read_events(events_file)
    spark = [e for e in events if e.get("job", {}).get("name") == f"tidemark_{name}.read_validate_publish"]
    assert sorted(e["eventType"] for e in spark) == ["COMPLETE", "START"], [
        (e.get("eventType"), e.get("job", {}).get("name")) for e in events
    ]
    host_port = kafka.connection.bootstrap_servers.split(",")[0].strip()
    expected_output = (
        {"namespace": "iceberg://tidemark", "name": f"tidemark.{name}"}
        if output_format == "iceberg"
        else {"namespace": "file", "name": str((tmp_path / "out").resolve())}
    )
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
    assert {value for _, value in rows} == values and len(rows) == len(values)
    assert SECRET not in events_file.read_text()
